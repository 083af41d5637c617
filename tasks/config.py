"""The run configuration shared by the ServerApp and every ClientApp.

Every key is declared once, with its type, default, one-line doc and check: the core's here (CORE_KEYS), each
strategy's next to its algorithm (strategies/<name>.py HYPERPARAMETERS). `fedbayes strategies` lists them,
`fedbayes app` writes them as a Flower app's [tool.flwr.app.config] (the checkout's pyproject.toml lists the
same, checked by tests/test_config.py); `flwr run -c` and `fedbayes local --set` override them.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any



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
        value = _coerce(self.name, value, self.type)
        if self.choices:
            _choice(self.name, value, self.choices)
        if self.check is not None:
            _check(self.name, self.check.test(value), self.check.requirement)
        return value


# Keys every run has: what to run, the data, the model, local training, the round loop and the trust boundary.
# A strategy's own hyperparameters are declared next to its algorithm (strategies/<name>.py, HYPERPARAMETERS).
CORE_KEYS = (
    Key("strategy", "fedavg", "the algorithm: a built-in name (`fedbayes strategies`), '<module>:<attribute>' or an "
        "installed entry point"),
    Key("num-server-rounds", 3, "rounds to run", AT_LEAST_ONE),
    Key("federation", "", 'one training run\'s name: its checkpoint and every client\'s state live under it, and a '
        'ServerApp started for it again resumes; "" = a new federation, named by the ServerApp',
        Check(lambda name: name == "" or _is_safe_name(name), 'must be "" (a new federation) or match [A-Za-z0-9._-]+')),
    Key("results-path", "", "a JSON-lines file the server appends one row per round to"),
    Key("server-state-dir", "", 'server checkpoints; "" = $FEDBAYES_SERVER_STATE_DIR or ~/.fedbayes/server'),
    # data
    Key("dataset", "fmnist", "fmnist | mnist | cifar10 | cifar100 | npz:DIR (your own: DIR/train.npz or "
        "client-<i>.npz, and test.npz)"),
    Key("data-root", "", "where torchvision datasets live (Fashion-MNIST: Debian's dataset-fashion-mnist by default)"),
    Key("download", False, "let torchvision download a missing dataset"),
    Key("fraction", 1.0, "the share of the training set the clients split", SHARE),
    Key("split", "iid", "iid | dirichlet | two-class"),
    Key("seed", 0, "the run's seed: data split, initial model, sampling, every client's noise (it seeds numpy, which "
        "refuses negative seeds, and torch; below 2^32 every per-round seed, seed x 1000003 + round, stays exact)",
        Check(lambda value: 0 <= value < 2**32, "must be in [0, 2^32)")),
    Key("dirichlet-alpha-sizes", 1.0, "dirichlet split: concentration of the client sizes", POSITIVE),
    Key("dirichlet-alpha-classes", 0.5, "dirichlet split: concentration of each client's classes", POSITIVE),
    Key("min-client-size", 1, "dirichlet split: the fewest examples a client gets", AT_LEAST_ONE),
    Key("two-class-per-class", 300, "two-class split: examples per class per client", AT_LEAST_ONE),
    Key("split-file", "", "a published split (JSON: per client its 0-based row indices into the training file, "
        "`fedbayes partitions --write`); replaces split/fraction"),
    Key("split-file-overlap", False, "with split-file: a row may belong to several clients"),
    # model
    Key("model", "mlp", "logreg | mlp | cnn-zenke | cnn-acar | resnet20 | resnet20-gn | <module>:<callable> (your "
        "own: callable(input_shape, num_classes) -> nn.Module)"),
    Key("hidden", "200,100", "mlp: hidden layer widths"),
    Key("activation", "sigmoid", "mlp: the hidden layers' activation"),
    Key("pool", 1, "average-pool images over pool x pool blocks first (4: 28x28 -> 7x7)", AT_LEAST_ONE),
    # local training
    Key("local-epochs", 1, "epochs of local training per round", AT_LEAST_ONE),
    Key("batch-size", 32, "local minibatch size", AT_LEAST_ONE),
    Key("lr", 0.001, "local learning rate", POSITIVE),
    Key("lr-schedule", "constant", "the local learning rate over the rounds", choices=("constant", "cosine")),
    Key("optimizer", "adam", "local optimizer of the non-Bayesian strategies", choices=("adam", "sgd")),
    Key("weight-decay", 0.0, "local weight decay (FedAvg, FedProx, FedDyn, FedPA)", NON_NEGATIVE),
    Key("device", "auto", "auto | cpu | cuda (a SuperNode's node config `device` overrides it)"),
    Key("input-scale", 1.0, "divide the inputs by this", POSITIVE),
    # the round loop
    Key("fraction-train", 1.0, "the share of the connected clients sampled each round", SHARE),
    Key("min-clients", 1, "clients that must be connected before a round starts", AT_LEAST_ONE),
    Key("wait-for-clients", 0, "clients to wait for before round 1", NON_NEGATIVE),
    Key("wait-for-clients-timeout", 120.0, "seconds to wait for them", NON_NEGATIVE),
    Key("round-timeout", 600.0, "seconds a round waits for replies; later ones are not used", POSITIVE),
    Key("poll-interval", 0.5, "seconds between the server's pulls for replies", POSITIVE),
    Key("eval-batch-size", 2000, "the server's evaluation batch size", AT_LEAST_ONE),
    Key("ensemble-samples", -1, "posterior samples in the server's predictive ensemble (Bayesian strategies); -1 = "
        "by the model's cost: 32, or 4 for a model of over 2 M multiply-adds per example (server/evaluation.py)",
        Check(lambda value: value >= -1, "must be >= 0, or -1 (by the model's cost)")),
    # the trust boundary (deploy/README.md "Trust model")
    Key("max-payload-mb", 512.0, "larger instructions or replies are refused, by name, before they are decoded",
        POSITIVE),
    Key("max-failed-rounds", 3, "this many consecutive rounds with no accepted reply stop the run, non-zero",
        AT_LEAST_ONE),
    Key("max-clients", 10000, "client ids the federation may ever count (K); a new id beyond this is refused",
        AT_LEAST_ONE),
    Key("max-client-examples", 100000000, "a reply's num_examples must lie in [1, this]",
        Check(lambda value: 1 <= value <= 2**40, "must be in [1, 2^40]")),
    Key("client-identity", "bound", "bound: a client id stays with the node that first presented it; reconnect: it "
        "may move to a new node once its old node has left (insecure loopback)", choices=("bound", "reconnect")),
    Key("client-registry", "", "JSON {client-id: node-id} from `fedbayes pki register --client-id`; only those "
        "pairs are accepted"),
    # per-reply isolation and robust aggregation (deploy/README.md "Trust model")
    Key("screen-ratio", 100.0, "a reply whose update (its change to the state, in the strategy's own parameters) is "
        "longer than this many times the median of the round's other replies, and longer than the state itself, "
        "is refused", Check(lambda value: value >= 1.0, "must be >= 1")),
    Key("robust-aggregation", "none", "none | clip: every reply's update clipped to clip-ratio x the round's median "
        "norm | median, trimmed-mean: coordinate-wise (FedAvg, FedProx, FedDyn, FedPA)",
        choices=("none", "clip", "median", "trimmed-mean")),
    Key("clip-ratio", 3.0, "robust-aggregation=clip: the largest update norm used, as a multiple of the round's median",
        Check(lambda value: value >= 1.0, "must be >= 1")),
    Key("trim-fraction", 0.2, "robust-aggregation=trimmed-mean: the share of replies dropped at each end, per "
        "coordinate", Check(lambda value: 0.0 <= value < 0.5, "must be in [0, 0.5)")),
    Key("max-client-rejections", 3, "a node whose replies are refused this many rounds in a row is quarantined",
        AT_LEAST_ONE),
    Key("quarantine-rounds", 10, "rounds a quarantined node is left out of sampling and scheduling", AT_LEAST_ONE),
    Key("straggler-wait", 0.0, "once half the round's replies are in, wait at most this multiple of the time they "
        "took for the rest (0 = wait up to round-timeout)", NON_NEGATIVE),
    Key("results-exists", "refuse", "what a new federation does with a results-path that already holds rows: "
        "refuse, append or replace", choices=("refuse", "append", "replace")),
    Key("keep-checkpoints", 3, "server checkpoints kept per federation (the newest and earlier rounds')",
        AT_LEAST_ONE),
    Key("resume-from-round", 0, "resume from the kept checkpoint of this round instead of the newest (0 = newest)",
        NON_NEGATIVE),
    Key("tracking", "", '"" = off | mlflow:URI (an MLflow tracking server) | tensorboard:DIR (event files in '
        "DIR/<federation>): the run config, every round's row, the report's figures and the posterior "
        "(server/tracking.py; extras fedbayes[mlflow], fedbayes[tensorboard])",
        Check(lambda value: value == "" or (value.partition(":")[0] in ("mlflow", "tensorboard")  # tracking.KINDS
                                            and value.partition(":")[2] != ""),
              'must be "" (off), mlflow:URI or tensorboard:DIR')),
    # the server's evaluation (server/evaluation.py); 0 = by the model's cost: logreg and the MLP every round on the
    # whole test set on one thread, models of over 2 M multiply-adds per example (the CNNs) every 5th round on a tenth
    # of it (the last round on all of it) on every core
    Key("eval-every", 0, "rounds between the server's evaluations (the last round is always evaluated; the rows of "
        "the others have no test metrics); 0 = by the model's cost: 1, or 5", NON_NEGATIVE),
    Key("eval-fraction", 0.0, "the share of the test set (a fixed subset drawn from the run's seed) evaluated before "
        "the last round, which evaluates all of it; 0 = by the model's cost: 1, or 0.1",
        Check(lambda value: 0.0 <= value <= 1.0, "must be in (0, 1], or 0 (by the model's cost)")),
    Key("eval-threads", 0, "CPU threads of the server's evaluation (at nice 19: it takes the cores clients leave "
        "idle); 0 = by the model's cost: 1, or the cores the ServerApp may use", NON_NEGATIVE),
    Key("eval-batched", False, "evaluate the ensemble's samples as one vmapped model rather than one pass each "
        "(equal to round-off; slower on the CPU, benchmarks/evaluation_cost.py)"),
)


def pyproject_run_config(pyproject: Path | str) -> dict[str, Any]:
    """The run-config keys and defaults a Flower app's pyproject.toml lists ([tool.flwr.app.config])."""
    with open(pyproject, "rb") as file:
        return tomllib.load(file)["tool"]["flwr"]["app"]["config"]


