"""The durable client state store: round trips, restarts, and crashes in the middle of a write."""

import os
import signal
import subprocess
import sys
import time

import torch

from fedbayes.client.state import ClientStateStore
from tests.support import ROOT, newest_state

WRITER = """
import sys, torch
from fedbayes.client.state import ClientState, ClientStateStore
store = ClientStateStore(sys.argv[1], "fed", "client-0")
version = 0
print("ready", flush=True)
while True:  # every version is a 16 MB tensor filled with its version number
    version += 1
    store.save(ClientState({"dual": torch.full((4_000_000,), float(version))}), version, version - 1)
"""


def test_state_survives_a_crash_mid_write(tmp_path):
    """SIGKILL a process that keeps rewriting its state; a restarted process reads a complete version."""
    for attempt in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
        )
        assert writer.stdout.readline().strip() == b"ready"
        time.sleep(1.0 + 0.3 * attempt)  # land somewhere inside a write
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        state = newest_state(ClientStateStore(tmp_path, "fed", "client-0"))
        assert state is not None
        version = float(state.round)
        assert torch.all(state.tensors["dual"] == version), "a torn write became visible"
