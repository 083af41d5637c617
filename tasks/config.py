"""The run configuration shared by the ServerApp and every ClientApp.

Every key is declared once, as a field of a frozen dataclass: its type, default, one-line doc and check (`key`). The
core keys, which every run has, are RunSettings' own fields; a strategy's own keys are the fields of its settings
dataclass (strategies/<name>/settings.py). This module never imports a strategy: the strategy registry
(fedbayes.strategies) passes their keys in when it parses a run config (`RunSettings.from_run_config`), and a strategy
reads its own values back, typed, with `RunSettings.hyperparameters(its settings class)`. `fedbayes strategies` lists
the keys, `fedbayes app` writes them as a Flower app's [tool.flwr.app.config] (the checkout's pyproject.toml lists the
same, checked by tests/unit/test_config.py); `flwr run -c` and `fedbayes local --set` override them. A layer that
reads one concern's keys alone takes that concern's group, a frozen copy of them (`RunSettings.loop`, the round
loop's; `RunSettings.data`, a client's data's; `RunSettings.architecture`, the model's; `RunSettings.training`, the
clients' local training's; `RunSettings.evaluation`, the server's evaluation's; `RunSettings.tracker`, its
tracking's; `RunSettings.trust`, the trust boundary's).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from fedbayes.tasks.storage import is_safe_name

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

KEY = "fedbayes.key"  # the metadata entry of a dataclass field that declares a run-config key
RUN_CONFIG_FILE = "run-config.toml"  # the run config a workdir's federation was submitted with (`fedbayes report`)
# The kinds of run config `tracking` (server/tracking.py): the modules each needs (matplotlib: the report's figures),
# installed by the extra fedbayes[<kind>]. RunSettings checks the value's form, tasks/preflight.py that these are
# installed.
TRACKING_KINDS = {"mlflow": ("mlflow", "matplotlib"), "tensorboard": ("tensorboard", "matplotlib")}
# Run config `ood-inputs`: the out-of-distribution inputs of the server's evaluation (tasks/ood.py says what each is).
OOD_INPUTS = ("noise", "inverted", "permuted", "none")
LR_SCHEDULES = ("constant", "cosine")  # what `lr-schedule` auto becomes: a strategy's own (strategies.Algorithm)
H = TypeVar("H", bound="DataclassInstance")  # a strategy's settings dataclass
G = TypeVar("G", bound="DataclassInstance")  # a group of core keys (`RunSettings.loop`, `RunSettings.data`, ...)


class ConfigError(ValueError):
    """A run or node configuration value is missing or invalid."""


@dataclass(frozen=True)
class Check:
    """What a key's value must satisfy: `test(value)` is true; `requirement` says so in an error."""

    test: Callable[[Any], bool]
    requirement: str


POSITIVE = Check(lambda value: value > 0, "must be > 0")
NON_NEGATIVE = Check(lambda value: value >= 0, "must be >= 0")
AT_LEAST_ONE = Check(lambda value: value >= 1, "must be >= 1")
MOMENTUM = Check(lambda value: 0.0 <= value < 1.0, "must be in [0, 1)")  # a momentum or a moment decay
SHARE = Check(lambda value: 0.0 < value <= 1.0, "must be in (0, 1]")
# `fedbayes forget --refine-rounds`: the rounds after a forget it may ask for, which a resume runs whatever its
# num-server-rounds (server/forget/). Twenty times the longest protocol here (deploy/presets.toml, 50 rounds): a
# refinement longer than a training is a retraining, and a mistyped count must not keep a federation running for ever.
MAX_REFINE_ROUNDS = 1000
REFINE_ROUNDS = Check(lambda value: 0 <= value <= MAX_REFINE_ROUNDS, f"must be in [0, {MAX_REFINE_ROUNDS}]")


@dataclass(frozen=True)
class KeyDoc:
    """What a `key` field says of its run-config key besides its name, type and default."""

    doc: str
    check: Check | None = None
    choices: tuple[str, ...] = ()


def key(default: Any, doc: str, check: Check | None = None, choices: tuple[str, ...] = ()) -> Any:
    """A settings dataclass field that declares the run-config key named after it (`_` read as `-`): its default,
    whose type must be the field's, a one-line doc, and what a value must satisfy (`check`, or one of `choices`).

    Args:
        default: the key's default; its type is the key's.
        doc: one line on what the key means.
        check: what a value must satisfy, or None.
        choices: the values it may take, or () for any.

    Returns:
        The dataclass field (`keys_of` reads its metadata back).
    """
    return field(default=default, metadata={KEY: KeyDoc(doc, check, choices)})


