"""A process killed inside `write_atomically` leaves the old file whole and a temp file beside it; the writer that
resumes removes that temp file with `remove_torn_writes`, and nothing else."""

from __future__ import annotations

import subprocess
import sys

from fedbayes.tasks.storage import remove_torn_writes

# Dies (no cleanup, no exception handlers) at the moment write_atomically renames its temp file over the target.
CRASH_BEFORE_RENAME = """
import os, sys
from pathlib import Path
from fedbayes.tasks import storage
os.replace = lambda *_: os._exit(9)
storage.write_atomically(Path(sys.argv[1]), b"new rows\\n")
"""


def test_a_write_killed_before_its_rename_keeps_the_old_file_and_its_temp_file_is_removed_alone(tmp_path):
    rows = tmp_path / "tune-fedavg-p0.jsonl"
    rows.write_bytes(b"old rows\n")
    neighbours = [tmp_path / "tune-fedavg-p1.jsonl", tmp_path / ".tune-fedavg-p1.jsonl-abc.tmp", tmp_path / "x.tmp"]
    for path in neighbours:
        path.write_bytes(b"someone else's\n")

    crashed = subprocess.run([sys.executable, "-c", CRASH_BEFORE_RENAME, str(rows)], capture_output=True)
    assert crashed.returncode == 9, crashed.stderr
    torn = sorted(tmp_path.glob(".tune-fedavg-p0.jsonl-*.tmp"))
    assert len(torn) == 1 and torn[0].read_bytes() == b"new rows\n"
    assert rows.read_bytes() == b"old rows\n"

    assert remove_torn_writes(rows) == torn
    assert not torn[0].exists() and rows.read_bytes() == b"old rows\n"
    assert all(path.read_bytes() == b"someone else's\n" for path in neighbours)
    assert remove_torn_writes(rows) == []
