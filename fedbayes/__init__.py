"""fedbayes: networked Bayesian federated learning on Flower.

Installed, every module is under this package: fedbayes.server, fedbayes.client, fedbayes.strategies,
fedbayes.protos, fedbayes.bayes, fedbayes.tasks, fedbayes.deploy (pyproject.toml maps them from the
repository's top-level folders). In a source checkout those folders sit next to this one; the package
path below finds them there, so the checkout (a worktree, a test run, PYTHONPATH=<checkout>) imports its
own files rather than another install's.
"""

from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "strategies" / "base.py").is_file():
    __path__.append(str(_checkout))
