"""Compute slots: at most N ClientApps of one machine compute at once.

More ClientApps computing at once than the machine has cores costs CPU, not just waiting: ten one-thread IVON
trainings at once on two cores took 35-45% more CPU each than two at a time (benchmarks/oversubscription.py). So a local
federation (`fedbayes local --parallel-tasks`, default: the machine's cores) gives its processes
FEDBAYES_COMPUTE_SLOTS="N:DIR", and each ClientApp computes inside `compute_slot()`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from logging import WARNING
from pathlib import Path

from flwr.common import log

SLOTS_ENV = "FEDBAYES_COMPUTE_SLOTS"
SLOT_POLL_SECONDS = 0.02
SLOT_WARN_SECONDS = 60.0


def compute_slots(spec: str) -> tuple[int, Path]:
    """FEDBAYES_COMPUTE_SLOTS's value, parsed.

    Args:
        spec: "N:DIR": N >= 1 slots, each a lock file in the existing directory DIR.

    Returns:
        N and DIR.

    Raises:
        ValueError: `spec` is not N:DIR with N >= 1 and DIR an existing directory.
    """
    count, _, directory = spec.partition(":")
    if not (count.isdigit() and int(count) >= 1 and directory and Path(directory).is_dir()):
        raise ValueError(f"{SLOTS_ENV} must be N:DIR with N >= 1 and DIR an existing directory, got {spec!r}")
    return int(count), Path(directory)


@contextlib.contextmanager
def compute_slot() -> Iterator[None]:
    """Hold one of the machine's compute slots while the block runs; without FEDBAYES_COMPUTE_SLOTS, no limit.

    A slot is an exclusive flock on DIR/slot-<i>: the kernel frees it when its holder exits, however it exits,
    so a killed ClientApp never keeps one. Waiting is a 20 ms poll over the N files (flock has no "any of
    these" wait); after a minute it logs once that it is still waiting, since a stuck ClientApp of this
    machine holds its slot for as long as it is stuck.

    Yields:
        None, once a slot is held; the slot is released when the block exits.

    Raises:
        ValueError: FEDBAYES_COMPUTE_SLOTS is set but not N:DIR (compute_slots).
        OSError: a slot file in DIR cannot be opened.
    """
    spec = os.environ.get(SLOTS_ENV)
    if not spec:
        yield
        return
    count, directory = compute_slots(spec)
    files = [os.open(directory / f"slot-{index}", os.O_RDWR | os.O_CREAT, 0o600) for index in range(count)]
    try:
        waiting_since, warned = time.monotonic(), False
        while not any(_try_lock(descriptor) for descriptor in files):
            if not warned and time.monotonic() - waiting_since > SLOT_WARN_SECONDS:
                log(
                    WARNING,
                    "this ClientApp has waited %.0f s for one of the machine's %d compute slots (%s): the "
                    "other ClientApps of this machine still compute, or one is stuck",
                    SLOT_WARN_SECONDS,
                    count,
                    SLOTS_ENV,
                )
                warned = True
            time.sleep(SLOT_POLL_SECONDS)
        yield
    finally:
        for descriptor in files:
            os.close(descriptor)  # releases the slot held through it


def _try_lock(descriptor: int) -> bool:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
