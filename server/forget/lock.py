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
    a stopped federation's checkpoint. With `wait=False`, yields whether it was free (and is now held).

    Args:
        directory: the federation's folder, <server-state-dir>/<federation>; made if missing.
        wait: wait until the lock is free (False: take it only if it is free now).

    Yields:
        Whether the lock is held (always True with `wait`); a held lock is released on leaving the block.

    Raises:
        OSError: the folder or the lock file cannot be made or opened.
    """
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
