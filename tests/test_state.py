"""The durable client state store: round trips, restarts, and crashes in the middle of a write."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from client.state import ClientState, ClientStateStore, StateCorruptError

ROOT = Path(__file__).resolve().parents[1]


def test_round_trip_and_keying(tmp_path):
    store = ClientStateStore(tmp_path, "fed-a", "client-1")
    assert store.load() is None
    store.save(ClientState({"dual_mean": torch.arange(6.0).view(2, 3)}, {"round": "4"}))
    loaded = ClientStateStore(tmp_path, "fed-a", "client-1").load()
    assert torch.equal(loaded.tensors["dual_mean"], torch.arange(6.0).view(2, 3))
    assert loaded.metadata == {"round": "4"}
    # Another federation or client never sees this state.
    assert ClientStateStore(tmp_path, "fed-b", "client-1").load() is None
    assert ClientStateStore(tmp_path, "fed-a", "client-2").load() is None


@pytest.mark.parametrize("bad", ["", "..", "a/b", "client 1"])
def test_unsafe_names_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="safe directory name"):
        ClientStateStore(tmp_path, "fed", bad)


def test_corrupt_file_is_an_error_not_a_fresh_start(tmp_path):
    store = ClientStateStore(tmp_path, "fed", "client-0")
    store.save(ClientState({"x": torch.ones(2)}))
    store.path.write_bytes(b"\x00" * 5)
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
    store.save(ClientState({"dual": torch.full((4_000_000,), float(version))}, {"version": str(version)}))
"""


def test_state_survives_a_crash_mid_write(tmp_path):
    """SIGKILL a process that keeps rewriting its state; a restarted process reads a complete version."""
    for attempt in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert writer.stdout.readline().strip() == b"ready"
        time.sleep(1.0 + 0.3 * attempt)  # land somewhere inside a write
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        state = ClientStateStore(tmp_path, "fed", "client-0").load()
        assert state is not None
        version = float(state.metadata["version"])
        assert torch.all(state.tensors["dual"] == version), "a torn write became visible"
