"""Encode/decode fedbayes payloads (protos/common.proto, protos/payloads.proto) to and from Flower RecordDicts.

A payload is an envelope (protos/common.proto: an Instruction, a Reply or a LeaveAndForget, in the ENVELOPE_KEY
ConfigRecord) holding what every strategy shares and, as its `body`, the strategy's own message; plus one ArrayRecord,
TENSORS_KEY, whose one float32 Array holds every tensor of both: their TensorGroup manifests (names, dtypes, shapes)
say which slice is which. `decode` rejects anything that does not match the schema *and* the receiver's expectation
(names, dtypes, shapes, finiteness, schema version, envelope and body type) with a PayloadError that names the sender
and the offending field.

Body types are looked up by their full name in a registry: the built-in strategies' (protos/payloads.proto) are
registered here, a strategy's server and client halves register their own message types when they are defined
(ServerStrategy.reply_type, ClientHalf.instruction_type), and `register_message_types` adds any others.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Generic, NoReturn, TypeVar, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.params import TensorLayout, Tensors
from fedbayes.protos import common_pb2
from fedbayes.protos import payloads_pb2 as pb

ENVELOPE_KEY = "fedbayes"
TIMINGS_KEY = "fedbayes-timings"  # optional ConfigRecord of a reply: the client's phase seconds (measurement only)
MAX_TIMINGS = 16
NUMBER_BYTES = 8  # what payload_bytes counts for an int, float or bool of a config or metric record
CURRENT_SCHEMA_VERSION = max(pb.SchemaVersion.values())
NONCE_BYTES = 16  # Header.nonce: 128 random bits, which no client can guess before its instruction comes
ENVELOPES: tuple[type[ProtoMessage], ...] = (pb.Instruction, pb.Reply, pb.LeaveAndForget)
Envelope = pb.Instruction | pb.Reply | pb.LeaveAndForget

# Every tensor of a payload rides in one Array: Flower sends each Array, ArrayRecord and chunk as an object of its
# own, one request per hop (ServerApp -> SuperLink -> SuperNode -> ClientApp and back), so a BayesADMM reply with
# one Array per tensor was ~60 objects, and moving them cost a 10-client round more CPU than the clients' training
# beyond what one process needs (README, "Performance").
TENSORS_KEY = "fedbayes-tensors"
PACKED_ARRAY = "float32"

M = TypeVar("M", bound=ProtoMessage)
E = TypeVar("E", pb.Instruction, pb.Reply, pb.LeaveAndForget)
Layouts = Mapping[str, TensorLayout]


class PayloadError(ValueError):
    """A payload does not match the wire schema or what the receiver expects."""


@dataclass
class Payload(Generic[M]):
    """A decoded payload: its envelope (the fields every strategy shares), the strategy's message (its envelope's
    body; the envelope itself for a LeaveAndForget), and every tensor, by group: the message's TensorGroup fields
    and the envelope's (`buffers`)."""

    envelope: Envelope
    message: M
    tensors: dict[str, Tensors]  # tensor group field name -> ordered name -> array

    @property
    def header(self) -> pb.Header:
        return self.envelope.header

    @property
    def reply(self) -> pb.Reply:
        """A reply's envelope: num_examples, train_loss, compute_seconds, resumed_from_round."""
        if not isinstance(self.envelope, pb.Reply):
            raise TypeError(f"a {type(self.envelope).__name__} is no reply")
        return self.envelope


# ---- the message-type registry -----------------------------------------------------------------------------------
_MESSAGE_TYPES: dict[str, type[ProtoMessage]] = {}


def _declared_names(file: FileDescriptor) -> frozenset[str]:
    """The full names of every message (nested ones too) and enum a .proto file declares."""
    pending, names = (
        list(file.message_types_by_name.values()),
        {enum.full_name for enum in file.enum_types_by_name.values()},
    )
    while pending:
        message = pending.pop()
        names.add(message.full_name)
        names.update(enum.full_name for enum in message.enum_types)
        pending.extend(message.nested_types)
    return frozenset(names)