@dataclass(frozen=True)
class Key:
    """One run-config key: its name, default (whose type is the key's type), a one-line doc, and what a value
    must satisfy (`check`, or one of `choices`)."""

    name: str
    default: Any
    doc: str
    check: Check | None = None
    choices: tuple[str, ...] = ()

    @property
    def type(self) -> type:
        return type(self.default)

    @property
    def attribute(self) -> str:
        return self.name.replace("-", "_")

    def parse(self, value: Any) -> Any:
        """A run config's value for this key, checked: an int is taken for a float key, nothing else is converted.

        Args:
            value: the value as the run config gives it (TOML's).

        Returns:
            The value, of the key's type.

        Raises:
            ConfigError: naming the key, where the value is of another type, not finite, not one of `choices` or
                fails `check`.
        """
        value = _coerce(self.name, value, self.type)
        if self.choices:
            _choice(self.name, value, self.choices)
        if self.check is not None:
            _check(self.name, self.check.test(value), self.check.requirement)
        return value


def keys_of(settings_type: type) -> tuple[Key, ...]:
    """The run-config keys a settings dataclass declares with `key` fields. A field whose default is not of its
    declared type is an error here, where the class is registered, not when a run config is parsed.

    Args:
        settings_type: a dataclass; its fields made with `key` declare keys, the others are skipped.

    Returns:
        Its keys, in field order.

    Raises:
        TypeError: a `key` field's default is not of its declared type.

    Examples:
        What a plugin strategy writes (docs/extending/strategy.md):

        >>> @dataclass(frozen=True)
        ... class MomentumSettings:
        ...     server_momentum: float = key(0.9, "the server's momentum", MOMENTUM)
        >>> [(k.name, k.default, k.doc) for k in keys_of(MomentumSettings)]
        [('server-momentum', 0.9, "the server's momentum")]
        >>> keys_of(MomentumSettings)[0].parse(1.5)
        Traceback (most recent call last):
        ...
        fedbayes.tasks.config.ConfigError: run config 'server-momentum' must be in [0, 1)
    """
    keys = []
    for item in fields(settings_type):
        if KEY not in item.metadata:
            continue
        declared, kind = item.metadata[KEY], type(item.default)
        if item.type not in (kind, kind.__name__):  # a class, or its name under `from __future__ import annotations`
            named = getattr(item.type, "__name__", item.type)
            raise TypeError(
                f"{settings_type.__name__}.{item.name} is declared {named}, but its default "
                f"{item.default!r} is a {kind.__name__}"
            )
        keys.append(Key(item.name.replace("_", "-"), item.default, declared.doc, declared.check, declared.choices))
    return tuple(keys)


@dataclass(frozen=True)
class NoHyperparameters:
    """The settings of a strategy that reads the core keys alone (FedAvg)."""


@dataclass(frozen=True)
class LoopSettings:
    """The round loop's settings (server/loop.py): the run's rounds and how the server waits for its clients and
    their replies. `RunSettings.loop` is the run's; a field named as a core key holds that key's value."""

    num_rounds: int  # run config num-server-rounds
    round_timeout: float
    poll_interval: float
    wait_for_clients: int  # before round 1
    wait_for_clients_timeout: float
    min_clients: int = 1  # before every round
    max_payload_mb: float = 512.0
    max_failed_rounds: int = 3  # consecutive rounds without an accepted reply before the run fails
    straggler_wait: float = 0.0  # run config straggler-wait (Stragglers); 0: wait for every reply up to round_timeout
    results_exists: str = "refuse"  # a new federation's results file that holds rows: refuse, append or replace
    pipeline_evaluation: bool = True  # evaluate and checkpoint round t while round t+1 trains (RoundFinisher)


@dataclass(frozen=True)
class DataSettings:
    """A client's data (client/runtime.py): the dataset, how its training set is split among the clients and in
    what order a client holds its rows. `RunSettings.data` is the run's; each field holds the core key of its name."""

    dataset: str
    data_root: str
    download: bool
    fraction: float
    split: str
    seed: int  # the split's
    dirichlet_alpha_sizes: float
    dirichlet_alpha_classes: float
    min_client_size: int
    two_class_per_class: int
    split_file: str
    split_file_overlap: bool
    row_order: str


