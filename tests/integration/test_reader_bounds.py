"""Every reader of a file or message from someone else bounds what it allocates before it allocates it: for each, a
file (or message) of a few KiB that claims gigabytes is refused by name, and the process that read it stays within
ALLOWANCE_MIB of its baseline (its peak RSS, from the kernel: tests/support/readers.py)."""

from __future__ import annotations

import gzip
import json
import struct
import zipfile
import zlib

import numpy as np
import pytest

from fedbayes.server.identity import REGISTRY_ENTRY_BYTES
from fedbayes.tasks.partitions import split_file_limit
from fedbayes.tasks.storage import MAX_LINE_BYTES
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
        (GIB, 900 * MIB, "declares 943718400 bytes, over the limit of 100000000"),
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


# ---- JSON files: split files, the client registry, forget requests and the audit log, the loop's results ------
def test_a_split_file_claiming_gigabytes_is_refused_by_its_size(tmp_path):
    sparse = sparse_file(tmp_path / "split.json", 8 * GIB, b"[[0, 1], [2]")
    device = tmp_path / "device.json"
    device.symlink_to("/dev/zero")  # no size to check: it is read no further than the bound
    setup = "from fedbayes.tasks.partitions import read_split_file"
    readers = [f"read_split_file(sys.argv[{argument}], 60000, 10)" for argument in (1, 2)]
    of_the_file, of_the_device = read_in_child(setup, readers, sparse, device)
    bound = f"the {split_file_limit(60000, 10)} bytes a split of 60000 rows among 10 clients may take"
    of_the_file.assert_refused("ValueError", f"split file {sparse} is {8 * GIB} bytes, over {bound}")
    of_the_device.assert_refused("ValueError", f"split file {device} holds more than {bound}")


def test_a_client_registry_claiming_gigabytes_is_refused_by_its_size(tmp_path):
    registry = sparse_file(tmp_path / "clients.json", 8 * GIB, b'{"client-0": 1')
    setup = "from fedbayes.server.identity import ClientIdentities"
    (reading,) = read_in_child(setup, ["ClientIdentities('bound', 1000, registry_path=sys.argv[1])"], registry)
    reading.assert_refused(
        "ConfigError",
        f"run config 'client-registry': {registry} is {8 * GIB} bytes, over the {1000 * REGISTRY_ENTRY_BYTES + 1024} "
        "bytes a registry of max-clients=1000 ids may take; raise max-clients for a larger one",
    )


def test_forget_requests_and_the_audit_log_claiming_gigabytes_are_read_within_bounds(tmp_path):
    request = sparse_file(tmp_path / "forget-requests" / "20250101T000000-00000000.json", 8 * GIB, b'{"id": "')
    first, last = (json.dumps({"event": "refused", "request": name}).encode() + b"\n" for name in ("first", "last"))
    audit = sparse_file(tmp_path / "forget-audit.jsonl", 2 * GIB, first, b"\n" + last)  # the hole: one long line
    setup = "from pathlib import Path\nfrom fedbayes.server.forget import AuditLog, RequestQueue"
    pending, records = read_in_child(
        setup,
        [
            "result = RequestQueue(Path(sys.argv[1])).pending()",
            "result = [record['request'] for record in AuditLog(Path(sys.argv[2])).records()]",
        ],
        request.parent,
        audit,
    )
    pending.assert_refused(
        None,
        f"request file {request} is no forget request (FileTooLarge: {request} is {8 * GIB} bytes, over the 65536 "
        "bytes a forget request may take)",
    )
    records.assert_refused(None, "['first', 'last']")  # the line over MAX_LINE_BYTES is skipped, unread


def test_the_results_file_and_start_record_claiming_gigabytes_are_read_within_bounds(tmp_path):
    first, second = (json.dumps({"round": server_round}).encode() + b"\n" for server_round in (1, 2))
    resumed = sparse_file(tmp_path / "resumed.jsonl", 2 * GIB, first, b"\n" + second)  # round 1, a long line, round 2
    record = sparse_file(tmp_path / "start.json", 8 * GIB, b'{"path": "')
    appended = sparse_file(tmp_path / "appended.jsonl", 2 * GIB, first, b"\n")
    setup = (
        "from pathlib import Path\nfrom fedbayes.server.loop import ResultsLog\n"
        "from fedbayes.deploy.launcher import _line_count, _read_rows"
    )
    dropped, restarted, counted, followed = read_in_child(
        setup,
        [
            "ResultsLog(sys.argv[1], keep_through_round=1)\nresult = Path(sys.argv[1]).stat().st_size",
            "ResultsLog(sys.argv[3], start_record=Path(sys.argv[2]))",
            "ResultsLog(sys.argv[3], 0, 'append', Path(sys.argv[4]))\nresult = Path(sys.argv[4]).read_text()",
            "result = _line_count(Path(sys.argv[3])), _read_rows(Path(sys.argv[3]), 1)",  # `fedbayes local`'s
        ],
        resumed,
        record,
        appended,
        tmp_path / "new-start.json",
    )
    dropped.assert_refused(None, str(2 * GIB - len(second)))  # round 2's row cut off; the long line, no row, kept
    restarted.assert_refused("FileTooLarge", f"{record} is {8 * GIB} bytes, over the 65536 bytes a start record")
    counted.assert_refused(None, '"first_line": 2')
    followed.assert_refused(None, "(2, [])")  # the earlier lines counted, not read; the long one is no row


