"""A link state set up as Flower 1.39's simulation engine sets up its own: nodes registered by the engine, the run
pre-registered with its primary task, instructions pushed through its InMemoryGrid (tests/component/
test_simulation_polls.py, benchmarks/simulation_polls.py)."""

from __future__ import annotations

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.proto.task_pb2 import Task
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import InMemoryLinkState, LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

RUN_ID, TASK_ID = 7, 8


def simulated_link(nodes: int, instructions: list[tuple[int, float]]) -> tuple[InMemoryGrid, list[int]]:
    """A simulation's grid and link state with `nodes` virtual nodes and, per (node index, ttl), an instruction for
    that node whose content names its place in `instructions` (ttl 0: Flower's default)."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = RUN_ID, TASK_ID, SUPERLINK_NODE_ID
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    node_ids = list(_register_nodes(nodes, factory))
    run = Run.create_empty(run_id=RUN_ID)
    run.primary_task_id, run.federation_id = TASK_ID, NOOP_FEDERATION_ID
    state = factory.state()
    assert isinstance(state, InMemoryLinkState)
    state.run_ids[RUN_ID] = RunRecord(run=run)
    state.task_store[TASK_ID] = Task(task_id=TASK_ID, run_id=RUN_ID)
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    push(grid, node_ids, instructions)
    return grid, node_ids


def push(grid: InMemoryGrid, node_ids: list[int], instructions: list[tuple[int, float]], first: int = 0) -> list[str]:
    """Push, per (node index, ttl), an instruction whose content names its number, counting from `first`."""
    messages = [
        Message(RecordDict({"which": ConfigRecord({"index": first + n})}), node_ids[node], "train", ttl=ttl or None)
        for n, (node, ttl) in enumerate(instructions)
    ]
    ids = list(grid.push_messages(messages))
    assert len(ids) == len(messages)
    return ids
