"""Encode/decode fedbayes payloads (protos/payloads.proto) to and from Flower RecordDicts.

A payload is a protobuf message (in the ENVELOPE_KEY ConfigRecord) plus one ArrayRecord, TENSORS_KEY, whose one
float32 Array holds every tensor of the payload: the message's TensorGroup manifests (names, dtypes, shapes) say
which slice is which. `decode` rejects anything that does not match the schema *and* the receiver's
expectation (names, dtypes, shapes, finiteness, schema version, message type) with a
PayloadError that names the sender and the offending field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message as ProtoMessage

from fedbayes.protos import payloads_pb2 as pb

ENVELOPE_KEY = "fedbayes"
TIMINGS_KEY = "fedbayes-timings"  # optional ConfigRecord of a reply: the client's phase seconds (measurement only)
MAX_TIMINGS = 16
NUMBER_BYTES = 8  # what payload_bytes counts for an int, float or bool of a config or metric record
CURRENT_SCHEMA_VERSION = max(pb.SchemaVersion.values())

# Every tensor of a payload rides in one Array: Flower sends each Array, ArrayRecord and chunk as an object of its
# own, one request per hop (ServerApp -> SuperLink -> SuperNode -> ClientApp and back), so a BayesADMM reply with
# one Array per tensor was ~60 objects, and moving them cost a 10-client round more CPU than the clients' training
# beyond what one process needs (README, "Performance").
TENSORS_KEY = "fedbayes-tensors"
PACKED_ARRAY = "float32"

# What a receiver expects in one tensor group: ordered name -> shape (float32 unless stated).
TensorLayout = Mapping[str, tuple[int, ...]]
Tensors = dict[str, np.ndarray]
M = TypeVar("M", bound=ProtoMessage)


class PayloadError(ValueError):
    """A payload does not match the wire schema or what the receiver expects."""


@dataclass
class Payload(Generic[M]):
    message: M
    tensors: dict[str, Tensors]  # tensor group field name -> ordered name -> array


def tensor_group_fields(message_type: type[ProtoMessage]) -> list[str]:
    """Names of the message's top-level TensorGroup fields, in field order."""
    return [
        field.name
        for field in message_type.DESCRIPTOR.fields
        if field.type == FieldDescriptor.TYPE_MESSAGE
        and field.message_type.full_name == pb.TensorGroup.DESCRIPTOR.full_name
    ]


def new_header(federation: str, server_round: int, client_id: str = "") -> pb.Header:
    return pb.Header(
        schema_version=CURRENT_SCHEMA_VERSION,
        federation=federation,
        server_round=server_round,
        client_id=client_id,
    )


def encode(message: ProtoMessage, tensors: Mapping[str, Mapping[str, np.ndarray]]) -> RecordDict:
    """Fill the message's TensorGroup manifests from `tensors` and pack everything: the tensors, raveled and
    concatenated in field order and each group's order, become the one Array of the TENSORS_KEY record."""
    groups = tensor_group_fields(type(message))
    if not set(tensors) <= set(groups):
        raise ValueError(
            f"{type(message).__name__} has tensor groups {groups}, got {sorted(tensors)}"
        )
    parts = []
    for group in groups:  # a group not given is sent empty
        manifest = getattr(message, group)
        del manifest.tensors[:]
        for name, value in tensors.get(group, {}).items():
            value = np.asarray(value)
            if value.dtype != np.float32:
                raise ValueError(f"{group}/{name}: dtype {value.dtype} is not in the schema (float32 only)")
            manifest.tensors.add(name=name, dtype=pb.FLOAT32, shape=value.shape)
            parts.append(value.ravel())
    packed = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    return with_envelope(RecordDict({TENSORS_KEY: ArrayRecord({PACKED_ARRAY: Array(packed)})}), message)


def with_envelope(content: RecordDict, message: ProtoMessage) -> RecordDict:
    """`content` (as `encode` packed it) with `message` as its envelope, sharing the tensor records: one
    instruction's tensors go to every node, each with its own header."""
    records: dict[str, ArrayRecord | ConfigRecord] = dict(content.array_records)
    records[ENVELOPE_KEY] = ConfigRecord(
        {"type": message.DESCRIPTOR.full_name, "message": message.SerializeToString()}
    )
    return RecordDict(records)