@dataclass(frozen=True)
class ModelSettings:
    """The model a run trains (tasks/models.py `build_run_model`): its architecture and, for logreg and the MLP, the
    pooling of its inputs and the MLP's hidden layers. `RunSettings.architecture` is the run's; each field holds the
    core key of its name."""

    model: str  # a built-in name or a user's "<module>:<callable>"
    hidden: str  # the widths as the key gives them, "200,100" (tasks/models.py parse_hidden)
    activation: str
    pool: int


@dataclass(frozen=True)
class TrainingSettings:
    """The clients' local training as the server instructs it each round (strategies/base.py `local_training`): the
    epochs, the minibatches, the optimizer and its learning rate over the rounds. `RunSettings.training` is the run's;
    a field named as a core key holds that key's value."""

    local_epochs: int
    batch_size: int
    lr: float
    lr_schedule: str
    optimizer: str
    seed: int  # the minibatch order's and the noise's, mixed with the round and the client's id
    num_rounds: int  # run config num-server-rounds: the length of the cosine schedule

    def round_lr(self, server_round: int) -> float:
        """The local learning rate of a round: constant, or cosine-annealed over the rounds.

        Args:
            server_round: the round, from 1.

        Returns:
            `lr`, or under the cosine schedule lr x (1 + cos(pi x (server_round - 1) / num_rounds)) / 2.

        Raises:
            ValueError: the schedule is still "auto" (fedbayes.strategies.run_settings resolves it).
        """
        if self.lr_schedule == "auto":
            raise ValueError("lr-schedule 'auto' has no rate: parse the run config with strategies.run_settings")
        if self.lr_schedule == "constant":
            return self.lr
        progress = (server_round - 1) / max(self.num_rounds, 1)
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class EvaluationSettings:
    """The server's evaluation of the global model (server/evaluation.py `ServerEvaluation`): which rounds, on how much
    of the test set, over how large an ensemble and which OOD inputs, in what batches on how many threads.
    `RunSettings.evaluation` is the run's; a field named as a core key holds that key's value. Before
    `with_evaluation_defaults` a key left to the model's cost holds 0 (-1 for ensemble-samples)."""

    eval_every: int
    eval_fraction: float
    eval_threads: int
    eval_batched: bool
    eval_batch_size: int
    ensemble_samples: int
    ood_inputs: str
    seed: int  # the test subset's and the OOD inputs', and (mixed with the round) the ensemble's samples'
    num_rounds: int  # run config num-server-rounds: the last round, always evaluated, on the whole test set


@dataclass(frozen=True)
class TrackingSettings:
    """Where the ServerApp's run is tracked (server/tracking.py `tracked_run`). `RunSettings.tracker` is the run's;
    each field holds the core key of its name."""

    tracking: str  # "" (off), mlflow:URI or tensorboard:DIR (parse_tracking)
    federation: str  # the tracked run's name


@dataclass(frozen=True)
class TrustSettings:
    """The trust boundary's settings (server/round_core.py and the identities and quarantine it keeps): what a reply
    may be (its size, its num_examples, how far its update may reach), which client ids a node may speak as and how
    many the federation may count, and when refused replies quarantine a node. `RunSettings.trust` is the run's; each
    field holds the core key of its name."""

    max_payload_mb: float
    max_client_examples: int
    max_clients: int
    client_identity: str  # bound | reconnect
    client_registry: str  # a JSON file of {client-id: node-id}; "" = none
    screen_ratio: float
    max_client_rejections: int
    quarantine_rounds: int


