"""The wire codec accepts exactly what protos/payloads.proto describes and rejects the rest."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import (
    ENVELOPE_KEY,
    PACKED_ARRAY,
    TENSORS_KEY,
    TIMINGS_KEY,
    PayloadError,
    decode,
    encode,
    new_header,
    tensor_group_fields,
)
from tests.helpers import LAYOUT, fedavg_reply, weights

ROOT = Path(__file__).resolve().parents[1]


def decode_reply(content):
    return decode(content, pb.FedAvgReply, {"weights": LAYOUT}, sender="client 'client-7' (node 42)")


def test_round_trip_keeps_scalars_and_tensors():
    sent = weights(0.25)
    content = encode(pb.FedAvgReply(header=new_header("fed", 3, "client-7"), num_examples=12), {"weights": sent})
    payload = decode_reply(content)
    assert payload.message.num_examples == 12
    assert payload.message.header.server_round == 3 and payload.message.header.client_id == "client-7"
    assert list(payload.tensors["weights"]) == list(LAYOUT)
    for name, value in sent.items():
        np.testing.assert_array_equal(payload.tensors["weights"][name], value)
    manifest = [(spec.name, tuple(spec.shape)) for spec in payload.message.weights.tensors]
    assert manifest == list(LAYOUT.items())


def test_every_tensor_rides_in_one_array_in_manifest_order():
    """Flower moves each Array as an object of its own, one request per hop: a payload is one Array, however many
    tensors and groups it has."""
    mean, precision = weights(0.25), weights(2.0)
    content = encode(pb.BayesADMMReply(header=new_header("fed", 3, "client-7"), num_examples=4),
                     {"local_mean": mean, "dual_precision": precision})
    assert list(content.array_records) == [TENSORS_KEY] and list(content[TENSORS_KEY]) == [PACKED_ARRAY]
    expected = np.concatenate([value.ravel() for value in (*mean.values(), *precision.values())])
    np.testing.assert_array_equal(content[TENSORS_KEY][PACKED_ARRAY].numpy(), expected)
    layouts = {"local_mean": LAYOUT, "dual_precision": LAYOUT}
    payload = decode(content, pb.BayesADMMReply, layouts, sender="client-7")
    assert payload.tensors["local_precision"] == {} and payload.tensors["buffers"] == {}
    np.testing.assert_array_equal(payload.tensors["dual_precision"]["fc.bias"], precision["fc.bias"])
    with pytest.raises(PayloadError, match="field 'local_precision': tensor names"):  # a group the sender left empty
        decode(content, pb.BayesADMMReply, {**layouts, "local_precision": LAYOUT}, sender="client-7")


def test_tensor_groups_come_from_the_schema():
    assert tensor_group_fields(pb.FedAvgReply) == ["weights", "buffers"]
    assert tensor_group_fields(pb.FedAvgInstruction) == ["weights", "buffers"]


def replace_packed(content, value=None, data=None, extra=None):
    """`content` with its packed Array replaced by `value`, or declared as before but holding `data` (.npy bytes);
    `extra` arrays beside it."""
    array = content[TENSORS_KEY][PACKED_ARRAY]
    if value is not None:
        array = Array(value)
    elif data is not None:
        array = Array(dtype=array.dtype, shape=array.shape, stype=array.stype, data=data)
    content[TENSORS_KEY] = ArrayRecord({PACKED_ARRAY: array, **(extra or {})})
    return content


def with_value(content, name, value):
    """`content` with tensor `name` of group `weights` holding `value` (same size) in the packed Array."""
    packed = content[TENSORS_KEY][PACKED_ARRAY].numpy().copy()
    offset = 0 if name == "fc.weight" else 12  # LAYOUT: fc.weight (3, 4), then fc.bias (3,)
    packed[offset:offset + value.size] = value.ravel()
    return replace_packed(content, packed)


def with_manifest(content, name, **changes):
    """`content` whose envelope declares tensor `name` of group `weights` otherwise (shape, dtype), or an extra one."""
    message = pb.FedAvgReply.FromString(content[ENVELOPE_KEY]["message"])
    specs = {spec.name: spec for spec in message.weights.tensors}
    spec = specs.get(name) or message.weights.tensors.add(name=name, dtype=pb.FLOAT32, shape=[1])
    if "shape" in changes:
        del spec.shape[:]
        spec.shape.extend(changes["shape"])
    if "dtype" in changes:
        spec.dtype = changes["dtype"]
    return set_envelope(content, message=message.SerializeToString())


def npy(value):
    import io

    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def set_envelope(content, **changes):
    envelope = content[ENVELOPE_KEY]
    content[ENVELOPE_KEY] = ConfigRecord({"type": envelope["type"], "message": envelope["message"], **changes})
    return content


def wrong_version(content):
    message = pb.FedAvgReply.FromString(content[ENVELOPE_KEY]["message"])
    message.header.schema_version = 7
    return set_envelope(content, message=message.SerializeToString())


def nan_loss(content):
    message = pb.FedAvgReply.FromString(content[ENVELOPE_KEY]["message"])
    message.train_loss = float("nan")
    return set_envelope(content, message=message.SerializeToString())


def drop(key):
    def dropper(content):
        del content[key]
        return content

    return dropper


@pytest.mark.parametrize(
    ("tamper", "field", "problem"),
    [
        (drop(ENVELOPE_KEY), ENVELOPE_KEY, "missing"),
        (drop(TENSORS_KEY), TENSORS_KEY, "missing ArrayRecord"),
        (lambda c: set_envelope(c, type="fedbayes.v1.FedAvgInstruction"), "type", "expected fedbayes.v1.FedAvgReply"),
        (lambda c: set_envelope(c, message=b"\xff\xff\xff"), "message", "malformed"),
        (wrong_version, "header.schema_version", "expected 6, got 7"),
        (nan_loss, "train_loss", "must be finite"),
        # the manifest: what the sender declares each tensor to be
        (lambda c: with_manifest(c, "fc.bias", shape=[4]), "weights/fc.bias", "shape must be (3,), got (4,)"),
        (lambda c: with_manifest(c, "fc.bias", dtype=pb.FLOAT64), "weights/fc.bias",
         "dtype must be float32, got FLOAT64"),
        (lambda c: with_manifest(c, "fc.bias", dtype=9), "weights/fc.bias", "dtype must be float32, got 9"),
        (lambda c: with_manifest(c, "extra"), "weights", "do not match expected"),
        # the packed Array: as declared, and as its .npy bytes really are
        (lambda c: replace_packed(c, np.zeros(16, np.float32)), TENSORS_KEY, "declared float32 (16,)"),
        (lambda c: replace_packed(c, np.zeros(15, np.float64)), TENSORS_KEY, "declared float64 (15,)"),
        (lambda c: replace_packed(c, data=npy(np.zeros(15, np.float64))), TENSORS_KEY, "array data has dtype float64"),
        (lambda c: replace_packed(c, data=npy(np.zeros(14, np.float32))), TENSORS_KEY, "array data has shape (14,)"),
        (lambda c: replace_packed(c, data=b"PK\x03\x04"), TENSORS_KEY, "unreadable array data"),
        (lambda c: replace_packed(c, extra={"x": Array(np.zeros(1, np.float32))}), TENSORS_KEY, "expected one array"),
        # finiteness, naming the tensor that holds the NaN or Inf
        (lambda c: with_value(c, "fc.bias", np.array([0, np.nan, 0], np.float32)), "weights/fc.bias", "NaN or Inf"),
        (lambda c: with_value(c, "fc.weight", np.full((3, 4), np.inf, np.float32)), "weights/fc.weight", "NaN or Inf"),
    ],
)
def test_bad_payloads_are_rejected_naming_sender_and_field(tamper, field, problem):
    with pytest.raises(PayloadError) as error:
        decode_reply(tamper(fedavg_reply()))
    message = str(error.value)
    assert "client 'client-7' (node 42)" in message
    assert field in message and problem in message


def test_unexpected_record_is_rejected():
    content = fedavg_reply()
    content["smuggled"] = ArrayRecord({"x": Array(np.zeros(1, np.float32))})
    with pytest.raises(PayloadError, match="unexpected records"):
        decode_reply(content)


def test_layout_mismatch_with_receiver_is_rejected():
    other_layout = {"fc.weight": (3, 5), "fc.bias": (3,)}
    with pytest.raises(PayloadError, match="fc.weight.*shape must be \\(3, 5\\), got \\(3, 4\\)"):
        decode(fedavg_reply(), pb.FedAvgReply, {"weights": other_layout}, sender="server")


def test_encode_refuses_unknown_dtypes_and_groups():
    for dtype in (np.int32, np.float64):
        with pytest.raises(ValueError, match=f"weights/x: dtype {np.dtype(dtype)} is not in the schema"):
            encode(pb.FedAvgReply(header=new_header("f", 1)), {"weights": {"x": np.zeros(2, dtype)}})
    with pytest.raises(ValueError, match="tensor groups"):
        encode(pb.FedAvgReply(header=new_header("f", 1)), {"params": weights()})


def test_generated_code_is_current(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", str(ROOT / "protos" / "payloads.proto")],
        check=True,
    )
    for generated in ("payloads_pb2.py", "payloads_pb2.pyi"):
        assert (tmp_path / generated).read_text() == (ROOT / "protos" / generated).read_text(), (
            f"protos/{generated} is stale: run `make protos`"
        )


def test_payload_size_counts_every_record_value_and_key():
    from fedbayes.protos.codec import payload_bytes

    array = Array(np.zeros(15, np.float32))
    content = RecordDict({
        "t": ArrayRecord({"a": array}),
        "c": ConfigRecord({"b": b"xyz", "s": "h\u00e9", "n": 3, "f": 0.5, "y": True, "l": [b"ab", b"c"],
                           "w": ["\u00e9"]}),
        "m": MetricRecord({"x": 1.5, "v": [1, 2, 3]}),
    })
    array_bytes = len(array.data) + len("float32") + len(array.stype) + 8  # data, dtype, stype, one dimension
    config_bytes = 7 + 3 + 3 + 8 + 8 + 8 + 3 + 2  # keys, then values: 'hé' is 3 UTF-8 bytes, numbers 8 each
    metric_bytes = 2 + 8 + 3 * 8
    assert payload_bytes(content) == 3 + (1 + array_bytes) + config_bytes + metric_bytes


def test_payload_size_refuses_a_fedavg_reply_only_over_the_limit():
    from fedbayes.protos.codec import check_payload_size

    content = fedavg_reply()
    check_payload_size(content, max_mb=1.0, sender="client x")
    with pytest.raises(PayloadError, match="client x: payload is .* MiB, over the limit max-payload-mb=1e-05"):
        check_payload_size(content, max_mb=1e-5, sender="client x")


PAD = 2 * 2**20  # bytes: over a 1 MiB limit, wherever it rides


@pytest.mark.parametrize("pad", [
    lambda c: c.__setitem__("extra", ConfigRecord({"pad": b"\0" * PAD})),
    lambda c: c[ENVELOPE_KEY].__setitem__("pad", "x" * PAD),  # an extra key of the envelope
    lambda c: c.__setitem__(TIMINGS_KEY, ConfigRecord({"setup": 0.1, "pad": b"\0" * PAD})),
    lambda c: c.__setitem__("metrics", MetricRecord({"pad": [0.0] * (PAD // 8)})),
    lambda c: c.__setitem__("extra", ArrayRecord({"pad": Array(np.zeros(PAD // 4, np.float32))})),
], ids=["config-record", "envelope-key", "timings", "metric-record", "array-record"])
def test_a_pad_in_any_record_counts_toward_the_limit(pad):
    from fedbayes.protos.codec import check_payload_size

    content = fedavg_reply()
    check_payload_size(content, max_mb=1.0, sender="client 'client-7' (node 42)")
    pad(content)
    with pytest.raises(PayloadError, match=r"client 'client-7' \(node 42\): payload is 2\.0 MiB, over the limit "
                                           r"max-payload-mb=1$"):
        check_payload_size(content, max_mb=1.0, sender="client 'client-7' (node 42)")