# The envelope's names (common.proto): a body of one of them would pass for the envelope's own fields.
RESERVED_NAMES = _declared_names(common_pb2.DESCRIPTOR)


def _source(message_type: type[ProtoMessage]) -> str:
    """Where a message type comes from: its .proto file and, for a generated one, its module."""
    module = getattr(message_type, "__module__", None)
    return f"{message_type.DESCRIPTOR.file.name}" + (f" (module {module})" if module else "")


def register_message_types(*message_types: type[ProtoMessage]) -> None:
    """Make these message types decodable as an envelope's body, by their full name. Registering a type again is a
    no-op (each strategy's halves register theirs as they are defined).

    Args:
        *message_types: generated protobuf message classes.

    Raises:
        ValueError: a name of the envelope's schema (RESERVED_NAMES, protos/common.proto), or a name registered
            already with another class (two strategies would mean different things by one message), naming both
            sources.
    """
    for message_type in message_types:
        name = message_type.DESCRIPTOR.full_name
        if name in RESERVED_NAMES:
            raise ValueError(
                f"message type {name} of {_source(message_type)}: the name is reserved, a type of fedbayes' "
                f"envelope ({common_pb2.DESCRIPTOR.name}), not a strategy's message; give the strategy's messages "
                "names of their own"
            )
        known = _MESSAGE_TYPES.setdefault(name, message_type)
        if known is not message_type:
            raise ValueError(
                f"message type {name} of {_source(message_type)} is registered already, as the type of "
                f"{_source(known)}: one name, one message type"
            )


def _module_message_types(module: ModuleType) -> Iterable[type[ProtoMessage]]:
    descriptor = module.DESCRIPTOR
    return [getattr(module, name) for name in descriptor.message_types_by_name]


register_message_types(*_module_message_types(pb))


def message_type_named(name: str, sender: str) -> type[ProtoMessage]:
    """The registered message type of full name `name` (`register_message_types`).

    Args:
        name: the type's full protobuf name, as a payload declares it.
        sender: who sent the payload, for the error message.

    Returns:
        The message class.

    Raises:
        PayloadError: no message type of that name is registered.
    """
    try:
        return _MESSAGE_TYPES[name]
    except KeyError:
        raise PayloadError(
            f"{sender}: field 'body': {name[:64]!r} is no message type this process knows (a strategy "
            "registers its own; is the strategy installed here?)"
        ) from None


# ---- encoding --------------------------------------------------------------------------------------------------------
def tensor_group_fields(message_type: type[ProtoMessage]) -> list[str]:
    """Names of the message's top-level TensorGroup fields, in field order.

    Args:
        message_type: a protobuf message class.

    Returns:
        The field names.
    """
    return [
        field.name
        for field in message_type.DESCRIPTOR.fields
        if field.type == FieldDescriptor.TYPE_MESSAGE
        and field.message_type.full_name == pb.TensorGroup.DESCRIPTOR.full_name
    ]


def new_header(federation: str, server_round: int, client_id: str = "") -> pb.Header:
    """A header of the current schema version for a payload of `federation`'s round `server_round`.

    Args:
        federation: the federation's name.
        server_round: the round the payload belongs to.
        client_id: the sending client's id; "" for the server.

    Returns:
        The header, without a nonce.
    """
    return pb.Header(
        schema_version=CURRENT_SCHEMA_VERSION,
        federation=federation,
        server_round=server_round,
        client_id=client_id,
    )


def reply_header(instruction: pb.Header, client_id: str) -> pb.Header:
    """The header of a client's answer (a Reply or a LeaveAndForget) to the instruction whose header is
    `instruction`: its federation, its round and its nonce (Header.nonce, which binds the answer to it), and the
    client's id.

    Args:
        instruction: the header of the instruction answered.
        client_id: the answering client's id.

    Returns:
        The answer's header.
    """
    header = new_header(instruction.federation, instruction.server_round, client_id)
    header.nonce = instruction.nonce
    return header