@dataclass(frozen=True)
class RunSettings:
    """A run's configuration: every core key, parsed and checked, as a typed attribute (`settings.local_epochs`),
    and every strategy's own keys, which a strategy reads typed with `hyperparameters(its settings class)`. Both halves
    parse the same keys with the same checks, so a bad value fails loudly on both sides with the key's name in the
    message. Immutable; `replace` makes a copy. Parse one with `fedbayes.strategies.run_settings(run_config)`, which
    knows every strategy's keys."""

    # Keys every run has: what to run, the data, the model, local training, the round loop and the trust boundary.
    strategy: str = key(
        "fedavg",
        "the algorithm: a built-in name (`fedbayes strategies`), '<module>:<attribute>' or an installed entry point",
    )
    num_server_rounds: int = key(3, "rounds to run", AT_LEAST_ONE)
    federation: str = key(
        "",
        "one training run's name: its checkpoint and every client's state live under it, and a "
        'ServerApp started for it again resumes; "" = a new federation, named by the ServerApp',
        Check(lambda name: name == "" or is_safe_name(name), 'must be "" (a new federation) or match [A-Za-z0-9._-]+'),
    )
    results_path: str = key("", "a JSON-lines file the server appends one row per round to")
    server_state_dir: str = key("", 'server checkpoints; "" = $FEDBAYES_SERVER_STATE_DIR or ~/.fedbayes/server')
    # data
    dataset: str = key(
        "fmnist",
        "fmnist | mnist | cifar10 | cifar100 | npz:DIR (your own: DIR/train.npz or client-<i>.npz, and test.npz)",
    )
    data_root: str = key(
        "", "where torchvision datasets live (Fashion-MNIST: Debian's dataset-fashion-mnist by default)"
    )
    download: bool = key(False, "let torchvision download a missing dataset")
    fraction: float = key(1.0, "the share of the training set the clients split", SHARE)
    split: str = key("iid", "iid | dirichlet | two-class")
    seed: int = key(
        0,
        "the run's seed: data split, initial model, sampling, every client's noise (it seeds numpy, which "
        "refuses negative seeds, and torch; below 2^32 every per-round seed, seed x 1000003 + round, stays exact)",
        Check(lambda value: 0 <= value < 2**32, "must be in [0, 2^32)"),
    )
    dirichlet_alpha_sizes: float = key(1.0, "dirichlet split: concentration of the client sizes", POSITIVE)
    dirichlet_alpha_classes: float = key(0.5, "dirichlet split: concentration of each client's classes", POSITIVE)
    min_client_size: int = key(1, "dirichlet split: the fewest examples a client gets", AT_LEAST_ONE)
    two_class_per_class: int = key(300, "two-class split: examples per class per client", AT_LEAST_ONE)
    split_file: str = key(
        "",
        "a published split (JSON: per client its 0-based row indices into the training file, "
        "`fedbayes partitions --write`); replaces split/fraction",
    )
    split_file_overlap: bool = key(False, "with split-file: a row may belong to several clients")
    row_order: str = key(
        "split",
        "the order of a client's rows, which its minibatch permutations index: split (as the split gives them: by "
        "row, or a split file's order) | by-class (class by class, in that order within a class, as the BayesADMM "
        "authors' data generator lists them; under bayesadmm's noise=shared every client then meets about the same "
        "classes at the same step)",
        choices=("split", "by-class"),
    )
    # model
    model: str = key(
        "mlp",
        "logreg | mlp | cnn-zenke | cnn-acar | resnet20 | resnet20-gn | <module>:<callable> (your "
        "own: callable(input_shape, num_classes) -> nn.Module)",
    )
    hidden: str = key("200,100", "mlp: hidden layer widths")
    activation: str = key("sigmoid", "mlp: the hidden layers' activation")
    pool: int = key(1, "average-pool images over pool x pool blocks first (4: 28x28 -> 7x7)", AT_LEAST_ONE)
    # local training
    local_epochs: int = key(1, "epochs of local training per round", AT_LEAST_ONE)
    batch_size: int = key(32, "local minibatch size", AT_LEAST_ONE)
    lr: float = key(0.001, "local learning rate", POSITIVE)
    lr_schedule: str = key(
        "auto",
        "the local learning rate over the rounds: constant, cosine (lr annealed to 0 over num-server-rounds), or "
        "auto: the strategy's own (cosine for bayesadmm, as its paper; constant for the others)",
        choices=("auto", *LR_SCHEDULES),
    )
    optimizer: str = key("adam", "local optimizer of the non-Bayesian strategies", choices=("adam", "sgd"))
    weight_decay: float = key(0.0, "local weight decay (FedAvg, FedProx, FedDyn, FedPA)", NON_NEGATIVE)
    device: str = key("auto", "auto | cpu | cuda (a SuperNode's node config `device` overrides it)")
    input_scale: float = key(1.0, "multiply the inputs by this (pixels are in [0, 1] first)", POSITIVE)
    # the round loop
    fraction_train: float = key(1.0, "the share of the connected clients sampled each round", SHARE)
    min_clients: int = key(1, "clients that must be connected before a round starts", AT_LEAST_ONE)
    wait_for_clients: int = key(0, "clients to wait for before round 1", NON_NEGATIVE)
    wait_for_clients_timeout: float = key(120.0, "seconds to wait for them", NON_NEGATIVE)
    round_timeout: float = key(600.0, "seconds a round waits for replies; later ones are not used", POSITIVE)
    poll_interval: float = key(0.5, "seconds between the server's pulls for replies", POSITIVE)
    eval_batch_size: int = key(2000, "the server's evaluation batch size", AT_LEAST_ONE)
    ensemble_samples: int = key(
        -1,
        "posterior samples in the server's predictive ensemble (Bayesian strategies); -1 = "
        "by the model's cost: 32, or 4 for a model of over 2 M multiply-adds per example (server/evaluation.py)",
        Check(lambda value: value >= -1, "must be >= 0, or -1 (by the model's cost)"),
    )
    # the trust boundary (deploy/README.md "Trust model")
    max_payload_mb: float = key(
        512.0, "larger instructions or replies are refused, by name, before they are decoded", POSITIVE
    )
    max_failed_rounds: int = key(
        3,
        "this many consecutive rounds with no accepted reply stop the run, non-zero (so does ending on 2 or more)",
        AT_LEAST_ONE,
    )
    max_clients: int = key(
        10000, "client ids the federation may ever count (K); a new id beyond this is refused", AT_LEAST_ONE
    )
    max_client_examples: int = key(
        100000000,
        "a reply's num_examples must lie in [1, this]",
        Check(lambda value: 1 <= value <= 2**40, "must be in [1, 2^40]"),
    )
    client_identity: str = key(
        "bound",
        "bound: a client id stays with the node that first presented it; reconnect: it "
        "may move to a new node once its old node has left (insecure loopback)",
        choices=("bound", "reconnect"),
    )
    client_registry: str = key(
        "", "JSON {client-id: node-id} from `fedbayes pki register --client-id`; only those pairs are accepted"
    )
    # per-reply isolation and robust aggregation (deploy/README.md "Trust model")
    screen_ratio: float = key(
        100.0,
        "a reply whose update (its change to the state, in the strategy's own parameters) is "
        "longer than this many times the median of the round's other replies for a client of its size, and longer "
        "than the state itself, is refused",
        Check(lambda value: value >= 1.0, "must be >= 1"),
    )
    robust_aggregation: str = key(
        "none",
        "none | clip: every reply's update clipped to clip-ratio x the round's median "
        "norm | median, trimmed-mean: coordinate-wise (FedAvg, FedProx, FedDyn, FedPA)",
        choices=("none", "clip", "median", "trimmed-mean"),
    )
    clip_ratio: float = key(
        3.0,
        "robust-aggregation=clip: the largest update norm used, as a multiple of the round's median",
        Check(lambda value: value >= 1.0, "must be >= 1"),
    )
    trim_fraction: float = key(
        0.2,
        "robust-aggregation=trimmed-mean: the share of replies dropped at each end, per coordinate",
        Check(lambda value: 0.0 <= value < 0.5, "must be in [0, 0.5)"),
    )
    max_client_rejections: int = key(
        3, "a node whose replies are refused this many rounds in a row is quarantined", AT_LEAST_ONE
    )
    quarantine_rounds: int = key(10, "rounds a quarantined node is left out of sampling and scheduling", AT_LEAST_ONE)
    straggler_wait: float = key(
        2.0,
        "once half the round's replies are in, after h seconds, wait for each other client at most "
        "h x (1 + this x its size), its size being its examples over the median of the replies in, at least 1 (one "
        "whose size the server does not know yet is waited for up to round-timeout once); 0 = wait up to round-timeout",
        NON_NEGATIVE,
    )
    results_exists: str = key(
        "refuse",
        "what a new federation does with a results-path that already holds rows: refuse, append or replace",
        choices=("refuse", "append", "replace"),
    )
    keep_checkpoints: int = key(
        3, "server checkpoints kept per federation (the newest and earlier rounds')", AT_LEAST_ONE
    )
    resume_from_round: int = key(
        0, "resume from the kept checkpoint of this round instead of the newest (0 = newest)", NON_NEGATIVE
    )
    tracking: str = key(
        "",
        '"" = off | mlflow:URI (an MLflow tracking server) | tensorboard:DIR (event files in '
        "DIR/<federation>): the run config, every round's row, the report's figures and the posterior "
        "(server/tracking.py; extras fedbayes[mlflow], fedbayes[tensorboard])",
        Check(
            lambda value: (
                value == ""
                or (
                    value.partition(":")[0] in ("mlflow", "tensorboard")  # TRACKING_KINDS
                    and value.partition(":")[2] != ""
                )
            ),
            'must be "" (off), mlflow:URI or tensorboard:DIR',
        ),
    )
    # the server's evaluation (server/evaluation.py); 0 = by the model's cost: logreg and the MLP every round on the
    # whole test set on one thread, models of over 2 M multiply-adds per example (the CNNs) every 5th round on a tenth
    # of it (the last round on all of it) on every core
    eval_every: int = key(
        0,
        "rounds between the server's evaluations (the last round is always evaluated; the rows of "
        "the others have no test metrics); 0 = by the model's cost: 1, or 5",
        NON_NEGATIVE,
    )
    eval_fraction: float = key(
        0.0,
        "the share of the test set (a fixed subset drawn from the run's seed) evaluated before "
        "the last round, which evaluates all of it; 0 = by the model's cost: 1, or 0.1",
        Check(lambda value: 0.0 <= value <= 1.0, "must be in (0, 1], or 0 (by the model's cost)"),
    )
    eval_threads: int = key(
        0,
        "CPU threads of the server's evaluation (at nice 19: it takes the cores clients leave "
        "idle); 0 = by the model's cost: 1, or the cores the ServerApp may use",
        NON_NEGATIVE,
    )
    eval_batched: bool = key(
        False,
        "evaluate the ensemble's samples as one vmapped model rather than one pass each "
        "(equal to round-off; slower on the CPU, benchmarks/evaluation_cost.py)",
    )
    ood_inputs: str = key(
        "noise",
        "the inputs the federation never saw that the server's evaluation scores (the rows' ood_auroc): noise "
        "(uniform, each input feature in its test-set range) | inverted (test inputs mirrored in that range) | "
        "permuted (test inputs' features in one fixed shuffled order) | none; 1,000 of them, fixed by the run's seed "
        "(tasks/ood.py)",
        choices=OOD_INPUTS,
    )
    # the clients' evaluation (client/evaluation.py)
    client_eval_fraction: float = key(
        0.0,
        "the share of each client's examples it holds out of training (the same ones every round, drawn from the "
        "run's seed and its client id) and evaluates the global model it receives, and its own posterior where the "
        "strategy keeps one, on: the rows' client_metrics; 0 = off, every client trains on all of its examples",
        Check(lambda value: 0.0 <= value < 1.0, "must be in [0, 1)"),
    )
    # every strategy's own keys, parsed: attribute -> value (`hyperparameters` reads a strategy's, typed)
    hyperparameter_values: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], strategy_keys: Iterable[Key] = ()) -> RunSettings:
        """Parse and check `run_config`, which must set exactly the core keys and `strategy_keys`.

        Args:
            run_config: key name -> value, as Flower gives it.
            strategy_keys: the strategies' own keys (the registry's).

        Returns:
            The settings.

        Raises:
            ConfigError: a key is unknown or missing, or a value is invalid (alone or with others: `validate`).
        """
        keys = merge_keys(strategy_keys)
        unknown = sorted(set(run_config) - set(keys))
        if unknown:
            raise ConfigError(f"{unknown_keys(unknown, keys)}; `fedbayes strategies` lists them")
        missing = [name for name in keys if name not in run_config]
        if missing:
            raise ConfigError(f"run config is missing '{missing[0]}'")
        values = {key.attribute: key.parse(run_config[name]) for name, key in keys.items()}
        core = {key.attribute: values.pop(key.attribute) for key in CORE_KEYS}
        settings = cls(**core, hyperparameter_values=values)
        settings.validate()
        return settings

    def hyperparameters(self, settings_type: type[H]) -> H:
        """A strategy's own keys as its typed settings.

        Args:
            settings_type: the strategy's settings, a dataclass of `key` fields.

        Returns:
            An instance holding this run's values of them.
        """
        return settings_type(**{item.name: self.hyperparameter_values[item.name] for item in fields(settings_type)})

    @property
    def loop(self) -> LoopSettings:
        """The round loop's group of keys, and the rounds to run (`pipeline_evaluation`, which no key sets, keeps its
        default)."""
        return self._group(LoopSettings, num_rounds=self.num_server_rounds)

    @property
    def data(self) -> DataSettings:
        """The group of keys a client's data follows from."""
        return self._group(DataSettings)

    @property
    def architecture(self) -> ModelSettings:
        """The group of keys the run's model is built from."""
        return self._group(ModelSettings)

    @property
    def training(self) -> TrainingSettings:
        """The group of keys the clients' local training follows, and the rounds to run (its schedule's length)."""
        return self._group(TrainingSettings, num_rounds=self.num_server_rounds)

    @property
    def evaluation(self) -> EvaluationSettings:
        """The group of keys the server's evaluation follows, and the rounds to run (the last is always evaluated)."""
        return self._group(EvaluationSettings, num_rounds=self.num_server_rounds)

    @property
    def tracker(self) -> TrackingSettings:
        """The group of keys the run's tracking follows (run config `tracking` names this attribute already)."""
        return self._group(TrackingSettings)

    @property
    def trust(self) -> TrustSettings:
        """The group of keys the trust boundary checks each reply, client id and node against."""
        return self._group(TrustSettings)

    def _group(self, group: type[G], **given: Any) -> G:
        """`group` with each of its fields named as a core key holding that key's value, and `given`."""
        core = {item.name for item in fields(self)}
        shared = {item.name: getattr(self, item.name) for item in fields(group) if item.name in core}
        return group(**shared, **given)

    def value(self, name: str) -> Any:
        """The value of any declared key, core or a strategy's, by its run-config name.

        Args:
            name: the key's run-config name ("local-epochs").

        Returns:
            Its value.
        """
        attribute = name.replace("-", "_")
        if attribute in self.hyperparameter_values:
            return self.hyperparameter_values[attribute]
        return getattr(self, attribute)

    def replace(self, **changes: Any) -> RunSettings:
        """A copy with some core keys changed; the new values are not checked.

        Args:
            changes: attribute -> its new value.

        Returns:
            The copy.
        """
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """What one key cannot check alone: names other modules define, and keys that depend on each other.

        Raises:
            ConfigError: naming the key whose value is refused.
        """
        from fedbayes.tasks.compute import DEVICES
        from fedbayes.tasks.datasets import DATASETS, NPZ_PREFIX
        from fedbayes.tasks.models import ACTIVATIONS, MODELS
        from fedbayes.tasks.partitions import SPLITS

        own_data = self.dataset.startswith(NPZ_PREFIX) and len(self.dataset) > len(NPZ_PREFIX)  # tasks/npzdata.py
        _check(
            "dataset",
            self.dataset in DATASETS or own_data,
            f"must be one of {', '.join(DATASETS)}, or npz:DIR (a folder of .npz files), got {self.dataset!r}",
        )
        _choice("split", self.split, SPLITS)
        _check_model(self.model, MODELS)
        _choice("activation", self.activation, tuple(ACTIVATIONS))
        _choice("device", self.device, DEVICES)
        _check(
            "fraction",
            not self.split_file or self.fraction == 1.0,
            "must be 1 with a split-file: the file names every client's rows of the whole training set",
        )


