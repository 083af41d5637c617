"""fedbayes.flowerseam.simulation_polls against Flower's own `InMemoryLinkState.get_message_ins`, on link states set
up as Flower's simulation sets up its own (tests/support/linkstate.py): the same asks return the same instructions,
mark them delivered, and drop an expired one."""

import time

import pytest
from flwr.server.superlink.linkstate import InMemoryLinkState

from fedbayes.flowerseam import simulation_polls
from tests.support.linkstate import push, simulated_link


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


def test_instructions_pushed_and_taken_between_sweeps_reach_the_same_nodes():
    """The index is rebuilt when the store changes: a new round's instructions pushed after a sweep, and one taken
    (its reply pulled: Flower deletes the instruction) before another is pushed, reach the nodes as Flower's would."""
    results = {}
    for patched in (False, True):
        grid, node_ids = simulated_link(4, [(0, 0.0), (1, 0.0)])
        if patched:
            assert simulation_polls.check_only_own_messages(grid)
        asks = sweeps(grid.state, node_ids, limit=1)
        first_ids = push(grid, node_ids, [(2, 0.0), (0, 0.0), (3, 0.0)], first=2)
        asks += sweeps(grid.state, node_ids, limit=1)
        grid.state.delete_messages({first_ids[0]})  # node 2's instruction, delivered, taken with its reply
        push(grid, node_ids, [(2, 0.0)], first=5)
        asks += sweeps(grid.state, node_ids, limit=1)
        results[patched] = asks
        assert grid.state.num_message_ins() == 5
    assert results[True] == results[False]
    delivered = sorted(index for ask in results[True] for index, _ in ask)
    assert delivered == [0, 1, 2, 3, 4, 5], "every instruction reaches its node once"


def test_nothing_is_patched_for_another_grid_or_another_flower(monkeypatch):
    assert not simulation_polls.check_only_own_messages(object())
    grid, _ = simulated_link(2, [])
    monkeypatch.setattr("flwr.__version__", "1.40.0")
    assert not simulation_polls.check_only_own_messages(grid)
    assert "get_message_ins" not in vars(grid.state)
