"""Files of a few KiB that claim gigabytes, and a fresh process that reads one and reports its peak RSS: what the
reader-bounds tests (tests/integration/test_reader_bounds.py) are made of.

`read_in_child` runs a reader in a new interpreter of this venv with this tree first on its path. Its peak RSS is the
kernel's high-water mark of the child's own memory (VmHWM in /proc/self/status), read after its imports (the
baseline) and after the reading. Not ru_maxrss: Linux carries the parent's peak over into a child's ru_maxrss when
it execs, so a child of a large test process would hide an allocation below that."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.support import ROOT

MIB = 2**20
ALLOWANCE_MIB = 100  # what reading a refused file may add to the child's baseline

_CHILD = """\
import json, re, sys
def peak_kib():
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
def outcome(reading):
    try:
        exec(reading, globals())
    except Exception as error:
        return {{"error": type(error).__name__, "message": str(error), "peak_kib": peak_kib()}}
    return {{"error": None, "message": str(globals().pop("result", "")), "peak_kib": peak_kib()}}
{setup}
baseline = peak_kib()
print(json.dumps({{"baseline_kib": baseline, "readings": [outcome(reading) for reading in {readings!r}]}}))
"""


@dataclass(frozen=True)
class Reading:
    """What a child did with one reading: the exception it raised (None: none) and its message (or, where it raised
    none, the `result` it set, as text), and the child's peak RSS in MiB after its imports and after this reading
    (and those before it)."""

    error: str | None
    message: str
    baseline_mib: float
    peak_mib: float

    def assert_refused(self, error: str | None, *fragments: str) -> None:
        """It raised `error` (None: nothing), whose message (or result) holds every fragment, and read at most
        ALLOWANCE_MIB on the way."""
        assert self.error == error, f"{self.error}: {self.message}"
        for fragment in fragments:
            assert fragment in self.message, self.message
        assert self.peak_mib - self.baseline_mib < ALLOWANCE_MIB, (
            f"peak RSS {self.peak_mib:.0f} MiB, {self.peak_mib - self.baseline_mib:.0f} MiB over the child's "
            f"baseline of {self.baseline_mib:.0f} MiB"
        )


def read_in_child(setup: str, readings: list[str], *args: str | Path, timeout: float = 300) -> list[Reading]:
    """Run `setup` (imports and arguments, `sys.argv[1:]` = `args`: part of the baseline), then each of `readings`
    (a reader's call) in turn, in one fresh interpreter: what each raised, and the peak RSS after it. The peak
    only grows, so a reading's bound holds for every one before it too."""
    code = _CHILD.format(setup=textwrap.dedent(setup), readings=[textwrap.dedent(reading) for reading in readings])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-c", code, *map(str, args)]
    child = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert child.returncode == 0, f"the child failed (exit {child.returncode}):\n{child.stderr[-3000:]}"
    result = json.loads(child.stdout.strip().splitlines()[-1])
    baseline = result["baseline_kib"] / 2**10
    return [
        Reading(reading["error"], reading["message"], baseline, reading["peak_kib"] / 2**10)
        for reading in result["readings"]
    ]


def sparse_file(path: Path, size: int, head: bytes = b"", tail: bytes = b"") -> Path:
    """A file of `size` bytes that takes a few KiB on disk: `head`, a hole of zeros, `tail`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        file.write(head)
        file.truncate(size - len(tail))
        file.seek(size - len(tail))
        file.write(tail)
    return path


def safetensors_claiming(path: Path, header_bytes: int, size: int = 4096) -> Path:
    """A safetensors file of `size` bytes (sparse past its first 8) whose length prefix declares `header_bytes`."""
    return sparse_file(path, size, struct.pack("<Q", header_bytes) + b'{"__metadata__":{}}')


def npy_bytes(shape: tuple[int, ...], dtype: str, data: bytes = b"") -> bytes:
    """An .npy header declaring `shape` and `dtype`, then `data` (which need not hold what it declares)."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.dtype(dtype).str, "fortran_order": False, "shape": shape})
    return header.getvalue() + data


@dataclass(frozen=True)
class Entry:
    """One archive entry of an .npz, as `write_archive` writes it: its bytes as they lie in the archive, and what the
    central directory declares of them (None: the truth)."""

    name: str
    stored: bytes
    method: int = zipfile.ZIP_STORED
    file_size: int | None = None
    crc: int | None = None


def write_archive(path: Path, *entries: Entry) -> Path:
    """An .npz (a zip) whose central directory declares each entry's method, size and CRC as `entries` say: Python's
    zipfile, like numpy, trusts the central directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for entry in entries:
            archive.writestr(entry.name, entry.stored)
            info = archive.getinfo(entry.name)
            info.compress_type = entry.method
            info.file_size = len(entry.stored) if entry.file_size is None else entry.file_size
            info.CRC = info.CRC if entry.crc is None else entry.crc
    return path


def honest(name: str, value: np.ndarray) -> Entry:
    """A stored entry holding `value` as np.savez writes it."""
    data = io.BytesIO()
    np.save(data, value, allow_pickle=False)
    return Entry(name, data.getvalue())


# bz2 of an .npy of shape (2**21, 1024) uint8, all zeros: 1,632 bytes that decompress to 2 GiB and its 128-byte
# header. Made by compressing npy_bytes((2**21, 1024), "uint8") and 2**31 zero bytes with bz2.BZ2Compressor(9); the
# CRC-32 is theirs.
BZIP2_X = Entry(
    "x.npy",
    base64.b64decode(
        "QlpoOTFBWSZTWZ8vG4cFfkHfoOAQQOZ2sAEDQiCvRd8OCAAACCAAlIZU8qZPUekA9R6QyaB6antSCKqephBgg00DRpoNMiH5RAFVRIAKAKqiZ8IA"
        "oAkkkEXPZwtEAiJVuljVSwCG+uHKty0WMekbNNyvLsM78PGWPOVEfRcgqSEppPuzBG1W5zCxZQCQACSqJ/MUFZJlNZDgni3wFfjkAAwAAACCAAMI"
        "BNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3w"
        "FfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCo"
        "CXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAA"
        "ggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ"
        "4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQq"
        "AlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQA"
        "DAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQV"
        "kmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMI"
        "BNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3w"
        "FfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCo"
        "CXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAA"
        "ggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ"
        "4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQq"
        "AlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQA"
        "DAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQV"
        "kmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMI"
        "BNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZIhm12Q"
        "EUrcCAwAAABAAIIAAwzAUppqUkSGwVJEh4u5IpwoSGOyKAMA"
    ),
    zipfile.ZIP_BZIP2,
    file_size=128 + 2**31,
    crc=3274014782,
)
