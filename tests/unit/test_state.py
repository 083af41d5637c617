"""The durable client state store: round trips, restarts, and crashes in the middle of a write."""

import pytest
import torch

from fedbayes.client.state import MAX_UNCONFIRMED, ClientState, ClientStateStore, StateCorruptError, StateLostError
from tests.support import newest_state


def test_round_trip_and_keying(tmp_path):
    store = ClientStateStore(tmp_path, "fed-a", "client-1")
    assert newest_state(store) is None and store.load(accepted_round=0, for_round=1) is None
    store.save(
        ClientState({"dual_mean": torch.arange(6.0).view(2, 3)}, {"note": "x"}), server_round=4, accepted_round=0
    )
    loaded = ClientStateStore(tmp_path, "fed-a", "client-1").load(accepted_round=4, for_round=5)
    assert torch.equal(loaded.tensors["dual_mean"], torch.arange(6.0).view(2, 3))
    assert loaded.metadata == {"note": "x"} and loaded.round == 4
    # Another federation or client never sees this state.
    assert newest_state(ClientStateStore(tmp_path, "fed-b", "client-1")) is None
    assert newest_state(ClientStateStore(tmp_path, "fed-a", "client-2")) is None


def save_round(store, server_round, accepted_round):
    store.save(ClientState({"x": torch.tensor([float(server_round)])}), server_round, accepted_round)


def test_a_round_starts_from_the_state_of_the_last_accepted_round(tmp_path):
    """The server decides: rounds it never used (lost, late or rejected replies; rounds a resumed server runs
    again) are rolled back past, so the client starts from the state after the round it accepted."""
    store = ClientStateStore(tmp_path, "fed", "client-0")
    save_round(store, 1, accepted_round=0)
    save_round(store, 3, accepted_round=1)  # round 3's reply is lost: the server still knows round 1
    assert store.load(accepted_round=1, for_round=4).tensors["x"].item() == 1.0
    save_round(store, 4, accepted_round=1)
    assert store.saved_rounds() == [1, 3, 4]  # round 1 is kept while nothing newer is accepted
    save_round(store, 5, accepted_round=4)  # round 4 accepted: what came before it goes
    assert store.saved_rounds() == [4, 5]
    # A server resumed from its round-4 checkpoint runs round 5 again: it starts from round 4 and rewrites 5.
    assert store.load(accepted_round=4, for_round=5).round == 4
    store.save(ClientState({"x": torch.tensor([50.0])}), 5, accepted_round=4)
    assert store.load(accepted_round=5, for_round=6).tensors["x"].item() == 50.0
    # Rounds from a future the server abandoned are dropped when an earlier round is written.
    save_round(store, 9, accepted_round=5)
    save_round(store, 6, accepted_round=5)
    assert store.saved_rounds() == [5, 6]


def test_unconfirmed_rounds_are_bounded_and_a_lost_state_is_named(tmp_path):
    store = ClientStateStore(tmp_path, "fed", "client-0")
    for server_round in range(1, 10):  # the server never accepts a reply from this client
        save_round(store, server_round, accepted_round=0)
    assert store.saved_rounds() == list(range(10 - MAX_UNCONFIRMED, 10))
    with pytest.raises(StateLostError, match="accepted this client's round 2"):
        store.load(accepted_round=2, for_round=10)


@pytest.mark.parametrize("bad", ["", "..", "a/b", "client 1"])
def test_unsafe_names_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="safe directory name"):
        ClientStateStore(tmp_path, "fed", bad)


def test_corrupt_file_is_an_error_not_a_fresh_start(tmp_path):
    store = ClientStateStore(tmp_path, "fed", "client-0")
    store.save(ClientState({"x": torch.ones(2)}), 1, accepted_round=0)
    store.path(1).write_bytes(b"\x00" * 5)
    with pytest.raises(StateCorruptError, match="unreadable"):
        store.load(accepted_round=1, for_round=2)


def test_the_round_the_newest_checkpoint_names_is_kept_with_the_accepted_one(tmp_path):
    """The server accepted round 5 but its checkpoint on disk still names round 3 (written in the background):
    the client keeps round 3's state as well, since a server killed now resumes naming round 3."""
    store = ClientStateStore(tmp_path, "fed", "client-0")
    for server_round, accepted, checkpointed in ((3, 1, 1), (4, 3, 1), (5, 3, 3), (6, 5, 3)):
        store.save(ClientState({"x": torch.tensor([float(server_round)])}), server_round, accepted, checkpointed)
    assert store.saved_rounds() == [3, 5, 6]
    assert store.load(3, for_round=6).tensors["x"].item() == 3.0
    store.save(ClientState({"x": torch.tensor([7.0])}), 7, accepted_round=6, checkpointed_round=5)
    assert store.saved_rounds() == [5, 6, 7]