def test_report_reads_a_results_file_claiming_gigabytes_within_bounds(tmp_path):
    row = json.dumps({"round": 1, "accuracy": 0.5, "nll": 1.0, "ece": 0.1}).encode() + b"\n"
    results = sparse_file(tmp_path / "results.jsonl", 2 * GIB, row, b"\n" + row)
    setup = "from pathlib import Path\nfrom fedbayes.tasks.report import read_rows"
    (reading,) = read_in_child(
        setup, ["warned = []\nresult = len(read_rows(Path(sys.argv[1]), warned.append)), warned"], results
    )
    reading.assert_refused(
        None, f"(2, ['{results}:2: over {MAX_LINE_BYTES} bytes, longer than any results row; the report leaves"
    )


# ---- a message (protos/codec.py): a particle count deciding the layout, an array claiming what it lacks --------
DSVGD_INSTRUCTION = """
from flwr.app import Array, ArrayRecord, RecordDict
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PACKED_ARRAY, TENSORS_KEY, decode, new_header, with_envelope
from fedbayes.strategies.dsvgd.client import instruction_layouts
from tests.support.readers import npy_bytes
count, width = 2**20, 1024  # N particles of P parameters: 4 GiB of float32
claims = pb.TensorGroup(tensors=[pb.TensorSpec(name="particles", dtype=pb.FLOAT32, shape=[count, width])])
envelope = pb.Instruction(header=new_header("fed", 1))
envelope.body.Pack(pb.DSVGDInstruction(particles=claims, variant="dsvgd", particle_count=count))
packed = Array(dtype="float32", shape=(count * width,), stype="numpy.ndarray", data=npy_bytes((count * width,), "<f4"))
content = with_envelope(RecordDict({TENSORS_KEY: ArrayRecord({PACKED_ARRAY: packed})}), envelope)
def layouts(instruction):
    return {**instruction_layouts(instruction, {"w": (width,)}), "buffers": {}}
"""


def test_a_message_whose_particles_claim_gigabytes_is_refused_before_they_are_allocated():
    (reading,) = read_in_child(
        DSVGD_INSTRUCTION, ["decode(content, pb.Instruction, pb.DSVGDInstruction, layouts, 'server')"]
    )
    reading.assert_refused(
        "PayloadError",
        "server: field 'fedbayes-tensors': array data declares float32 (1073741824,) (4294967296 bytes), but holds 0 "
        "bytes after its header",
    )


# ---- the built-in datasets' IDX files (tasks/datasets.py) ---------------------------------------------------------
def idx_header(*dims: int) -> bytes:
    return bytes([0, 0, 0x08, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)


def test_an_idx_file_claiming_gigabytes_is_refused_before_it_is_decompressed(tmp_path):
    claims = tmp_path / "claims-idx3-ubyte.gz"
    claims.write_bytes(gzip.compress(idx_header(10**9, 28, 28) + bytes(1024)))
    bomb = tmp_path / "bomb-idx3-ubyte.gz"  # 32 gzip members of 64 MiB of zeros each: 2 MiB that hold 2 GiB
    bomb.write_bytes(gzip.compress(idx_header(2, 28, 28)) + gzip.compress(bytes(64 * MIB)) * 32)
    assert bomb.stat().st_size < 3 * MIB
    setup = "from pathlib import Path\nfrom fedbayes.tasks.datasets import read_idx_ubyte_gz"
    readers = [f"read_idx_ubyte_gz(Path(sys.argv[{argument}]), 3)" for argument in (1, 2)]
    of_the_claim, of_the_bomb = read_in_child(setup, readers, claims, bomb)
    of_the_claim.assert_refused(
        "ValueError", f"{claims}: header says shape (1000000000, 28, 28), 784000000000 bytes, over the 1073741824"
    )
    of_the_bomb.assert_refused("ValueError", f"{bomb}: header says shape (2, 28, 28) but the file holds more than that")


def test_sparse_file_support_makes_files_that_claim_what_they_do_not_hold(tmp_path):
    """The claims above cost nothing to make: a sparse file's size is what it says, not what it takes on disk."""
    path = sparse_file(tmp_path / "sparse", 8 * GIB, b"head", b"tail")
    assert path.stat().st_size == 8 * GIB and path.stat().st_blocks * 512 < MIB
    with path.open("rb") as file:
        assert file.read(4) == b"head" and file.seek(-4, 2) and file.read() == b"tail"
