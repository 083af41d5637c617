import os

# Same hygiene as every process we start: one thread, no network calls from Flower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)
