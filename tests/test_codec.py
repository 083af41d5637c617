"""The wire codec accepts exactly what protos/payloads.proto describes and rejects the rest."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import ENVELOPE_KEY, PayloadError, decode, encode, new_header, tensor_group_fields
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


def test_tensor_groups_come_from_the_schema():
    assert tensor_group_fields(pb.FedAvgReply) == ["weights", "buffers"]
    assert tensor_group_fields(pb.FedAvgInstruction) == ["weights", "buffers"]


def replace_array(content, name, value):
    arrays = {key: content["weights"][key] for key in content["weights"].keys()}
    arrays[name] = Array(value)
    content["weights"] = ArrayRecord(arrays)
    return content


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
        (drop("weights"), "weights", "missing ArrayRecord"),
        (lambda c: set_envelope(c, type="fedbayes.v1.FedAvgInstruction"), "type", "expected fedbayes.v1.FedAvgReply"),
        (lambda c: set_envelope(c, message=b"\xff\xff\xff"), "message", "malformed"),
        (wrong_version, "header.schema_version", "expected 3, got 7"),
        (nan_loss, "train_loss", "must be finite"),
        (lambda c: replace_array(c, "fc.bias", np.zeros(4, np.float32)), "weights/fc.bias", "shape must be (3,)"),
        (lambda c: replace_array(c, "fc.bias", np.zeros(3, np.float64)), "weights/fc.bias", "dtype must be float32"),
        (lambda c: replace_array(c, "fc.bias", np.array([0, np.nan, 0], np.float32)), "weights/fc.bias", "NaN or Inf"),
        (lambda c: replace_array(c, "fc.weight", np.full((3, 4), np.inf, np.float32)), "weights/fc.weight", "NaN or Inf"),
        (lambda c: replace_array(c, "extra", np.zeros(1, np.float32)), "weights", "do not match expected"),
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
    with pytest.raises(PayloadError, match="fc.weight.*shape must be \\(3, 5\\)"):
        decode(fedavg_reply(), pb.FedAvgReply, {"weights": other_layout}, sender="server")


def test_encode_refuses_unknown_dtypes_and_groups():
    with pytest.raises(ValueError, match="dtype int32"):
        encode(pb.FedAvgReply(header=new_header("f", 1)), {"weights": {"x": np.zeros(2, np.int32)}})
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


def test_payload_size_is_tensor_bytes_plus_envelope():
    from fedbayes.protos.codec import check_payload_size, payload_bytes

    content = fedavg_reply()
    envelope = len(content.config_records["fedbayes"]["message"])
    # 15 float32 values, each array serialized with a .npy header of at most 128 bytes
    assert 15 * 4 + envelope < payload_bytes(content) <= 15 * 4 + envelope + 2 * 128
    check_payload_size(content, max_mb=1.0, sender="client x")
    with pytest.raises(PayloadError, match="client x: payload is .* MiB, over the limit max-payload-mb=1e-05"):
        check_payload_size(content, max_mb=1e-5, sender="client x")