def encode(
    envelope: Envelope, message: ProtoMessage | None, tensors: Mapping[str, Mapping[str, np.ndarray]]
) -> RecordDict:
    """Pack a payload: fill the TensorGroup manifests of `message` (the strategy's; None for a LeaveAndForget) and of
    the envelope from `tensors` (by group field name), put `message` into the envelope's body, and pack every tensor,
    raveled and concatenated in field order (the message's groups, then the envelope's) and each group's order, into
    the one Array of the TENSORS_KEY record.

    Args:
        envelope: the envelope, its header set; its manifests and body are filled in place.
        message: the strategy's message, or None for a LeaveAndForget; its manifests are filled in place.
        tensors: float32 arrays by tensor group field name, then by tensor name, in order.

    Returns:
        The RecordDict to send: the TENSORS_KEY ArrayRecord and the ENVELOPE_KEY ConfigRecord.

    Raises:
        ValueError: a group of `tensors` is neither the message's nor the envelope's, or an array is not float32.
    """
    parts = [message] if message is not None else []
    groups = {group for part in (*parts, envelope) for group in tensor_group_fields(type(part))}
    unknown = set(tensors) - groups
    if unknown:
        raise ValueError(
            f"{type(message or envelope).__name__} and its envelope have no tensor groups {sorted(unknown)}"
        )
    packed = [value for part in (*parts, envelope) for value in _filled_manifests(part, tensors)]
    if message is not None:
        envelope.body.Pack(message)
    array = np.concatenate(packed) if packed else np.zeros(0, np.float32)
    return with_envelope(RecordDict({TENSORS_KEY: ArrayRecord({PACKED_ARRAY: Array(array)})}), envelope)


