from fedbayes.protos import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
from fedbayes.protos.common_pb2 import TensorSpec as TensorSpec
from fedbayes.protos.common_pb2 import TensorGroup as TensorGroup
from fedbayes.protos.common_pb2 import Header as Header
from fedbayes.protos.common_pb2 import LocalTraining as LocalTraining
from fedbayes.protos.common_pb2 import Instruction as Instruction
from fedbayes.protos.common_pb2 import ClientEvaluationRequest as ClientEvaluationRequest
from fedbayes.protos.common_pb2 import HeldOutMetrics as HeldOutMetrics
from fedbayes.protos.common_pb2 import ClientEvaluation as ClientEvaluation
from fedbayes.protos.common_pb2 import Reply as Reply
from fedbayes.protos.common_pb2 import LeaveAndForget as LeaveAndForget
from fedbayes.protos.common_pb2 import SchemaVersion as SchemaVersion
from fedbayes.protos.common_pb2 import DType as DType

DESCRIPTOR: _descriptor.FileDescriptor
SCHEMA_VERSION_UNSPECIFIED: _common_pb2.SchemaVersion
SCHEMA_VERSION_1: _common_pb2.SchemaVersion
SCHEMA_VERSION_2: _common_pb2.SchemaVersion
SCHEMA_VERSION_3: _common_pb2.SchemaVersion
SCHEMA_VERSION_4: _common_pb2.SchemaVersion
SCHEMA_VERSION_5: _common_pb2.SchemaVersion
SCHEMA_VERSION_6: _common_pb2.SchemaVersion
SCHEMA_VERSION_7: _common_pb2.SchemaVersion
SCHEMA_VERSION_8: _common_pb2.SchemaVersion
SCHEMA_VERSION_9: _common_pb2.SchemaVersion
DTYPE_UNSPECIFIED: _common_pb2.DType
FLOAT32: _common_pb2.DType
FLOAT64: _common_pb2.DType

class FedAvgInstruction(_message.Message):
    __slots__ = ("weights", "training", "proximal_mu")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    PROXIMAL_MU_FIELD_NUMBER: _ClassVar[int]
    weights: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
    proximal_mu: float
    def __init__(self, weights: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ..., proximal_mu: _Optional[float] = ...) -> None: ...

class FedAvgReply(_message.Message):
    __slots__ = ("weights",)
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    weights: _common_pb2.TensorGroup
    def __init__(self, weights: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ...) -> None: ...

class BayesADMMInstruction(_message.Message):
    __slots__ = ("global_mean", "global_precision", "training", "rho", "dual_step", "temperature", "hess_init", "beta1", "beta2", "mc_samples", "rescale_lr", "reset_posterior", "shared_noise", "noise_seed", "family")
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
    global_mean: _common_pb2.TensorGroup
    global_precision: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
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
    def __init__(self, global_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., global_precision: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ..., rho: _Optional[float] = ..., dual_step: _Optional[float] = ..., temperature: _Optional[float] = ..., hess_init: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., mc_samples: _Optional[int] = ..., rescale_lr: _Optional[bool] = ..., reset_posterior: _Optional[bool] = ..., shared_noise: _Optional[bool] = ..., noise_seed: _Optional[int] = ..., family: _Optional[str] = ...) -> None: ...

class BayesADMMReply(_message.Message):
    __slots__ = ("local_mean", "local_precision", "dual_mean", "dual_precision")
    LOCAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    LOCAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    DUAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    DUAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    local_mean: _common_pb2.TensorGroup
    local_precision: _common_pb2.TensorGroup
    dual_mean: _common_pb2.TensorGroup
    dual_precision: _common_pb2.TensorGroup
    def __init__(self, local_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., local_precision: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., dual_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., dual_precision: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ...) -> None: ...

class FedDynInstruction(_message.Message):
    __slots__ = ("global_weights", "training", "alpha", "known_clients", "known_examples", "max_grad_norm")
    GLOBAL_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    global_weights: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
    alpha: float
    known_clients: int
    known_examples: int
    max_grad_norm: float
    def __init__(self, global_weights: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ..., alpha: _Optional[float] = ..., known_clients: _Optional[int] = ..., known_examples: _Optional[int] = ..., max_grad_norm: _Optional[float] = ...) -> None: ...

