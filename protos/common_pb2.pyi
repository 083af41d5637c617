from google.protobuf import any_pb2 as _any_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SchemaVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEMA_VERSION_UNSPECIFIED: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_1: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_2: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_3: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_4: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_5: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_6: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_7: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_8: _ClassVar[SchemaVersion]
    SCHEMA_VERSION_9: _ClassVar[SchemaVersion]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
SCHEMA_VERSION_UNSPECIFIED: SchemaVersion
SCHEMA_VERSION_1: SchemaVersion
SCHEMA_VERSION_2: SchemaVersion
SCHEMA_VERSION_3: SchemaVersion
SCHEMA_VERSION_4: SchemaVersion
SCHEMA_VERSION_5: SchemaVersion
SCHEMA_VERSION_6: SchemaVersion
SCHEMA_VERSION_7: SchemaVersion
SCHEMA_VERSION_8: SchemaVersion
SCHEMA_VERSION_9: SchemaVersion
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TensorGroup(_message.Message):
    __slots__ = ("tensors",)
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("schema_version", "federation", "server_round", "client_id", "accepted_rounds", "checkpointed_rounds", "forgotten_client_id", "nonce")
    class AcceptedRoundsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class CheckpointedRoundsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    FEDERATION_FIELD_NUMBER: _ClassVar[int]
    SERVER_ROUND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTED_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    schema_version: SchemaVersion
    federation: str
    server_round: int
    client_id: str
    accepted_rounds: _containers.ScalarMap[str, int]
    checkpointed_rounds: _containers.ScalarMap[str, int]
    forgotten_client_id: str
    nonce: bytes
    def __init__(self, schema_version: _Optional[_Union[SchemaVersion, str]] = ..., federation: _Optional[str] = ..., server_round: _Optional[int] = ..., client_id: _Optional[str] = ..., accepted_rounds: _Optional[_Mapping[str, int]] = ..., checkpointed_rounds: _Optional[_Mapping[str, int]] = ..., forgotten_client_id: _Optional[str] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class LocalTraining(_message.Message):
    __slots__ = ("epochs", "batch_size", "learning_rate", "optimizer", "weight_decay", "seed")
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    epochs: int
    batch_size: int
    learning_rate: float
    optimizer: str
    weight_decay: float
    seed: int
    def __init__(self, epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., optimizer: _Optional[str] = ..., weight_decay: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class Instruction(_message.Message):
    __slots__ = ("header", "buffers", "body", "client_evaluation")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_EVALUATION_FIELD_NUMBER: _ClassVar[int]
    header: Header
    buffers: TensorGroup
    body: _any_pb2.Any
    client_evaluation: ClientEvaluationRequest
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ..., body: _Optional[_Union[_any_pb2.Any, _Mapping]] = ..., client_evaluation: _Optional[_Union[ClientEvaluationRequest, _Mapping]] = ...) -> None: ...

class ClientEvaluationRequest(_message.Message):
    __slots__ = ("fraction", "seed")
    FRACTION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    fraction: float
    seed: int
    def __init__(self, fraction: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class HeldOutMetrics(_message.Message):
    __slots__ = ("accuracy", "nll", "ece")
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    NLL_FIELD_NUMBER: _ClassVar[int]
    ECE_FIELD_NUMBER: _ClassVar[int]
    accuracy: float
    nll: float
    ece: float
    def __init__(self, accuracy: _Optional[float] = ..., nll: _Optional[float] = ..., ece: _Optional[float] = ...) -> None: ...

class ClientEvaluation(_message.Message):
    __slots__ = ("examples", "global_model", "local_posterior")
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_MODEL_FIELD_NUMBER: _ClassVar[int]
    LOCAL_POSTERIOR_FIELD_NUMBER: _ClassVar[int]
    examples: int
    global_model: HeldOutMetrics
    local_posterior: HeldOutMetrics
    def __init__(self, examples: _Optional[int] = ..., global_model: _Optional[_Union[HeldOutMetrics, _Mapping]] = ..., local_posterior: _Optional[_Union[HeldOutMetrics, _Mapping]] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("header", "buffers", "num_examples", "train_loss", "compute_seconds", "resumed_from_round", "body", "evaluation")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    header: Header
    buffers: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    resumed_from_round: int
    body: _any_pb2.Any
    evaluation: ClientEvaluation
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., resumed_from_round: _Optional[int] = ..., body: _Optional[_Union[_any_pb2.Any, _Mapping]] = ..., evaluation: _Optional[_Union[ClientEvaluation, _Mapping]] = ...) -> None: ...

class LeaveAndForget(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...