def decode(
    content: RecordDict,
    message_type: type[M],
    layouts: Mapping[str, TensorLayout] | Callable[[M], Mapping[str, TensorLayout]],
    sender: str,
) -> Payload[M]:
    """Parse and validate a payload; `layouts` gives the expected layout of every tensor group (one it leaves
    out must be empty), or computes it from the parsed message (when a scalar in it, e.g. a family or a particle
    count, decides the shapes)."""
    message = _parse_envelope(content, message_type, sender)
    if callable(layouts):
        layouts = layouts(message)
    unexpected = set(content.keys()) - {TENSORS_KEY, ENVELOPE_KEY, TIMINGS_KEY}
    if unexpected:
        raise PayloadError(f"{sender}: unexpected records {sorted(unexpected)} in {message_type.__name__}")
    groups = tensor_group_fields(message_type)
    specs = [(group, name, shape) for group in groups
             for name, shape in _checked_manifest(getattr(message, group), layouts.get(group, {}), group, sender)]
    packed = _packed_array(content, sum(math.prod(shape) for _, _, shape in specs), sender)
    tensors: dict[str, Tensors] = {group: {} for group in groups}
    offset = 0
    for group, name, shape in specs:
        value = packed[offset:offset + math.prod(shape)].reshape(shape)  # a view: no copy
        if not np.isfinite(value).all():
            raise PayloadError(f"{sender}: field '{group}/{name}': contains NaN or Inf")
        tensors[group][name] = value
        offset += value.size
    _check_finite_scalars(message, sender, prefix="")
    return Payload(message, tensors)


def reply_timings(content: RecordDict) -> dict[str, float]:
    """The phase seconds a reply reports (TIMINGS_KEY), for the round's timing report only: nothing in training
    depends on them, so anything malformed is dropped, never an error."""
    record = content.config_records.get(TIMINGS_KEY)
    if record is None or len(record) > MAX_TIMINGS:
        return {}
    return {name[:32]: float(value) for name, value in record.items()
            if isinstance(value, float) and math.isfinite(value) and 0.0 <= value < 1e6}


def payload_bytes(content: RecordDict) -> int:
    """Bytes a payload carries, every record counted (tensors, envelope, timings, and anything else a sender put in):
    every Array's .npy bytes and declared dtype, stype and shape, every config and metric value, every key. What
    a receiver holds in memory before it can decode anything, so what `max-payload-mb` bounds."""
    return sum(_text_bytes(name) + _record_bytes(record) for name, record in content.items())


def _record_bytes(record: ArrayRecord | ConfigRecord | MetricRecord) -> int:
    if isinstance(record, ArrayRecord):
        return sum(_text_bytes(key) + _array_bytes(array) for key, array in record.items())
    if isinstance(record, (ConfigRecord, MetricRecord)):
        return sum(_text_bytes(key) + _value_bytes(value) for key, value in record.items())
    raise TypeError(f"a RecordDict holds no {type(record).__name__}")


def _array_bytes(array: Array) -> int:
    return len(array.data) + _text_bytes(array.dtype) + _text_bytes(array.stype) + NUMBER_BYTES * len(array.shape)


def _value_bytes(value: object) -> int:
    """A config or metric value's bytes: its own for bytes and str, NUMBER_BYTES per number (int, float, bool, as
    Flower's wire format stores them, at most), the sum of its items' for a list."""
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, str):
        return _text_bytes(value)
    if isinstance(value, (int, float)):  # bool is an int
        return NUMBER_BYTES
    if isinstance(value, list):
        return sum(_value_bytes(item) for item in value)
    raise TypeError(f"a config or metric record holds no {type(value).__name__}")


