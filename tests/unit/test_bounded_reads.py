"""Bounded reads (tasks/storage.py): a file from someone else is read no further than its bound. What each reader
costs on a file that claims gigabytes is measured in real processes: tests/integration/test_reader_bounds.py."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

from fedbayes.tasks.storage import FileTooLarge, Line, complete_lines, read_bounded, safetensors_header_problem


def lines_of(tmp_path, content: bytes, bound: int) -> list[Line]:
    path = tmp_path / "lines"
    path.write_bytes(content)
    return list(complete_lines(path, bound))


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", []),
        (b"abc", []),  # no newline: a line still being written
        (b"abcd\n", [Line(1, 5, b"abcd")]),  # exactly the bound
        (b"abcde\nxy\n", [Line(1, 6, None), Line(2, 9, b"xy")]),  # one over: not read
        (b"a\n\nabcdefghij\nb\ntorn", [Line(1, 2, b"a"), Line(2, 3, b""), Line(3, 14, None), Line(4, 16, b"b")]),
        (b"a\nabcdefghij", [Line(1, 2, b"a")]),  # a long piece at the end is no line either
    ],
)
def test_complete_lines_bound_every_line_and_drop_the_last_piece(tmp_path, content, expected):
    assert lines_of(tmp_path, content, bound=4) == expected


def test_read_bounded_refuses_a_file_over_its_bound_by_its_size(tmp_path):
    path = tmp_path / "request.json"
    path.write_bytes(b"x" * 11)
    assert read_bounded(path, 11, "a test") == b"x" * 11
    with pytest.raises(FileTooLarge, match=f"{path} is 11 bytes, over the 10 bytes a test may take"):
        read_bounded(path, 10, "a test")


def test_read_bounded_reads_a_device_no_further_than_its_bound(tmp_path):
    device = tmp_path / "device.json"
    device.symlink_to("/dev/zero")
    with pytest.raises(FileTooLarge, match=f"{device} holds more than the 1000 bytes a test may take"):
        read_bounded(device, 1000, "a test")


def test_a_safetensors_header_length_is_checked_against_the_file_and_the_bound(tmp_path):
    path = tmp_path / "good.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, path)
    assert safetensors_header_problem(path) is None
    header = struct.unpack("<Q", path.read_bytes()[:8])[0]
    assert safetensors_header_problem(path, limit=header - 1) == (
        f"declares {header} bytes, over the limit of {header - 1}"
    )
    path.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    assert safetensors_header_problem(path) == "declares 1099511627776 bytes, more than the 2 bytes after it"
    path.write_bytes(b"abc")
    assert safetensors_header_problem(path) == "is missing: the file is 3 bytes, a safetensors file begins with 8"
