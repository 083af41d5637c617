"""Seeded fuzzing of the wire codec: whatever a sender puts in a payload, `decode` either returns a payload that
matches the receiver's expectation or raises PayloadError; no other exception escapes to the server."""

from __future__ import annotations

import io
import random
from collections import Counter

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import ENVELOPE_KEY, PayloadError, decode, encode
from tests.support import reply_envelope

MUTATIONS = 6_000
LAYOUT = {"fc.weight": (3, 4), "fc.bias": (3,)}
BAYES_LAYOUTS = {group: LAYOUT for group in ("local_mean", "local_precision", "dual_mean", "dual_precision")}
STRANGE_ARRAYS = [
    np.full((3,), "x"),
    np.zeros((3,), np.complex64),
    np.zeros((3,), bool),
    np.zeros((3,), np.int64),
    np.zeros((3,), np.float16),
    np.zeros((3,), ">f4"),
    np.zeros((3,), [("a", "<f4")]),
    np.zeros((3, 4), np.float32),
    np.zeros((), np.float32),
    np.zeros((0,), np.float32),
    np.full((3,), np.inf, np.float32),
]


def honest_payloads(rng: np.random.Generator) -> list[tuple[RecordDict, type, dict]]:
    values = {name: rng.normal(size=shape).astype(np.float32) for name, shape in LAYOUT.items()}
    fedavg = encode(reply_envelope("client-1", 2, 5), pb.FedAvgReply(), {"weights": values})
    bayes = encode(reply_envelope("client-1", 2, 5), pb.BayesADMMReply(), {group: values for group in BAYES_LAYOUTS})
    return [(fedavg, pb.FedAvgReply, {"weights": LAYOUT}), (bayes, pb.BayesADMMReply, BAYES_LAYOUTS)]


def npy(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(4)
        position = rng.randrange(len(data) + 1)
        if kind == 0 and data:
            data[min(position, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 2:
            del data[position : position + rng.randint(1, 16)]
        else:
            data = data[:position]
    return bytes(data)


def mutate(content: RecordDict, rng: random.Random) -> RecordDict:
    """One random change a hostile or broken sender could make to an encoded payload."""
    records = {name: ArrayRecord(dict(record.items())) for name, record in content.array_records.items()}
    envelope = dict(content.config_records[ENVELOPE_KEY].items())
    group = rng.choice(sorted(name for name, record in records.items() if len(record)))  # one with tensors
    arrays = dict(records[group].items())
    name = rng.choice(sorted(arrays))
    array = arrays[name]
    kind = rng.randrange(9)
    if kind == 0:  # the protobuf bytes
        envelope["message"] = mutate_bytes(envelope["message"], rng)
    elif kind == 1:  # the .npy bytes of one tensor
        arrays[name] = Array(
            dtype=array.dtype, shape=tuple(array.shape), stype=array.stype, data=mutate_bytes(array.data, rng)
        )
    elif kind == 2:  # other bytes under an honest declaration
        arrays[name] = Array(
            dtype="float32", shape=tuple(array.shape), stype="numpy.ndarray", data=npy(rng.choice(STRANGE_ARRAYS))
        )
    elif kind == 3:  # a lying declaration
        arrays[name] = Array(
            dtype=rng.choice(["float64", "int8", "<U1", "float32"]),
            shape=tuple(rng.choice([(), (3,), (3, 4), (4, 3), (12,)])),
            stype=rng.choice(["numpy.ndarray", "torch.Tensor", ""]),
            data=array.data,
        )
    elif kind == 4:  # a missing or extra tensor
        if rng.random() < 0.5:
            del arrays[name]
        else:
            arrays[f"{name}.extra"] = array
    elif kind == 5:  # a missing or extra record
        if rng.random() < 0.5:
            del records[group]
        else:
            records["extra"] = records[group]
    elif kind == 6:  # another envelope or message type, or none
        envelope["type"] = rng.choice(["fedbayes.v1.Instruction", "fedbayes.v1.FedAvgReply", "", "x"])
    elif kind == 7:  # the envelope's fields as other types
        envelope[rng.choice(["message", "type"])] = rng.choice([b"", "text", 7, 1.5, True])
    else:  # another payload's protobuf in this envelope
        other = reply_envelope("x", 2, 5)
        other.body.Pack(pb.FedPAReply(samples=3))
        envelope["message"] = other.SerializeToString()
    if group in records and kind not in (5,):
        records[group] = ArrayRecord(arrays)
    return RecordDict({**records, ENVELOPE_KEY: ConfigRecord(envelope)})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # numpy parsing a mutated .npy header
def test_only_payload_errors_escape_the_decoder():
    rng, np_rng = random.Random(20261124), np.random.default_rng(0)
    outcomes: Counter[str] = Counter()
    escaped = []
    honest = honest_payloads(np_rng)
    for index in range(MUTATIONS):
        content, message_type, layouts = honest[index % len(honest)]
        mutated = mutate(content, rng)
        try:
            decode(mutated, pb.Reply, message_type, layouts, sender="fuzz")
            outcomes["accepted"] += 1
        except PayloadError:
            outcomes["rejected"] += 1
        except Exception as error:  # noqa: BLE001 - the point of the test
            escaped.append(f"{type(error).__name__}: {error}")
    assert not escaped, f"{len(escaped)} of {MUTATIONS} escaped, e.g. {escaped[:5]}"
    # The fuzzer reaches both outcomes: it is not only feeding the decoder garbage it refuses at the door.
    assert outcomes["rejected"] > MUTATIONS // 2 and outcomes["accepted"] > 0