def _text_bytes(text: str) -> int:
    """UTF-8 length, without copying an ASCII string (a padded one may be hundreds of MiB)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def check_payload_size(content: RecordDict, max_mb: float, sender: str) -> None:
    """Reject a payload over the configured limit (run config `max-payload-mb`) before decoding it."""
    size = payload_bytes(content)
    if size > max_mb * 2**20:
        raise PayloadError(f"{sender}: payload is {size / 2**20:.1f} MiB, over the limit max-payload-mb={max_mb:g}")


def claimed_client_id(content: RecordDict, message_type: type[ProtoMessage]) -> str | None:
    """The client id a payload claims in its header, without validating anything else (for error
    messages about payloads that fail validation)."""
    try:
        message = message_type.FromString(content.config_records[ENVELOPE_KEY]["message"])
    except Exception:  # any malformation: there is simply no claim to report
        return None
    return message.header.client_id or None


def envelope_type(content: RecordDict) -> str | None:
    """The full name of the message type a payload declares, unchecked (None: it declares none)."""
    envelope = content.config_records.get(ENVELOPE_KEY)
    declared = None if envelope is None else envelope.get("type")
    return declared if isinstance(declared, str) else None


def decode_header(content: RecordDict, sender: str) -> pb.Header:
    """The header of a payload of any fedbayes message type, checked as `decode` checks it (schema version, a
    known type), without its tensors: for a receiver that answers without reading them."""
    declared = envelope_type(content) or ""
    name = declared.removeprefix(f"{pb.DESCRIPTOR.package}.")
    descriptor = pb.DESCRIPTOR.message_types_by_name.get(name) if name != declared else None
    if descriptor is None or "header" not in descriptor.fields_by_name:
        raise PayloadError(f"{sender}: field 'type': {declared[:64]!r} is no fedbayes message with a header")
    return _parse_envelope(content, getattr(pb, descriptor.name), sender).header


def _parse_envelope(content: RecordDict, message_type: type[M], sender: str) -> M:
    expected = message_type.DESCRIPTOR.full_name
    envelope = content.config_records.get(ENVELOPE_KEY)
    if envelope is None:
        raise PayloadError(f"{sender}: missing '{ENVELOPE_KEY}' record; not a fedbayes payload")
    if envelope.get("type") != expected:
        raise PayloadError(f"{sender}: field 'type': expected {expected}, got {envelope.get('type')!r}")
    raw = envelope.get("message")
    if not isinstance(raw, bytes):
        raise PayloadError(f"{sender}: field 'message': expected protobuf bytes")
    message = message_type()
    try:
        message.ParseFromString(raw)
    except DecodeError as error:
        raise PayloadError(f"{sender}: field 'message': malformed {expected}: {error}") from None
    version = message.header.schema_version
    if version != CURRENT_SCHEMA_VERSION:
        raise PayloadError(
            f"{sender}: field 'header.schema_version': expected {CURRENT_SCHEMA_VERSION}, got {version}"
        )
    return message


def _checked_manifest(
    manifest: pb.TensorGroup, layout: TensorLayout, group: str, sender: str
) -> list[tuple[str, tuple[int, ...]]]:
    """The group's (name, shape) pairs in order, once its manifest declares exactly the expected tensors."""
    declared = [spec.name for spec in manifest.tensors]
    if declared != list(layout):
        raise PayloadError(f"{sender}: field '{group}': tensor names {declared} do not match expected {list(layout)}")
    for spec in manifest.tensors:
        where = f"{sender}: field '{group}/{spec.name}'"
        if spec.dtype != pb.FLOAT32:
            got = pb.DType.Name(spec.dtype) if spec.dtype in pb.DType.values() else spec.dtype  # an open enum
            raise PayloadError(f"{where}: dtype must be float32, got {got}")
        if tuple(spec.shape) != tuple(layout[spec.name]):
            raise PayloadError(f"{where}: shape must be {tuple(layout[spec.name])}, got {tuple(spec.shape)}")
    return [(name, tuple(shape)) for name, shape in layout.items()]


def _packed_array(content: RecordDict, size: int, sender: str) -> np.ndarray:
    """The one float32 array of `size` values that holds every tensor, checked as declared and as decoded."""
    where = f"{sender}: field '{TENSORS_KEY}'"
    record = content.array_records.get(TENSORS_KEY)
    if record is None:
        raise PayloadError(f"{where}: missing ArrayRecord")
    if list(record.keys()) != [PACKED_ARRAY]:
        raise PayloadError(f"{where}: expected one array '{PACKED_ARRAY}', got {list(record.keys())}")
    array = record[PACKED_ARRAY]
    if array.dtype != "float32" or tuple(array.shape) != (size,):
        raise PayloadError(f"{where}: declared {array.dtype} {tuple(array.shape)}, but the manifests describe "
                           f"float32 ({size},)")
    return _decoded_array(array, (size,), where)


def _decoded_array(array: Array, expected_shape: tuple[int, ...], where: str) -> np.ndarray:
    """The array the bytes really hold, checked again: an Array's dtype and shape are only what its sender
    declared, and its bytes are an .npy file that may say otherwise (unicode, complex, bool, an .npz...)."""
    try:
        value = array.numpy()
    except Exception as error:  # corrupt .npy bytes: np.load raises many kinds of errors
        raise PayloadError(f"{where}: unreadable array data: {type(error).__name__}: {error}") from None
    if not isinstance(value, np.ndarray):
        raise PayloadError(f"{where}: array data is a {type(value).__name__}, not one array")
    if value.dtype != np.float32:
        raise PayloadError(f"{where}: array data has dtype {value.dtype}, not float32 (declared float32)")
    if value.shape != expected_shape:
        raise PayloadError(f"{where}: array data has shape {value.shape}, not {expected_shape}")
    return value


def _check_finite_scalars(message: ProtoMessage, sender: str, prefix: str) -> None:
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            values = value if field.is_repeated else [value]
            if not all(math.isfinite(v) for v in values):
                raise PayloadError(f"{sender}: field '{name}': must be finite, got {value}")
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated:
            _check_finite_scalars(value, sender, prefix=f"{name}.")
