"""The environment of a benchmark's in-process federation: what `fedbayes.deploy.processes.process_env` gives every
Flower process (one compute thread, no telemetry, no update check, no runtime installs), set before torch and Flower
are imported. A value the caller has set is kept, so `OMP_NUM_THREADS=2 python benchmarks/...` still measures two.

    sys.path.insert(0, str(REPO))
    import benchmarks.environment  # noqa: F401  (before torch and flwr)
    # isort: split
"""

import os

DEFAULTS = {
    "OMP_NUM_THREADS": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}

for name, value in DEFAULTS.items():
    os.environ.setdefault(name, value)
