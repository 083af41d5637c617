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


def simulated_link(nodes: int, instructions: list[tuple[int, float]]) -> tuple[InMemoryLinkState, list[int]]:
    """A simulation's link state with `nodes` virtual nodes and, per (node index, ttl), an instruction for that node
    whose content names its place in `instructions` (ttl 0: Flower's default)."""
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
    return state, node_ids


def sweeps(state: InMemoryLinkState, node_ids: list[int], limit: int | None) -> list[list[tuple[int, bool]]]:
    """What the engine's poll gets: every node asked in turn, three times; per ask (instruction index, delivered)."""
    asks = []
    for _ in range(3):
        for node_id in node_ids:
            got = state.get_message_ins(node_id=node_id, limit=limit)
            asks.append([(int(m.content["which"]["index"]), m.metadata.delivered_at != "") for m in got])
    return asks


@pytest.fixture
def flower_and_ours(monkeypatch):
    """Flower's method, and the patched one; the class gets Flower's back after the test."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = RUN_ID, TASK_ID, SUPERLINK_NODE_ID
    flower = InMemoryLinkState.get_message_ins
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", flower)
    assert simulation_polls.check_only_own_messages()
    ours = InMemoryLinkState.get_message_ins
    assert ours is not flower
    return flower, ours


@pytest.mark.parametrize("limit", [1, None])
def test_every_node_gets_what_flowers_link_state_gives_it(flower_and_ours, monkeypatch, limit):
    """Five nodes, node 1 with two instructions, node 3 with none, node 4's expiring before anyone asks."""
    flower, ours = flower_and_ours
    instructions = [(0, 0.0), (1, 0.0), (1, 0.0), (2, 0.0), (4, 0.05)]
    results = {}
    for name, method in (("flower", flower), ("ours", ours)):
        monkeypatch.setattr(InMemoryLinkState, "get_message_ins", method)
        state, node_ids = simulated_link(5, instructions)
        time.sleep(0.1)  # node 4's instruction expires
        results[name] = sweeps(state, node_ids, limit)
        assert state.num_message_ins() == 4, "the expired instruction is dropped, the delivered ones are kept"
    assert results["ours"] == results["flower"]
    expected_first_sweep = [[(0, True)], [(1, True)], [(3, True)], [], []] if limit else None
    if expected_first_sweep:
        assert results["ours"][:5] == expected_first_sweep
        assert results["ours"][6] == [(2, True)], "node 1's second instruction comes at its next ask"
    assert not any(index == 4 for ask in results["ours"] for index, _ in ask)


def test_nothing_is_patched_without_a_simulation_or_on_another_flower(monkeypatch):
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", InMemoryLinkState.get_message_ins)
    flower = InMemoryLinkState.get_message_ins
    monkeypatch.delitem(simulation_polls.sys.modules, simulation_polls.LINKSTATE_MODULE)
    assert not simulation_polls.check_only_own_messages()
    monkeypatch.undo()
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", flower)
    monkeypatch.setattr("flwr.__version__", "1.40.0")
    assert not simulation_polls.check_only_own_messages()
    assert InMemoryLinkState.get_message_ins is flower
