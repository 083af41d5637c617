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

import sys  # noqa: E402

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
pytest_plugins = ["tests.support.fixtures"]  # fixtures several tiers share
TIERS = {
    "unit": ("unit",),
    "component": ("component",),
    "integration": ("integration",),
    "system": ("system", "integration"),
}  # directory -> the markers of its tests


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in TIERS.get(tier(item), ()):
            item.add_marker(marker)
        item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: SCHEDULE.index(tier(item)) if tier(item) in SCHEDULE else len(SCHEDULE))


def pytest_collection_finish(session: pytest.Session) -> None:
    """One compute thread where the collected tests use torch; a session whose tests do not (a subprocess pytest of
    tests/integration/test_suite_groups.py) is spared torch's import, ~4 CPU-s per process."""
    if (torch := sys.modules.get("torch")) is not None:
        torch.set_num_threads(1)


# `make test` runs the suite on every core (pytest-xdist, `--dist loadgroup`): a group runs on one worker, in order.
# A module is a group, so its module-scoped fixtures (an image build, a tracking server) are set up once; the system
# tests are one group, so the Docker engine, the namespaces and the fresh install never run beside each other. Under
# xdist the longest tiers are handed out first, so the system group does not start last and leave one core idle. The
# hook runs before xdist's, which reads the groups (tests/integration/test_suite_groups.py checks that they hold).
SCHEDULE = ("system", "integration", "component", "unit")


def tier(item: pytest.Item) -> str:
    return item.path.relative_to(TESTS).parts[0]


def xdist_group(item: pytest.Item) -> str:
    return "system" if tier(item) == "system" else str(item.path.relative_to(TESTS))


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