CORE_KEYS = keys_of(RunSettings)


def merge_keys(strategy_keys: Iterable[Key]) -> dict[str, Key]:
    """Every run-config key by name: the core's and `strategy_keys`. A key several strategies read (prior-precision,
    max-grad-norm) is declared by each, with the same default and type; each says what it means to that strategy.

    Args:
        strategy_keys: the strategies' own keys.

    Returns:
        Key name -> key, the core's first.

    Raises:
        ConfigError: one name is declared with two defaults or types.
    """
    keys: dict[str, Key] = {}
    for declared in (*CORE_KEYS, *strategy_keys):
        known = keys.setdefault(declared.name, declared)
        if known.default != declared.default or known.type is not declared.type:
            raise ConfigError(
                f"run-config key '{declared.name}' is declared twice, with defaults {known.default!r} "
                f"and {declared.default!r}"
            )
    return keys


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ " (did you mean 'x'?)" naming the known name closest to a misspelt `name`, or "" when none is close.

    Args:
        name: the misspelt name.
        known: the names it may have meant.

    Returns:
        The suggestion, or "".

    Examples:
        >>> did_you_mean("local-epoch", ["local-epochs", "lr"])
        " (did you mean 'local-epochs'?)"
    """
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_keys(names: Iterable[str], known: Iterable[str], what: str = "run-config key") -> str:
    """ "unknown <what> 'a' (did you mean 'b'?)": each of `names`, none of which is in `known`, with the closest
    known name where one is close.

    Args:
        names: the unknown names.
        known: the names there are.
        what: what the names are ("run-config key", "option").

    Returns:
        The message.
    """
    known = list(known)
    names = list(names)
    shown = ", ".join(f"'{name}'{did_you_mean(name, known)}" for name in names)
    return f"unknown {what}{'s' if len(names) > 1 else ''} {shown}"


def checked_number(kind: type[int] | type[float], check: Check | None) -> Callable[[str], int | float]:
    """An argparse `type=` for a numeric option: a finite `kind` that passes `check` (if any). argparse names the
    option in the refusal ("argument --seed: must be in [0, 2^32), got '-1'") and exits 2 before anything runs.

    Args:
        kind: int or float.
        check: what a value must satisfy, or None.

    Returns:
        The parser of an option's text, raising argparse.ArgumentTypeError for a value it refuses.
    """

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if check is not None and not check.test(value):
            raise argparse.ArgumentTypeError(f"{check.requirement}, got {text!r}")
        return value

    return parse


def run_config_number(name: str) -> Callable[[str], int | float]:
    """The type and check of core run-config key `name`, for the option that sets it: both refuse the same values.

    Args:
        name: a core key's run-config name.

    Returns:
        An argparse `type=` (checked_number).
    """
    key = next(key for key in CORE_KEYS if key.name == name)
    return checked_number(key.type, key.check)


def parse_tracking(tracking: str) -> tuple[str, str]:
    """The kind and target of a run config `tracking` value.

    Args:
        tracking: "", mlflow:URI or tensorboard:DIR.

    Returns:
        ("mlflow", URI), ("tensorboard", DIR), or ("", "") for off.
    """
    kind, _, target = tracking.partition(":")
    return (kind, target) if tracking else ("", "")


def round_seed(seed: int, server_round: int) -> int:
    """One seed per (run seed, round), the same in every process: the server's node sampling, scheduling and
    posterior samples, and (mixed with a client's id) its minibatch order and noise.

    Args:
        seed: the run's seed.
        server_round: the round.

    Returns:
        seed x 1000003 + server_round.
    """
    return seed * 1_000_003 + server_round


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Flower's TOML parsing gives 1 for `lr=1`; accept ints for floats, nothing else."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"run config '{key}' must be {kind.__name__}, got {value!r}")
    # TOML has inf and nan; no key of ours means them
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"run config '{key}' must be finite, got {value!r}")
    return value


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"run config '{key}' must be one of {', '.join(choices)}, got {value!r}")


def _check_model(model: str, builtin: tuple[str, ...]) -> None:
    """A built-in model, or "<module>:<callable>" that imports here (tasks/preflight.py also builds it)."""
    from fedbayes.tasks.models import load_model_builder

    if ":" not in model:
        _check(
            "model", model in builtin, f"must be one of {', '.join(builtin)}, or '<module>:<callable>', got {model!r}"
        )
        return
    try:
        load_model_builder(model)
    except ValueError as error:
        raise ConfigError(f"run config 'model': {error}") from None


# Run-config keys whose value may be code: "<module>:<attribute>", imported where the value is used (a plugin
# strategy, a user model). Every other value of theirs is a name of fedbayes' or an installed package's.
CODE_KEYS = ("strategy", "model")


def unnamed_code(
    source: str,
    config: Mapping[str, Any],
    named: Mapping[str, str],
    how: Callable[[str, str], str] = lambda key, reference: f"--{key} {reference}",
) -> str | None:
    """Why the code a file names may not be used: None when it names none, or only what the user named.

    A file (a checkpoint's run config, a posterior's header) is data: the "<module>:<attribute>" it gives a key of
    CODE_KEYS would be imported and run, so it is used only when the user named that same reference for that key
    (`named`: key -> reference, e.g. from --strategy and --model). A reference the user named that the file does
    not name is refused too: it would be ignored. Built-in names need nothing.

    Args:
        source: what the file is, for the message ("checkpoint ...").
        config: the file's values, by run-config key.
        named: key -> the reference the user named for it.
        how: how to name a reference to a key in the message (default: the command-line option).

    Returns:
        Why the file's code may not be used, or None where it may.
    """
    for key in CODE_KEYS:
        value = config.get(key)
        shown = str(value)[:200]  # a file's value, however long
        names_code = isinstance(value, str) and ":" in value
        if key in named and named[key] != value:
            return (
                f"{how(key, named[key])} was given, but {source} names {key} {shown!r}: name the {key} the file "
                "was made with" + (f" ({how(key, shown)})" if names_code else " (a built-in one needs nothing)")
            )
        if names_code and key not in named:
            return (
                f"{source} names {key} {shown!r}, code that would be imported and run to use the file; fedbayes "
                f"runs no code a file names. If you trust that code, name it yourself: {how(key, shown)}"
            )
    return None


def _check(key: str, ok: bool, requirement: str) -> None:
    if not ok:
        raise ConfigError(f"run config '{key}' {requirement}")
