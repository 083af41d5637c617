"""Every reader of a file or message from someone else bounds what it allocates before it allocates it: for each, a
file (or message) of a few KiB that claims gigabytes is refused by name, and the process that read it stays within
ALLOWANCE_MIB of its baseline (its peak RSS, from the kernel: tests/support/readers.py)."""

from __future__ import annotations

import zipfile
import zlib

import numpy as np
import pytest

from tests.support.readers import (
    BZIP2_X,
    MIB,
    Entry,
    honest,
    npy_bytes,
    read_in_child,
    safetensors_claiming,
    sparse_file,
    write_archive,
)

GIB = 2**30
NPZ = "from pathlib import Path\nfrom fedbayes.tasks import npzdata\npath = Path(sys.argv[1])"
ONE_LABEL = honest("y.npy", np.zeros(1, np.int64))


# ---- a user's own data (tasks/npzdata.py): every reader of an .npz, `fedbayes predict`'s DATA.npz included -------
def test_an_npz_entry_that_decompresses_to_gigabytes_is_refused_unread(tmp_path):
    path = write_archive(tmp_path / "bomb.npz", BZIP2_X, ONE_LABEL)
    assert path.stat().st_size < 4 * 2**10 and zipfile.ZipFile(path).getinfo("x.npy").file_size > 2 * GIB
    readers = [f"npzdata.{reader}(path)" for reader in ("read_x", "read_header", "read_examples")]
    for reading in read_in_child(NPZ, readers, path):
        reading.assert_refused("NpzDataError", str(path), "'x' is compressed with zip method 12", "stored or deflated")


# x's .npy header claims 4 GiB of float32 that its entry lacks, or the entry's declared size claims them too
CLAIMING_X = npy_bytes((2**20, 1024), "float32", bytes(1024))
DEFLATED_X = zlib.compress(CLAIMING_X)[2:-4]  # the raw deflate stream, as a zip entry holds it


@pytest.mark.parametrize(
    "x, problem",
    [
        (Entry("x.npy", CLAIMING_X), "declares shape (1048576, 1024) float32 (4294967424 bytes with its header)"),
        (Entry("x.npy", CLAIMING_X, file_size=128 + 4 * GIB), "declares 4294967424 bytes from 1152 stored bytes"),
        (
            Entry("x.npy", DEFLATED_X, zipfile.ZIP_DEFLATED, 128 + 4 * GIB, zlib.crc32(CLAIMING_X)),
            "declares 4294967424 bytes from",
        ),
    ],
    ids=["npy-header", "stored-entry", "deflated-entry"],
)
def test_an_npz_entry_whose_header_or_size_claims_gigabytes_is_refused(tmp_path, x, problem):
    path = write_archive(tmp_path / "claims.npz", x, ONE_LABEL)
    assert path.stat().st_size < 4 * 2**10
    for reading in read_in_child(NPZ, ["npzdata.read_x(path)", "npzdata.read_examples(path)"], path):
        reading.assert_refused("NpzDataError", str(path), "'x'", problem)


def test_npz_labels_claiming_gigabytes_are_refused_before_they_are_read(tmp_path):
    labels = Entry("y.npy", npy_bytes((2**29,), "int64", bytes(64)), file_size=128 + 4 * GIB)
    path = write_archive(tmp_path / "labels.npz", honest("x.npy", np.zeros((1, 4), np.float32)), labels)
    for reading in read_in_child(NPZ, ["npzdata.read_header(path)", "npzdata.read_examples(path)"], path):
        reading.assert_refused("NpzDataError", str(path), "'y' declares 4294967424 bytes from 192 stored bytes")


# ---- safetensors: server checkpoints (server/checkpoint.py) and a client's durable state (client/state.py) -------
SAFETENSORS = """
from fedbayes.client.state import ClientStateStore
from fedbayes.server.checkpoint import CheckpointStore
checkpoints, states = CheckpointStore(sys.argv[1], "fed", {}), ClientStateStore(sys.argv[2], "fed", "client-0")
"""


@pytest.mark.parametrize(
    "size, claimed, problem",
    [
        (4096, 8 * GIB, "declares 8589934592 bytes, more than the 4088 bytes after it"),
        (GIB, 900 * MIB, "declares 943718400 bytes, more than the format's bound of 100000000"),
    ],
    ids=["past-the-file", "past-the-bound"],
)
def test_a_safetensors_header_length_claiming_gigabytes_is_refused_before_it_is_read(tmp_path, size, claimed, problem):
    checkpoint = safetensors_claiming(tmp_path / "server" / "fed" / "checkpoint-1.safetensors", claimed, size)
    state = safetensors_claiming(tmp_path / "state" / "fed" / "client-0" / "round-1.safetensors", claimed, size)
    read_checkpoint, load_state = read_in_child(
        SAFETENSORS, ["checkpoints.read()", "states.load(1, 2)"], tmp_path / "server", tmp_path / "state"
    )
    read_checkpoint.assert_refused(
        "CheckpointError", f"server checkpoint {checkpoint} is damaged: 'header length' {problem}"
    )
    load_state.assert_refused("StateCorruptError", f"client state {state} is unreadable: 'header length' {problem}")


def test_sparse_file_support_makes_files_that_claim_what_they_do_not_hold(tmp_path):
    """The claims above cost nothing to make: a sparse file's size is what it says, not what it takes on disk."""
    path = sparse_file(tmp_path / "sparse", 8 * GIB, b"head")
    assert path.stat().st_size == 8 * GIB and path.stat().st_blocks * 512 < MIB