def _filled_manifests(message: ProtoMessage, tensors: Mapping[str, Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """The message's tensors in packing order, their specs written into its TensorGroup manifests (a group not given
    is sent empty)."""
    parts = []
    for group in tensor_group_fields(type(message)):
        manifest = getattr(message, group)
        del manifest.tensors[:]
        for name, value in tensors.get(group, {}).items():
            value = np.asarray(value)
            if value.dtype != np.float32:
                raise ValueError(f"{group}/{name}: dtype {value.dtype} is not in the schema (float32 only)")
            manifest.tensors.add(name=name, dtype=pb.FLOAT32, shape=value.shape)
            parts.append(value.ravel())
    return parts


def with_envelope(content: RecordDict, envelope: ProtoMessage) -> RecordDict:
    """`content` (as `encode` packed it) with `envelope` as its envelope, sharing the tensor records: one
    instruction's tensors go to every node, each with its own header.

    Args:
        content: a payload as `encode` packed it.
        envelope: the envelope to put in its place.

    Returns:
        A new RecordDict with `content`'s array records and `envelope`.
    """
    records: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = dict(content.array_records)
    records[ENVELOPE_KEY] = ConfigRecord(
        {"type": envelope.DESCRIPTOR.full_name, "message": envelope.SerializeToString()}
    )
    return RecordDict(records)


# ---- decoding --------------------------------------------------------------------------------------------------------
def decode(
    content: RecordDict,
    envelope_type: type[E],
    message_type: type[M] | None,
    layouts: Layouts | Callable[[M], Layouts],
    sender: str,
) -> Payload[M]:
    """Parse and validate a payload: an `envelope_type` envelope (pb.Instruction, pb.Reply, pb.LeaveAndForget) whose
    body is a `message_type` (None: a LeaveAndForget, which has none). `layouts` gives the expected layout of every
    tensor group of the message and the envelope (one it leaves out must be empty), or computes it from the parsed
    message (when a scalar in it, e.g. a family or a particle count, decides the shapes).

    Args:
        content: the RecordDict received.
        envelope_type: the envelope expected: pb.Instruction, pb.Reply or pb.LeaveAndForget.
        message_type: the body's message type expected, or None for a LeaveAndForget.
        layouts: the expected layout of each tensor group by field name, or a function of the parsed message to them.
        sender: who sent the payload, for the error messages.

    Returns:
        The envelope, the message and every tensor group's arrays (views of the one packed array).

    Raises:
        PayloadError: anything in `content` that does not match the schema or the expectation.

    Examples:
        A FedAvg instruction there and back, then refused where the receiver expects another shape:

        >>> w = {"fc.weight": np.ones((2, 3), np.float32), "fc.bias": np.zeros(2, np.float32)}
        >>> content = encode(pb.Instruction(header=new_header("demo", 1)), pb.FedAvgInstruction(), {"weights": w})
        >>> layout = {"weights": {"fc.weight": (2, 3), "fc.bias": (2,)}}
        >>> payload = decode(content, pb.Instruction, pb.FedAvgInstruction, layout, sender="server")
        >>> payload.header.server_round, payload.tensors["weights"]["fc.weight"].shape
        (1, (2, 3))
        >>> decode(content, pb.Instruction, pb.FedAvgInstruction, {"weights": {"fc.weight": (2, 3)}}, sender="server")
        Traceback (most recent call last):
        ...
        fedbayes.protos.codec.PayloadError: server: field 'weights': tensor names ['fc.weight', 'fc.bias'] do not match
        expected ['fc.weight']
    """
    envelope = _parse_envelope(content, envelope_type, sender)
    message = envelope if message_type is None else _body(envelope, message_type, sender)
    if callable(layouts):
        layouts = layouts(message)
    unexpected = set(content.keys()) - {TENSORS_KEY, ENVELOPE_KEY, TIMINGS_KEY}
    if unexpected:
        raise PayloadError(f"{sender}: unexpected records {sorted(unexpected)} in {envelope_type.__name__}")
    parts = [message, envelope] if message is not envelope else [envelope]
    specs = [
        (group, name, shape)
        for part in parts
        for group in tensor_group_fields(type(part))
        for name, shape in _checked_manifest(getattr(part, group), layouts.get(group, {}), group, sender)
    ]
    packed = _packed_array(content, sum(math.prod(shape) for _, _, shape in specs), sender)
    tensors: dict[str, Tensors] = {group: {} for part in parts for group in tensor_group_fields(type(part))}
    offset = 0
    for group, name, shape in specs:
        value = packed[offset : offset + math.prod(shape)].reshape(shape)  # a view: no copy
        if not np.isfinite(value).all():
            raise PayloadError(f"{sender}: field '{group}/{name}': contains NaN or Inf")
        tensors[group][name] = value
        offset += value.size
    for part in parts:
        _check_finite_scalars(part, sender, prefix="")
    return Payload(envelope, message, tensors)


def _body(envelope: pb.Instruction | pb.Reply, message_type: type[M], sender: str) -> M:
    """The envelope's body: a registered message type, the one the receiver expects, well-formed."""
    expected = message_type.DESCRIPTOR.full_name
    declared = envelope.body.TypeName()
    if declared != expected:
        message_type_named(declared, sender)  # an unknown type is named as such
        raise PayloadError(f"{sender}: field 'body': expected {expected}, got {declared[:64]!r}")
    # the class registered under the expected name (one name, one class: register_message_types)
    message = cast(M, message_type_named(declared, sender)())
    try:
        if not envelope.body.Unpack(message):
            raise DecodeError("the body does not unpack")
    except DecodeError as error:
        raise PayloadError(f"{sender}: field 'body': malformed {expected}: {error}") from None
    return message


def reply_timings(content: RecordDict) -> dict[str, float]:
    """The phase seconds a reply reports (TIMINGS_KEY), for the round's timing report only: nothing in training
    depends on them, so anything malformed is dropped, never an error.

    Args:
        content: a reply's RecordDict.

    Returns:
        Seconds by phase name (at most 32 characters); {} where there are none or too many.
    """
    record = content.config_records.get(TIMINGS_KEY)
    if record is None or len(record) > MAX_TIMINGS:
        return {}
    return {
        name[:32]: float(value)
        for name, value in record.items()
        if isinstance(value, float) and math.isfinite(value) and 0.0 <= value < 1e6
    }


def payload_bytes(content: RecordDict) -> int:
    """Bytes a payload carries, every record counted (tensors, envelope, timings, and anything else a sender put in):
    every Array's .npy bytes and declared dtype, stype and shape, every config and metric value, every key. What
    a receiver holds in memory before it can decode anything, so what `max-payload-mb` bounds.

    Args:
        content: a RecordDict as received.

    Returns:
        The byte count.

    Raises:
        TypeError: a record, or a config or metric value, of a type Flower's RecordDict does not hold.
    """
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
    """Reject a payload over the configured limit (run config `max-payload-mb`) before decoding it.

    Args:
        content: a RecordDict as received.
        max_mb: the limit, in MiB.
        sender: who sent the payload, for the error message.

    Raises:
        PayloadError: the payload is over `max_mb`.
        TypeError: as `payload_bytes`.
    """
    size = payload_bytes(content)
    if size > max_mb * 2**20:
        raise PayloadError(f"{sender}: payload is {size / 2**20:.1f} MiB, over the limit max-payload-mb={max_mb:g}")


def claimed_client_id(content: RecordDict) -> str | None:
    """The client id a payload claims in its header, without validating anything else (for error messages about
    payloads that fail validation).

    Args:
        content: a RecordDict as received.

    Returns:
        The claimed id, or None where the payload claims none or its envelope does not parse.
    """
    try:
        header = pb.LeaveAndForget.FromString(content.config_records[ENVELOPE_KEY]["message"]).header
    except Exception:  # any malformation: there is simply no claim to report
        return None
    return header.client_id or None


def envelope_type(content: RecordDict) -> str | None:
    """The full name of the envelope type a payload declares, unchecked (None: it declares none).

    Args:
        content: a RecordDict as received.

    Returns:
        The declared type's full name, or None.
    """
    envelope = content.config_records.get(ENVELOPE_KEY)
    declared = None if envelope is None else envelope.get("type")
    return declared if isinstance(declared, str) else None


def instruction_body_type(content: RecordDict) -> str | None:
    """The full name of the body an Instruction declares, unchecked (None: no Instruction, or one without a body): what
    a client reads to tell which of its halves answers it.

    Args:
        content: a RecordDict as received.

    Returns:
        The body's full type name, or None.
    """
    if envelope_type(content) != pb.Instruction.DESCRIPTOR.full_name:
        return None
    try:
        declared = pb.Instruction.FromString(content.config_records[ENVELOPE_KEY]["message"]).body.TypeName()
    except Exception:  # any malformation: `decode` names it once the receiver decodes the payload
        return None
    return declared or None


def decode_header(content: RecordDict, sender: str) -> pb.Header:
    """The header of a payload in any envelope, checked as `decode` checks it (schema version, a known envelope),
    without its body or tensors: for a receiver that answers without reading them.

    Args:
        content: a RecordDict as received.
        sender: who sent the payload, for the error messages.

    Returns:
        The envelope's header.

    Raises:
        PayloadError: no known envelope, a malformed one, or one of another schema version.
    """
    declared = envelope_type(content) or ""
    kind = next((envelope for envelope in ENVELOPES if envelope.DESCRIPTOR.full_name == declared), None)
    if kind is None:
        _refuse_unknown_envelope(content, declared, "an envelope", sender)
    header: pb.Header = _parse_envelope(content, kind, sender).header
    return header


def _refuse_unknown_envelope(content: RecordDict, declared: str, expected: str, sender: str) -> NoReturn:
    """Raise the PayloadError for a payload whose envelope is not `expected`: a peer of schema version 6 or older
    (whose messages were no envelopes, but began with the same Header) is told so, by version."""
    version = _old_schema_version(content)
    if version and version < pb.SCHEMA_VERSION_7:
        raise PayloadError(
            f"{sender}: field 'header.schema_version': {version}, but this fedbayes speaks schema "
            f"version {CURRENT_SCHEMA_VERSION}, whose payloads are envelopes ({declared[:64]!r} is a "
            "message of an older fedbayes): run the same fedbayes on the server and every client"
        )
    raise PayloadError(f"{sender}: field 'type': expected {expected}, got {declared[:64]!r}")


def _old_schema_version(content: RecordDict) -> int:
    """The schema version in a payload's header, read as every message since version 1 begins (a Header in field 1);
    0 when there is none."""
    try:
        return int(pb.LeaveAndForget.FromString(content.config_records[ENVELOPE_KEY]["message"]).header.schema_version)
    except Exception:  # anything else: no version to report
        return 0


def _parse_envelope(content: RecordDict, envelope_type: type[E], sender: str) -> E:
    expected = envelope_type.DESCRIPTOR.full_name
    record = content.config_records.get(ENVELOPE_KEY)
    if record is None:
        raise PayloadError(f"{sender}: missing '{ENVELOPE_KEY}' record; not a fedbayes payload")
    if record.get("type") != expected:
        _refuse_unknown_envelope(content, str(record.get("type")), expected, sender)
    raw = record.get("message")
    if not isinstance(raw, bytes):
        raise PayloadError(f"{sender}: field 'message': expected protobuf bytes")
    envelope = envelope_type()
    try:
        envelope.ParseFromString(raw)
    except DecodeError as error:
        raise PayloadError(f"{sender}: field 'message': malformed {expected}: {error}") from None
    version = envelope.header.schema_version
    if version != CURRENT_SCHEMA_VERSION:
        raise PayloadError(
            f"{sender}: field 'header.schema_version': expected {CURRENT_SCHEMA_VERSION}, got {version}: this "
            f"fedbayes speaks schema version {CURRENT_SCHEMA_VERSION} only; run the same fedbayes on the server "
            "and every client"
        )
    return envelope


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
        raise PayloadError(
            f"{where}: declared {array.dtype} {tuple(array.shape)}, but the manifests describe float32 ({size},)"
        )
    return _decoded_array(array, (size,), where)


def _decoded_array(array: Array, expected_shape: tuple[int, ...], where: str) -> np.ndarray:
    """The array the bytes really hold, checked again: an Array's dtype and shape are only what its sender
    declared, and its bytes are an .npy file that may say otherwise (unicode, complex, bool, an .npz...)."""
    problem = _npy_header_problem(array.data)
    if problem:
        raise PayloadError(f"{where}: array data {problem}")
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


def _npy_header_problem(data: bytes) -> str | None:
    """What is wrong with the size the .npy header of `data` declares, or None (also for bytes that are no .npy file:
    numpy names those): checked before numpy reads the array, which allocates what the header declares before it
    finds that the bytes hold less."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
    except Exception:  # corrupt .npy bytes: its header parser raises many kinds of errors
        return None
    declared, held = math.prod(shape) * dtype.itemsize, len(data) - stream.tell()
    if declared != held:
        return f"declares {dtype} {tuple(shape)} ({declared} bytes), but holds {held} bytes after its header"
    return None


def _check_finite_scalars(message: ProtoMessage, sender: str, prefix: str) -> None:
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            values = value if field.is_repeated else [value]
            if not all(math.isfinite(v) for v in values):
                raise PayloadError(f"{sender}: field '{name}': must be finite, got {value}")
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated:
            _check_finite_scalars(value, sender, prefix=f"{name}.")
