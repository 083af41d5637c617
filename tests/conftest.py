"""The tiers are directories, and each test's markers say which it is in:

  unit          one module's behaviour, in this process
  component     several parts together in this process: strategies' halves, the round loop on a fake grid
  integration   real processes: a SuperLink and SuperNodes on loopback, the `fedbayes` command, a tracking server
  system        several machines (network namespaces), containers, a fresh install

`make test-fast` runs the first two; `-m "not integration"` leaves out the last two (system tests are marked
integration too: they start processes)."""

import os
from pathlib import Path

# Same hygiene as every process we start: one thread, no network calls from Flower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TESTS = Path(__file__).resolve().parent
TIERS = {
    "unit": ("unit",),
    "component": ("component",),
    "integration": ("integration",),
    "system": ("system", "integration"),
}  # directory -> the markers of its tests


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in TIERS.get(item.path.relative_to(TESTS).parts[0], ()):
            item.add_marker(marker)


@pytest.fixture(autouse=True)
def flower_task_identity():
    """Building a Message outside a Flower run (in-process server halves) needs a task identity (Flower's
    private API); processes the tests start have their own."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1


@pytest.fixture
def plugin_path(monkeypatch):
    """tests/plugins importable here and in every process a federation starts (out-of-tree strategies, models)."""
    from tests.support import PLUGINS
    from tests.support.processes import with_pythonpath

    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", with_pythonpath(PLUGINS))
