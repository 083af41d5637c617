"""`fedbayes superlink`'s in-memory link state answers a node's pull from an index of its own instructions
(deploy/superlink.py `index_instructions_by_node`): the same pulls get what Flower's own link state gives them, on link
states made after the patch, through a round's pushes, pulls and deletions."""

import flwr
import pytest
from flwr.server.superlink.linkstate import InMemoryLinkState

from fedbayes.flowerseam.superlink import index_instructions_by_node
from tests.component.test_simulation_polls import sweeps
from tests.support.linkstate import push, simulated_link


@pytest.fixture(autouse=True)
def restore_link_state(monkeypatch):
    """What the patch changes, put back after each test."""
    monkeypatch.setattr(InMemoryLinkState, "__init__", InMemoryLinkState.__init__)


def pulls_of_two_rounds(patched: bool) -> tuple[list[list[tuple[int, bool]]], int]:
    """Round 1's instructions pulled; round 2's pushed while one of round 1's is still stored, one of those taken (its
    reply pulled: Flower deletes the instruction) before a late one is pushed; every node asking throughout. The asks
    and how many instructions the store holds at the end."""
    if patched:
        index_instructions_by_node()
    grid, node_ids = simulated_link(5, [(0, 0.0), (1, 0.0), (1, 0.0), (4, 0.0)])
    assert ("get_message_ins" in vars(grid.state)) == patched, "a new link state is indexed, Flower's class is not"
    asks = sweeps(grid.state, node_ids, limit=1)
    second = push(grid, node_ids, [(2, 0.0), (0, 0.0), (3, 0.0)], first=4)
    asks += sweeps(grid.state, node_ids, limit=1)
    grid.state.delete_messages({second[1]})
    push(grid, node_ids, [(0, 0.0)], first=7)
    asks += sweeps(grid.state, node_ids, limit=1)
    return asks, grid.state.num_message_ins()


def test_every_pull_gets_what_flowers_link_state_gives_it():
    flowers, indexed = pulls_of_two_rounds(patched=False), pulls_of_two_rounds(patched=True)
    assert indexed == flowers
    asks, stored = indexed
    assert sorted(index for ask in asks for index, _ in ask) == list(range(8)), "each instruction reaches its node once"
    assert all(delivered for ask in asks for _, delivered in ask)
    assert stored == 7


def test_another_flower_is_refused_not_patched(monkeypatch):
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    with pytest.raises(SystemExit, match="patches Flower 1.39.0's in-memory link state, but Flower 1.40.0 is"):
        index_instructions_by_node()
    grid, _ = simulated_link(2, [])
    assert "get_message_ins" not in vars(grid.state)