class FedDynReply(_message.Message):
    __slots__ = ("weights", "lambda_sketch")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_SKETCH_FIELD_NUMBER: _ClassVar[int]
    weights: _common_pb2.TensorGroup
    lambda_sketch: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, weights: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., lambda_sketch: _Optional[_Iterable[float]] = ...) -> None: ...

class FedLapInstruction(_message.Message):
    __slots__ = ("global_mean", "global_precision", "training", "prior_precision", "known_clients", "known_examples", "initial_share", "max_grad_norm", "covariance", "site_damping", "curvature_damping")
    GLOBAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_PRECISION_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    PRIOR_PRECISION_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    INITIAL_SHARE_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    COVARIANCE_FIELD_NUMBER: _ClassVar[int]
    SITE_DAMPING_FIELD_NUMBER: _ClassVar[int]
    CURVATURE_DAMPING_FIELD_NUMBER: _ClassVar[int]
    global_mean: _common_pb2.TensorGroup
    global_precision: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
    prior_precision: float
    known_clients: int
    known_examples: int
    initial_share: float
    max_grad_norm: float
    covariance: bool
    site_damping: float
    curvature_damping: bool
    def __init__(self, global_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., global_precision: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ..., prior_precision: _Optional[float] = ..., known_clients: _Optional[int] = ..., known_examples: _Optional[int] = ..., initial_share: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., covariance: _Optional[bool] = ..., site_damping: _Optional[float] = ..., curvature_damping: _Optional[bool] = ...) -> None: ...

class FedLapReply(_message.Message):
    __slots__ = ("site_mean", "site_precision", "curvature_seconds")
    SITE_MEAN_FIELD_NUMBER: _ClassVar[int]
    SITE_PRECISION_FIELD_NUMBER: _ClassVar[int]
    CURVATURE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    site_mean: _common_pb2.TensorGroup
    site_precision: _common_pb2.TensorGroup
    curvature_seconds: float
    def __init__(self, site_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., site_precision: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., curvature_seconds: _Optional[float] = ...) -> None: ...

class FedLapFuncInstruction(_message.Message):
    __slots__ = ("global_mean", "training", "prior_precision", "known_clients", "known_examples", "initial_share", "max_grad_norm", "site_damping", "memory_points_per_class", "function_weight")
    GLOBAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    PRIOR_PRECISION_FIELD_NUMBER: _ClassVar[int]
    KNOWN_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    INITIAL_SHARE_FIELD_NUMBER: _ClassVar[int]
    MAX_GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    SITE_DAMPING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_POINTS_PER_CLASS_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    global_mean: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
    prior_precision: float
    known_clients: int
    known_examples: int
    initial_share: float
    max_grad_norm: float
    site_damping: float
    memory_points_per_class: int
    function_weight: float
    def __init__(self, global_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ..., prior_precision: _Optional[float] = ..., known_clients: _Optional[int] = ..., known_examples: _Optional[int] = ..., initial_share: _Optional[float] = ..., max_grad_norm: _Optional[float] = ..., site_damping: _Optional[float] = ..., memory_points_per_class: _Optional[int] = ..., function_weight: _Optional[float] = ...) -> None: ...

class FedLapFuncReply(_message.Message):
    __slots__ = ("site_mean", "memory_inputs", "memory_predictions", "memory_points", "sends_inputs", "represented_examples")
    SITE_MEAN_FIELD_NUMBER: _ClassVar[int]
    MEMORY_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_POINTS_FIELD_NUMBER: _ClassVar[int]
    SENDS_INPUTS_FIELD_NUMBER: _ClassVar[int]
    REPRESENTED_EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    site_mean: _common_pb2.TensorGroup
    memory_inputs: _common_pb2.TensorGroup
    memory_predictions: _common_pb2.TensorGroup
    memory_points: int
    sends_inputs: bool
    represented_examples: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, site_mean: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., memory_inputs: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., memory_predictions: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., memory_points: _Optional[int] = ..., sends_inputs: _Optional[bool] = ..., represented_examples: _Optional[_Iterable[float]] = ...) -> None: ...

