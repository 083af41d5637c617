"""The server lock, <server-state-dir>/<federation>/server.lock: who may change a federation's checkpoints."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = "server.lock"


@contextmanager
def server_lock(directory: Path, wait: bool = True) -> Iterator[bool]:
    """Hold `directory`/server.lock: a running server holds it for its whole run, `fedbayes forget` while it works on
    a stopped federation's checkpoint. With `wait=False`, yields whether it was free (and is now held)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / LOCK_FILE).open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            held = True
        except BlockingIOError:
            held = False
        try:
            yield held
        finally:
            if held:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
