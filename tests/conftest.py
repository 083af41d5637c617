import os

# Same hygiene as every process we start: one thread, no network calls from Flower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
os.environ["FLWR_DISABLE_UPDATE_CHECK"] = "1"
os.environ["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def flower_task_identity():
    """Building a Message outside a Flower run (in-process server halves) needs a task identity (Flower's
    private API); processes the tests start have their own."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
