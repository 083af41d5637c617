"""tasks/simulation_polls.py against Flower's own `InMemoryLinkState.get_message_ins`, on link states set up as
Flower's simulation sets up its own (nodes registered by the engine, the run pre-registered, instructions pushed
through its InMemoryGrid): the same asks return the same instructions, mark them delivered, and drop an expired one."""

import time

import pytest
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

from fedbayes.tasks import simulation_polls

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
    messages = [
        Message(RecordDict({"which": ConfigRecord({"index": index})}), node_ids[node], "train", ttl=ttl or None)
        for index, (node, ttl) in enumerate(instructions)
    ]
    assert len(list(grid.push_messages(messages))) == len(messages)
    return grid, node_ids


def sweeps(state: InMemoryLinkState, node_ids: list[int], limit: int | None) -> list[list[tuple[int, bool]]]:
    """What the engine's poll gets: every node asked in turn, three times; per ask (instruction index, delivered)."""
    asks = []
    for _ in range(3):
        for node_id in node_ids:
            got = state.get_message_ins(node_id=node_id, limit=limit)
            asks.append([(int(m.content["which"]["index"]), m.metadata.delivered_at != "") for m in got])
    return asks


@pytest.mark.parametrize("limit", [1, None])
def test_every_node_gets_what_flowers_link_state_gives_it(limit):
    """Five nodes, node 1 with two instructions, node 3 with none, node 4's expiring before anyone asks."""
    instructions = [(0, 0.0), (1, 0.0), (1, 0.0), (2, 0.0), (4, 0.05)]
    results = {}
    for patched in (False, True):
        grid, node_ids = simulated_link(5, instructions)
        if patched:
            assert simulation_polls.check_only_own_messages(grid)
            assert "get_message_ins" in vars(grid.state), "the engine's state object is patched, not Flower's class"
        time.sleep(0.1)  # node 4's instruction expires
        results[patched] = sweeps(grid.state, node_ids, limit)
        assert grid.state.num_message_ins() == 4, "the expired instruction is dropped, the delivered ones are kept"
    assert results[True] == results[False]
    if limit:
        assert results[True][:5] == [[(0, True)], [(1, True)], [(3, True)], [], []]
        assert results[True][6] == [(2, True)], "node 1's second instruction comes at its next ask"
    assert not any(index == 4 for ask in results[True] for index, _ in ask)


def test_nothing_is_patched_for_another_grid_or_another_flower(monkeypatch):
    assert not simulation_polls.check_only_own_messages(object())
    grid, _ = simulated_link(2, [])
    monkeypatch.setattr("flwr.__version__", "1.40.0")
    assert not simulation_polls.check_only_own_messages(grid)
    assert "get_message_ins" not in vars(grid.state)
