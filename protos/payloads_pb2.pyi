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
    __slots__ = ("schema_version", "federation", "server_round", "client_id", "accepted_rounds", "checkpointed_rounds", "forgotten_client_id")
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
    schema_version: SchemaVersion
    federation: str
    server_round: int
    client_id: str
    accepted_rounds: _containers.ScalarMap[str, int]
    checkpointed_rounds: _containers.ScalarMap[str, int]
    forgotten_client_id: str
    def __init__(self, schema_version: _Optional[_Union[SchemaVersion, str]] = ..., federation: _Optional[str] = ..., server_round: _Optional[int] = ..., client_id: _Optional[str] = ..., accepted_rounds: _Optional[_Mapping[str, int]] = ..., checkpointed_rounds: _Optional[_Mapping[str, int]] = ..., forgotten_client_id: _Optional[str] = ...) -> None: ...

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

class FedAvgInstruction(_message.Message):
    __slots__ = ("header", "weights", "training", "proximal_mu", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    PROXIMAL_MU_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    weights: TensorGroup
    training: LocalTraining
    proximal_mu: float
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., weights: _Optional[_Union[TensorGroup, _Mapping]] = ..., training: _Optional[_Union[LocalTraining, _Mapping]] = ..., proximal_mu: _Optional[float] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedAvgReply(_message.Message):
    __slots__ = ("header", "weights", "num_examples", "train_loss", "compute_seconds", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    weights: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., weights: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class BayesADMMInstruction(_message.Message):
    __slots__ = ("header", "global_mean", "global_precision", "training", "rho", "dual_step", "temperature", "hess_init", "beta1", "beta2", "mc_samples", "rescale_lr", "reset_posterior", "shared_noise", "noise_seed", "family", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    RHO_FIELD_NUMBER: _ClassVar[int]
    DUAL_STEP_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    HESS_INIT_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    MC_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    RESCALE_LR_FIELD_NUMBER: _ClassVar[int]
    RESET_POSTERIOR_FIELD_NUMBER: _ClassVar[int]
    SHARED_NOISE_FIELD_NUMBER: _ClassVar[int]
    NOISE_SEED_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    global_mean: TensorGroup
    global_precision: TensorGroup
    training: LocalTraining
    rho: float
    dual_step: float
    temperature: float
    hess_init: float
    beta1: float
    beta2: float
    mc_samples: int
    rescale_lr: bool
    reset_posterior: bool
    shared_noise: bool
    noise_seed: int
    family: str
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., global_mean: _Optional[_Union[TensorGroup, _Mapping]] = ..., global_precision: _Optional[_Union[TensorGroup, _Mapping]] = ..., training: _Optional[_Union[LocalTraining, _Mapping]] = ..., rho: _Optional[float] = ..., dual_step: _Optional[float] = ..., temperature: _Optional[float] = ..., hess_init: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., mc_samples: _Optional[int] = ..., rescale_lr: _Optional[bool] = ..., reset_posterior: _Optional[bool] = ..., shared_noise: _Optional[bool] = ..., noise_seed: _Optional[int] = ..., family: _Optional[str] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class BayesADMMReply(_message.Message):
    __slots__ = ("header", "local_mean", "local_precision", "dual_mean", "dual_precision", "num_examples", "train_loss", "compute_seconds", "resumed_from_round", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LOCAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    DUAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    DUAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    local_mean: TensorGroup
    local_precision: TensorGroup
    dual_mean: TensorGroup
    dual_precision: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    resumed_from_round: int
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., local_mean: _Optional[_Union[TensorGroup, _Mapping]] = ..., local_precision: _Optional[_Union[TensorGroup, _Mapping]] = ..., dual_mean: _Optional[_Union[TensorGroup, _Mapping]] = ..., dual_precision: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., resumed_from_round: _Optional[int] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedDynInstruction(_message.Message):
    __slots__ = ("header", "global_weights", "training", "alpha", "known_clients", "known_examples", "max_grad_norm", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    global_weights: TensorGroup
    training: LocalTraining
    alpha: float
    known_clients: int
    known_examples: int
    max_grad_norm: float
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., global_weights: _Optional[_Union[TensorGroup, _Mapping]] = ..., training: _Optional[_Union[LocalTraining, _Mapping]] = ..., alpha: _Optional[float] = ..., known_clients: _Optional[int] = ..., known_examples: _Optional[int] = ..., max_grad_norm: _Optional[float] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedDynReply(_message.Message):
    __slots__ = ("header", "weights", "num_examples", "train_loss", "compute_seconds", "resumed_from_round", "lambda_sketch", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_SKETCH_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    weights: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    resumed_from_round: int
    lambda_sketch: _containers.RepeatedScalarFieldContainer[float]
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., weights: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., resumed_from_round: _Optional[int] = ..., lambda_sketch: _Optional[_Iterable[float]] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedLapInstruction(_message.Message):
    __slots__ = ("header", "global_mean", "global_precision", "training", "prior_precision", "known_clients", "known_examples", "initial_share", "max_grad_norm", "covariance", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    PRIOR_PRECISION_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    INITIAL_SHARE_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    COVARIANCE_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    global_mean: TensorGroup
    global_precision: TensorGroup
    training: LocalTraining
    prior_precision: float
    known_clients: int
    known_examples: int
    initial_share: float
    max_grad_norm: float
    covariance: bool
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., global_mean: _Optional[_Union[TensorGroup, _Mapping]] = ..., global_precision: _Optional[_Union[TensorGroup, _Mapping]] = ..., training: _Optional[_Union[LocalTraining, _Mapping]] = ..., prior_precision: _Optional[float] = ..., known_clients: _Optional[int] = ..., known_examples: _Optional[int] = ..., initial_share: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., covariance: _Optional[bool] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedLapReply(_message.Message):
    __slots__ = ("header", "site_mean", "site_precision", "num_examples", "train_loss", "compute_seconds", "curvature_seconds", "resumed_from_round", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SITE_MEAN_FIELD_NUMBER: _ClassVar[int]
    SITE_PRECISION_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CURVATURE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    site_mean: TensorGroup
    site_precision: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    curvature_seconds: float
    resumed_from_round: int
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., site_mean: _Optional[_Union[TensorGroup, _Mapping]] = ..., site_precision: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., curvature_seconds: _Optional[float] = ..., resumed_from_round: _Optional[int] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedPAInstruction(_message.Message):
    __slots__ = ("header", "weights", "training", "sampling", "shrinkage", "local_burnin_epochs", "samples", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SHRINKAGE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BURNIN_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    weights: TensorGroup
    training: LocalTraining
    sampling: bool
    shrinkage: float
    local_burnin_epochs: int
    samples: int
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., weights: _Optional[_Union[TensorGroup, _Mapping]] = ..., training: _Optional[_Union[LocalTraining, _Mapping]] = ..., sampling: _Optional[bool] = ..., shrinkage: _Optional[float] = ..., local_burnin_epochs: _Optional[int] = ..., samples: _Optional[int] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class FedPAReply(_message.Message):
    __slots__ = ("header", "delta", "num_examples", "train_loss", "compute_seconds", "samples", "correction_norm", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_NORM_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    delta: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    samples: int
    correction_norm: float
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., delta: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., samples: _Optional[int] = ..., correction_norm: _Optional[float] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class DSVGDInstruction(_message.Message):
    __slots__ = ("header", "particles", "local_steps", "distill_steps", "kde_bandwidth", "step_size", "distill_step_size", "beta", "fudge", "alpha", "prior_precision", "batch_size", "initial_seed", "initial_particles", "variant", "particle_count", "max_visits", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTICLES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    DISTILL_STEPS_FIELD_NUMBER: _ClassVar[int]
    KDE_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    STEP_SIZE_FIELD_NUMBER: _ClassVar[int]
    DISTILL_STEP_SIZE_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    FUDGE_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    PRIOR_PRECISION_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_SEED_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PARTICLES_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    PARTICLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_VISITS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    particles: TensorGroup
    local_steps: int
    distill_steps: int
    kde_bandwidth: float
    step_size: float
    distill_step_size: float
    beta: float
    fudge: float
    alpha: float
    prior_precision: float
    batch_size: int
    initial_seed: int
    initial_particles: bool
    variant: str
    particle_count: int
    max_visits: int
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., particles: _Optional[_Union[TensorGroup, _Mapping]] = ..., local_steps: _Optional[int] = ..., distill_steps: _Optional[int] = ..., kde_bandwidth: _Optional[float] = ..., step_size: _Optional[float] = ..., distill_step_size: _Optional[float] = ..., beta: _Optional[float] = ..., fudge: _Optional[float] = ..., alpha: _Optional[float] = ..., prior_precision: _Optional[float] = ..., batch_size: _Optional[int] = ..., initial_seed: _Optional[int] = ..., initial_particles: _Optional[bool] = ..., variant: _Optional[str] = ..., particle_count: _Optional[int] = ..., max_visits: _Optional[int] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class DSVGDReply(_message.Message):
    __slots__ = ("header", "particles", "num_examples", "train_loss", "compute_seconds", "resumed_from_round", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTICLES_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    particles: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    resumed_from_round: int
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., particles: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., resumed_from_round: _Optional[int] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class PDSVGDReply(_message.Message):
    __slots__ = ("header", "local_particles", "num_examples", "train_loss", "compute_seconds", "resumed_from_round", "buffers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PARTICLES_FIELD_NUMBER: _ClassVar[int]
    NUM_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_ROUND_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    local_particles: TensorGroup
    num_examples: int
    train_loss: float
    compute_seconds: float
    resumed_from_round: int
    buffers: TensorGroup
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., local_particles: _Optional[_Union[TensorGroup, _Mapping]] = ..., num_examples: _Optional[int] = ..., train_loss: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., resumed_from_round: _Optional[int] = ..., buffers: _Optional[_Union[TensorGroup, _Mapping]] = ...) -> None: ...

class LeaveAndForget(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...