class FedPAInstruction(_message.Message):
    __slots__ = ("weights", "training", "sampling", "shrinkage", "local_burnin_epochs", "samples")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SHRINKAGE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BURNIN_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    weights: _common_pb2.TensorGroup
    training: _common_pb2.LocalTraining
    sampling: bool
    shrinkage: float
    local_burnin_epochs: int
    samples: int
    def __init__(self, weights: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., training: _Optional[_Union[_common_pb2.LocalTraining, _Mapping]] = ..., sampling: _Optional[bool] = ..., shrinkage: _Optional[float] = ..., local_burnin_epochs: _Optional[int] = ..., samples: _Optional[int] = ...) -> None: ...

class FedPAReply(_message.Message):
    __slots__ = ("delta", "samples", "correction_norm")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_NORM_FIELD_NUMBER: _ClassVar[int]
    delta: _common_pb2.TensorGroup
    samples: int
    correction_norm: float
    def __init__(self, delta: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., samples: _Optional[int] = ..., correction_norm: _Optional[float] = ...) -> None: ...

class DSVGDInstruction(_message.Message):
    __slots__ = ("particles", "local_steps", "distill_steps", "kde_bandwidth", "step_size", "distill_step_size", "beta", "fudge", "alpha", "prior_precision", "batch_size", "initial_seed", "initial_particles", "variant", "particle_count", "max_visits")
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
    particles: _common_pb2.TensorGroup
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
    def __init__(self, particles: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., local_steps: _Optional[int] = ..., distill_steps: _Optional[int] = ..., kde_bandwidth: _Optional[float] = ..., step_size: _Optional[float] = ..., distill_step_size: _Optional[float] = ..., beta: _Optional[float] = ..., fudge: _Optional[float] = ..., alpha: _Optional[float] = ..., prior_precision: _Optional[float] = ..., batch_size: _Optional[int] = ..., initial_seed: _Optional[int] = ..., initial_particles: _Optional[bool] = ..., variant: _Optional[str] = ..., particle_count: _Optional[int] = ..., max_visits: _Optional[int] = ...) -> None: ...

class DSVGDReply(_message.Message):
    __slots__ = ("particles",)
    PARTICLES_FIELD_NUMBER: _ClassVar[int]
    particles: _common_pb2.TensorGroup
    def __init__(self, particles: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ...) -> None: ...

class PDSVGDReply(_message.Message):
    __slots__ = ("local_particles",)
    LOCAL_PARTICLES_FIELD_NUMBER: _ClassVar[int]
    local_particles: _common_pb2.TensorGroup
    def __init__(self, local_particles: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ...) -> None: ...

class DSVGDForgetInstruction(_message.Message):
    __slots__ = ("particles", "variant", "particle_count", "steps", "kde_bandwidth", "step_size", "beta", "fudge", "prior_precision")
    PARTICLES_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    PARTICLE_COUNT_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    KDE_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    STEP_SIZE_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    FUDGE_FIELD_NUMBER: _ClassVar[int]
    PRIOR_PRECISION_FIELD_NUMBER: _ClassVar[int]
    particles: _common_pb2.TensorGroup
    variant: str
    particle_count: int
    steps: int
    kde_bandwidth: float
    step_size: float
    beta: float
    fudge: float
    prior_precision: float
    def __init__(self, particles: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ..., variant: _Optional[str] = ..., particle_count: _Optional[int] = ..., steps: _Optional[int] = ..., kde_bandwidth: _Optional[float] = ..., step_size: _Optional[float] = ..., beta: _Optional[float] = ..., fudge: _Optional[float] = ..., prior_precision: _Optional[float] = ...) -> None: ...

class DSVGDForgetReply(_message.Message):
    __slots__ = ("particles",)
    PARTICLES_FIELD_NUMBER: _ClassVar[int]
    particles: _common_pb2.TensorGroup
    def __init__(self, particles: _Optional[_Union[_common_pb2.TensorGroup, _Mapping]] = ...) -> None: ...
