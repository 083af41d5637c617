"""The durable client state store: round trips, restarts, and crashes in the middle of a write."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from client.state import ClientState, ClientStateStore, StaleStateError, StateCorruptError

ROOT = Path(__file__).resolve().parents[1]


def test_round_trip_and_keying(tmp_path):
    store = ClientStateStore(tmp_path, "fed-a", "client-1")
    assert store.load() is None
    store.save(ClientState({"dual_mean": torch.arange(6.0).view(2, 3)}, {"note": "x"}), server_round=4)
    loaded = ClientStateStore(tmp_path, "fed-a", "client-1").load()
    assert torch.equal(loaded.tensors["dual_mean"], torch.arange(6.0).view(2, 3))
    assert loaded.metadata == {"note": "x"} and loaded.round == 4
    # Another federation or client never sees this state.
    assert ClientStateStore(tmp_path, "fed-b", "client-1").load() is None
    assert ClientStateStore(tmp_path, "fed-a", "client-2").load() is None


def test_a_rerun_round_starts_from_the_state_before_it(tmp_path):
    """A server resumed from its checkpoint may run round r again: the client must start from the state
    after its previous round, not the one round r already wrote. Two rounds are kept; older ones go."""
    store = ClientStateStore(tmp_path, "fed", "client-0")
    for server_round in (1, 3, 4):  # the client skipped round 2
        store.save(ClientState({"x": torch.tensor([float(server_round)])}), server_round)
    assert store.saved_rounds() == [3, 4]
    assert store.load(before_round=5).round == 4
    assert store.load(before_round=4).round == 3  # round 4 again
    assert store.load().round == 4
    # Round 4 re-run writes round 4 anew; a later round from the abandoned future would be dropped too.
    store.save(ClientState({"x": torch.tensor([40.0])}), 4)
    assert store.load(before_round=5).tensors["x"].item() == 40.0


def test_state_from_a_later_round_belongs_to_another_run(tmp_path):
    store = ClientStateStore(tmp_path, "fed", "client-0")
    store.save(ClientState({"x": torch.ones(1)}), 7)
    with pytest.raises(StaleStateError, match="round 7, but the server is at round 3"):
        store.load(before_round=3)


@pytest.mark.parametrize("bad", ["", "..", "a/b", "client 1"])
def test_unsafe_names_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="safe directory name"):
        ClientStateStore(tmp_path, "fed", bad)


def test_corrupt_file_is_an_error_not_a_fresh_start(tmp_path):
    store = ClientStateStore(tmp_path, "fed", "client-0")
    store.save(ClientState({"x": torch.ones(2)}), 1)
    store.path(1).write_bytes(b"\x00" * 5)
    with pytest.raises(StateCorruptError, match="unreadable"):
        store.load()


WRITER = """
import sys, torch
from client.state import ClientState, ClientStateStore
store = ClientStateStore(sys.argv[1], "fed", "client-0")
version = 0
print("ready", flush=True)
while True:  # every version is a 16 MB tensor filled with its version number
    version += 1
    store.save(ClientState({"dual": torch.full((4_000_000,), float(version))}), version)
"""


def test_state_survives_a_crash_mid_write(tmp_path):
    """SIGKILL a process that keeps rewriting its state; a restarted process reads a complete version."""
    for attempt in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        )
        assert writer.stdout.readline().strip() == b"ready"
        time.sleep(1.0 + 0.3 * attempt)  # land somewhere inside a write
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        state = ClientStateStore(tmp_path, "fed", "client-0").load()
        assert state is not None
        version = float(state.round)
        assert torch.all(state.tensors["dual"] == version), "a torn write became visible"
