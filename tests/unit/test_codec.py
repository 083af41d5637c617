"""The wire codec accepts exactly what protos/common.proto and protos/payloads.proto describe and rejects the rest."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from grpc_tools import protoc

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import (
    ENVELOPE_KEY,
    PACKED_ARRAY,
    TENSORS_KEY,
    TIMINGS_KEY,
    PayloadError,
    decode,
    decode_header,
    encode,
    register_message_types,
    tensor_group_fields,
)
from tests.support import LAYOUT, ROOT, envelope_of, fedavg_reply, reply_envelope, weights


def decode_reply(content):
    return decode(content, pb.Reply, pb.FedAvgReply, {"weights": LAYOUT}, sender="client 'client-7' (node 42)")


def test_round_trip_keeps_the_envelope_the_body_and_the_tensors():
    sent, buffers = weights(0.25), {"bn.mean": np.ones(2, np.float32)}
    envelope = reply_envelope("client-7", server_round=3, num_examples=12, resumed_from_round=2)
    content = encode(envelope, pb.FedAvgReply(), {"weights": sent, "buffers": buffers})
    payload = decode(content, pb.Reply, pb.FedAvgReply, {"weights": LAYOUT, "buffers": {"bn.mean": (2,)}}, "client-7")
    assert (payload.reply.num_examples, payload.reply.train_loss, payload.reply.resumed_from_round) == (12, 0.3, 2)
    assert payload.header.server_round == 3 and payload.header.client_id == "client-7"
    assert list(payload.tensors["weights"]) == list(LAYOUT)
    for name, value in sent.items():
        np.testing.assert_array_equal(payload.tensors["weights"][name], value)
    np.testing.assert_array_equal(payload.tensors["buffers"]["bn.mean"], buffers["bn.mean"])
    manifest = [(spec.name, tuple(spec.shape)) for spec in payload.message.weights.tensors]
    assert manifest == list(LAYOUT.items())
    assert [spec.name for spec in payload.envelope.buffers.tensors] == ["bn.mean"]


def test_every_tensor_rides_in_one_array_in_manifest_order():
    """Flower moves each Array as an object of its own, one request per hop: a payload is one Array, however many
    tensors and groups it has."""
    mean, precision = weights(0.25), weights(2.0)
    content = encode(
        reply_envelope("client-7", 3, 4), pb.BayesADMMReply(), {"local_mean": mean, "dual_precision": precision}
    )
    assert list(content.array_records) == [TENSORS_KEY] and list(content[TENSORS_KEY]) == [PACKED_ARRAY]
    expected = np.concatenate([value.ravel() for value in (*mean.values(), *precision.values())])
    np.testing.assert_array_equal(content[TENSORS_KEY][PACKED_ARRAY].numpy(), expected)
    layouts = {"local_mean": LAYOUT, "dual_precision": LAYOUT}
    payload = decode(content, pb.Reply, pb.BayesADMMReply, layouts, sender="client-7")
    assert payload.tensors["local_precision"] == {} and payload.tensors["buffers"] == {}
    np.testing.assert_array_equal(payload.tensors["dual_precision"]["fc.bias"], precision["fc.bias"])
    with pytest.raises(PayloadError, match="field 'local_precision': tensor names"):  # a group the sender left empty
        decode(content, pb.Reply, pb.BayesADMMReply, {**layouts, "local_precision": LAYOUT}, sender="client-7")


def test_tensor_groups_come_from_the_schema_and_the_shared_ones_from_the_envelope():
    assert tensor_group_fields(pb.FedAvgReply) == ["weights"]
    assert tensor_group_fields(pb.FedAvgInstruction) == ["weights"]
    assert tensor_group_fields(pb.Reply) == tensor_group_fields(pb.Instruction) == ["buffers"]


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
    packed[offset : offset + value.size] = value.ravel()
    return replace_packed(content, packed)


def with_body(content, change):
    """`content` whose FedAvgReply body `change(body)` edited."""
    envelope = envelope_of(content)
    body = pb.FedAvgReply()
    envelope.body.Unpack(body)
    change(body)
    envelope.body.Pack(body)
    return set_envelope(content, message=envelope.SerializeToString())


def with_manifest(content, name, **changes):
    """`content` whose body declares tensor `name` of group `weights` otherwise (shape, dtype), or an extra one."""
    return with_body(content, lambda body: _declared(body, name, changes))


def _declared(message, name, changes):
    specs = {spec.name: spec for spec in message.weights.tensors}
    spec = specs.get(name) or message.weights.tensors.add(name=name, dtype=pb.FLOAT32, shape=[1])
    if "shape" in changes:
        del spec.shape[:]
        spec.shape.extend(changes["shape"])
    if "dtype" in changes:
        spec.dtype = changes["dtype"]


def npy(value):
    import io

    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def set_envelope(content, **changes):
    envelope = content[ENVELOPE_KEY]
    content[ENVELOPE_KEY] = ConfigRecord({"type": envelope["type"], "message": envelope["message"], **changes})
    return content


def with_envelope_fields(**fields):
    def change(content):
        envelope = envelope_of(content)
        for name, value in fields.items():
            target = envelope.header if name == "schema_version" else envelope
            setattr(target, name, value)
        return set_envelope(content, message=envelope.SerializeToString())

    return change


def with_body_type(content, message):
    envelope = envelope_of(content)
    envelope.body.Pack(message)
    return set_envelope(content, message=envelope.SerializeToString())


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
        (lambda c: set_envelope(c, type="fedbayes.v1.Instruction"), "type", "expected fedbayes.v1.Reply"),
        (lambda c: set_envelope(c, message=b"\xff\xff\xff"), "message", "malformed"),
        (with_envelope_fields(schema_version=10), "header.schema_version", "expected 9, got 10"),
        (
            with_envelope_fields(schema_version=7),
            "header.schema_version",
            "expected 9, got 7: this fedbayes speaks schema version 9 only; run the same fedbayes",
        ),
        (with_envelope_fields(train_loss=float("nan")), "train_loss", "must be finite"),
        (
            lambda c: with_body_type(c, pb.FedPAReply()),
            "body",
            "expected fedbayes.v1.FedAvgReply, got 'fedbayes.v1.FedPAReply'",
        ),
        (
            lambda c: with_body_type(c, pb.Header()),
            "body",
            "'fedbayes.v1.Header' is no message type this process knows",
        ),
        # the manifest: what the sender declares each tensor to be
        (lambda c: with_manifest(c, "fc.bias", shape=[4]), "weights/fc.bias", "shape must be (3,), got (4,)"),
        (
            lambda c: with_manifest(c, "fc.bias", dtype=pb.FLOAT64),
            "weights/fc.bias",
            "dtype must be float32, got FLOAT64",
        ),
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
        decode(fedavg_reply(), pb.Reply, pb.FedAvgReply, {"weights": other_layout}, sender="server")


def test_encode_refuses_unknown_dtypes_and_groups():
    for dtype in (np.int32, np.float64):
        with pytest.raises(ValueError, match=f"weights/x: dtype {np.dtype(dtype)} is not in the schema"):
            encode(reply_envelope(), pb.FedAvgReply(), {"weights": {"x": np.zeros(2, dtype)}})
    with pytest.raises(ValueError, match="tensor groups"):
        encode(reply_envelope(), pb.FedAvgReply(), {"params": weights()})


def test_a_payload_of_an_older_fedbayes_is_refused_by_its_schema_version():
    """Schema version 6 sent a strategy's message bare (its header in field 1), not in an envelope: told so."""
    old = RecordDict(
        {
            ENVELOPE_KEY: ConfigRecord(
                {
                    "type": "fedbayes.v1.FedAvgReply",
                    "message": pb.LeaveAndForget(
                        header=pb.Header(schema_version=6, federation="fed", server_round=1, client_id="client-7")
                    ).SerializeToString(),
                }
            )
        }
    )
    for read in (decode_reply, lambda content: decode_header(content, "client 'client-7' (node 42)")):
        with pytest.raises(
            PayloadError,
            match="field 'header.schema_version': 6, but this fedbayes speaks schema version "
            "9, whose payloads are envelopes .*run the same fedbayes",
        ):
            read(old)