def declared_keys(strategy: str = "") -> dict[str, Key]:
    """Every run-config key by name: the core's, every built-in strategy's, and `strategy`'s when it is one from
    elsewhere. A key several strategies read (prior-precision, max-grad-norm) is declared by each, with the same
    default and type; each says what it means to that strategy."""
    from fedbayes.strategies import algorithm_keys

    keys: dict[str, Key] = {}
    for key in (*CORE_KEYS, *algorithm_keys(strategy)):
        known = keys.setdefault(key.name, key)
        if known.default != key.default or known.type is not key.type:
            raise ConfigError(f"run-config key '{key.name}' is declared twice, with defaults {known.default!r} and "
                              f"{key.default!r}")
    return keys


def default_run_config(strategy: str = "") -> dict[str, Any]:
    """Every key with its default: what a Flower app's [tool.flwr.app.config] lists (`fedbayes app`)."""
    return {name: key.default for name, key in declared_keys(strategy).items()}


class RunSettings:
    """A run's configuration: every declared key, parsed and checked, read as an attribute with `_` for `-`
    (`settings.local_epochs`, `settings.rho`). Both halves parse the same keys with the same checks, so a bad
    value fails loudly on both sides with the key's name in the message. Immutable; `replace` makes a copy."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunSettings:
        keys = declared_keys(str(run_config.get("strategy", "")))
        unknown = sorted(set(run_config) - set(keys))
        if unknown:
            raise ConfigError(f"unknown run-config key(s) {', '.join(unknown)} (`fedbayes strategies` lists them)")
        missing = [name for name in keys if name not in run_config]
        if missing:
            raise ConfigError(f"run config is missing '{missing[0]}'")
        settings = cls({key.attribute: key.parse(run_config[name]) for name, key in keys.items()})
        settings.validate()
        return settings

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):  # copy and pickle probe for these before _values exists
            raise AttributeError(attribute)
        try:
            return self._values[attribute]
        except KeyError:
            raise AttributeError(f"run settings have no key {attribute.replace('_', '-')!r}") from None

    def __setattr__(self, attribute: str, value: Any) -> None:
        raise AttributeError("run settings are immutable; use replace()")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSettings) and self._values == other._values

    def __repr__(self) -> str:
        return f"RunSettings({self._values!r})"

    def replace(self, **changes: Any) -> RunSettings:
        return RunSettings({**self._values, **changes})

    def round_lr(self, server_round: int) -> float:
        """The local learning rate of a round: constant, or cosine-annealed over the rounds."""
        if self.lr_schedule == "constant":
            return self.lr
        progress = (server_round - 1) / max(self.num_server_rounds, 1)
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * progress))

    def validate(self) -> None:
        """What one key cannot check alone: names other modules define, and keys that depend on each other."""
        from fedbayes.tasks.compute import DEVICES
        from fedbayes.tasks.datasets import DATASETS, NPZ_PREFIX
        from fedbayes.tasks.models import ACTIVATIONS, MODELS
        from fedbayes.tasks.partitions import SPLITS

        own_data = self.dataset.startswith(NPZ_PREFIX) and len(self.dataset) > len(NPZ_PREFIX)  # tasks/npzdata.py
        _check("dataset", self.dataset in DATASETS or own_data,
               f"must be one of {', '.join(DATASETS)}, or npz:DIR (a folder of .npz files), got {self.dataset!r}")
        _choice("split", self.split, SPLITS)
        _check_model(self.model, MODELS)
        _choice("activation", self.activation, tuple(ACTIVATIONS))
        _choice("device", self.device, DEVICES)
        _check("fraction", not self.split_file or self.fraction == 1.0,
               "must be 1 with a split-file: the file names every client's rows of the whole training set")


def round_seed(seed: int, server_round: int) -> int:
    """One seed per (run seed, round), the same in every process: the server's node sampling, scheduling and
    posterior samples, and (mixed with a client's id) its minibatch order and noise."""
    return seed * 1_000_003 + server_round


def _coerce(key: str, value: Any, kind: type) -> Any:
    """Flower's TOML parsing gives 1 for `lr=1`; accept ints for floats, nothing else."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"run config '{key}' must be {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):  # TOML has inf and nan; no key of ours means them
        raise ConfigError(f"run config '{key}' must be finite, got {value!r}")
    return value


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"run config '{key}' must be one of {', '.join(choices)}, got {value!r}")


def _check_model(model: str, builtin: tuple[str, ...]) -> None:
    """A built-in model, or "<module>:<callable>" that imports here (tasks/preflight.py also builds it)."""
    from fedbayes.tasks.models import load_model_builder

    if ":" not in model:
        _check("model", model in builtin, f"must be one of {', '.join(builtin)}, or '<module>:<callable>', got {model!r}")
        return
    try:
        load_model_builder(model)
    except ValueError as error:
        raise ConfigError(f"run config 'model': {error}") from None


def _check(key: str, ok: bool, requirement: str) -> None:
    if not ok:
        raise ConfigError(f"run config '{key}' {requirement}")


def _is_safe_name(name: str) -> bool:
    return bool(name) and name.isascii() and all(c.isalnum() or c in "._-" for c in name) and name not in (".", "..")