def test_a_peer_of_schema_version_7_is_told_its_version_not_that_its_payloads_are_no_envelopes():
    """Version 7's payloads are envelopes already (of the same names): one of an unexpected kind is refused as such,
    and one of the expected kind by its version."""
    instruction = encode(pb.Instruction(header=pb.Header(schema_version=7, federation="fed")), pb.FedAvgReply(), {})
    with pytest.raises(PayloadError, match="field 'type': expected fedbayes.v1.Reply, got 'fedbayes.v1.Instruction'"):
        decode_reply(instruction)
    reply = encode(pb.Reply(header=pb.Header(schema_version=7, federation="fed")), pb.FedAvgReply(), {})
    for read in (decode_reply, lambda content: decode_header(content, "client 'client-7' (node 42)")):
        with pytest.raises(PayloadError, match="'header.schema_version': expected 9, got 7: .*run the same fedbayes"):
            read(reply)


def ping_type(package: str, name: str = "Ping"):
    """A message type `<package>.<name> { double level = 1; }` of a .proto of its own (in a descriptor pool of its
    own), as a plugin's would be."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name=f"{package}/ping.proto", package=package, syntax="proto3")
    proto.message_type.add(name=name).field.add(
        name="level",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))


def test_a_body_type_decodes_once_registered_and_a_name_means_one_type():
    ping = ping_type("plugin.registry")
    content = encode(reply_envelope(), ping(level=0.5), {})
    with pytest.raises(PayloadError, match="'plugin.registry.Ping' is no message type this process knows"):
        decode(content, pb.Reply, ping, {}, sender="client-7")
    register_message_types(ping)
    assert decode(content, pb.Reply, ping, {}, sender="client-7").message.level == 0.5
    register_message_types(ping)  # the same type again: nothing changes
    assert decode(content, pb.Reply, ping, {}, sender="client-7").message.level == 0.5


@pytest.mark.parametrize("twin", ["another file", "the same file name"])
def test_a_name_registered_twice_is_an_error_naming_both_sources(twin):
    """A second class under a registered name, from a .proto file of another name or of the same name (another
    plugin's file that happens to be named alike, loaded into a pool of its own): the error names both, and the
    first stays registered."""
    ping = ping_type(f"plugin.twice.{twin.replace(' ', '_')}")
    register_message_types(ping)
    other = _renamed_file(ping) if twin == "another file" else ping_type(ping.DESCRIPTOR.file.package)
    assert other is not ping and other.DESCRIPTOR.full_name == ping.DESCRIPTOR.full_name
    with pytest.raises(ValueError) as error:
        register_message_types(other)
    message = str(error.value)
    assert (
        f"message type {ping.DESCRIPTOR.full_name} of {other.DESCRIPTOR.file.name} is registered already, " in message
    )
    assert f"as the type of {ping.DESCRIPTOR.file.name}: one name" in message
    content = encode(reply_envelope(), ping(level=0.25), {})
    assert decode(content, pb.Reply, ping, {}, sender="client-7").message.level == 0.25


def test_the_built_in_messages_register_again_as_a_no_op_and_a_plugin_may_not_shadow_them():
    register_message_types(pb.FedAvgReply, pb.DSVGDForgetInstruction)  # as the built-in strategies' halves do
    with pytest.raises(
        ValueError,
        match="fedbayes.v1.FedAvgReply of fedbayes.v1/ping.proto is registered already, as "
        "the type of fedbayes/protos/payloads.proto \\(module fedbayes.protos.payloads_pb2\\)",
    ):
        register_message_types(ping_type("fedbayes.v1", "FedAvgReply"))


@pytest.mark.parametrize(
    "name", ["Reply", "Instruction", "LeaveAndForget", "Header", "TensorGroup", "TensorSpec", "LocalTraining"]
)
def test_the_envelopes_names_are_reserved(name):
    """common.proto's names are the envelope's: neither its own classes nor a plugin's of the same name may be a
    body's type, and a body of that name stays unknown."""
    for message_type in (getattr(pb, name), ping_type("fedbayes.v1", name)):
        with pytest.raises(
            ValueError,
            match=f"fedbayes.v1.{name} of .*: the name is reserved, a type of fedbayes' "
            "envelope \\(fedbayes/protos/common.proto\\)",
        ):
            register_message_types(message_type)
    content = encode(reply_envelope(), ping_type("fedbayes.v1", name)(level=1.0), {})
    with pytest.raises(PayloadError, match=f"'fedbayes.v1.{name}' is no message type this process knows"):
        decode(content, pb.Reply, pb.FedAvgReply, {}, sender="client-7")


def _renamed_file(message_type):
    """A type of the same full name from another .proto file: another strategy's message under a taken name."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto()
    message_type.DESCRIPTOR.file.CopyToProto(proto)
    proto.name = "elsewhere/ping.proto"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(message_type.DESCRIPTOR.full_name))


def test_generated_code_is_current(tmp_path):
    protos = ["fedbayes/protos/common.proto", "fedbayes/protos/payloads.proto"]
    assert (
        protoc.main(
            [
                "protoc",
                f"-I{ROOT}",
                f"-I{protoc._get_resource_file_name('grpc_tools', '_proto')}",
                f"--python_out={tmp_path}",
                f"--pyi_out={tmp_path}",
                *(str(ROOT / p) for p in protos),
            ]
        )
        == 0
    )
    for proto in protos:
        for generated in (proto.replace(".proto", "_pb2.py"), proto.replace(".proto", "_pb2.pyi")):
            assert (tmp_path / generated).read_text() == (ROOT / generated).read_text(), (
                f"{generated} is stale: run `make protos`"
            )


def test_payload_size_counts_every_record_value_and_key():
    from fedbayes.protos.codec import payload_bytes

    array = Array(np.zeros(15, np.float32))
    content = RecordDict(
        {
            "t": ArrayRecord({"a": array}),
            "c": ConfigRecord(
                {"b": b"xyz", "s": "h\u00e9", "n": 3, "f": 0.5, "y": True, "l": [b"ab", b"c"], "w": ["\u00e9"]}
            ),
            "m": MetricRecord({"x": 1.5, "v": [1, 2, 3]}),
        }
    )
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


@pytest.mark.parametrize(
    "pad",
    [
        lambda c: c.__setitem__("extra", ConfigRecord({"pad": b"\0" * PAD})),
        lambda c: c[ENVELOPE_KEY].__setitem__("pad", "x" * PAD),  # an extra key of the envelope
        lambda c: c.__setitem__(TIMINGS_KEY, ConfigRecord({"setup": 0.1, "pad": b"\0" * PAD})),
        lambda c: c.__setitem__("metrics", MetricRecord({"pad": [0.0] * (PAD // 8)})),
        lambda c: c.__setitem__("extra", ArrayRecord({"pad": Array(np.zeros(PAD // 4, np.float32))})),
    ],
    ids=["config-record", "envelope-key", "timings", "metric-record", "array-record"],
)
def test_a_pad_in_any_record_counts_toward_the_limit(pad):
    from fedbayes.protos.codec import check_payload_size

    content = fedavg_reply()
    check_payload_size(content, max_mb=1.0, sender="client 'client-7' (node 42)")
    pad(content)
    with pytest.raises(
        PayloadError,
        match=r"client 'client-7' \(node 42\): payload is 2\.0 MiB, over the limit "
        r"max-payload-mb=1$",
    ):
        check_payload_size(content, max_mb=1.0, sender="client 'client-7' (node 42)")
