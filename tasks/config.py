"""The run configuration shared by the ServerApp and every ClientApp.

Keys and defaults live in pyproject.toml [tool.flwr.app.config]; `flwr run -c` and
`fedbayes local --set` override them. Both halves parse the same keys with the same checks, so a
bad value fails loudly on both sides with the key's name in the message.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

_OPTIMIZERS = ("adam", "sgd")
_LR_SCHEDULES = ("constant", "cosine")
SERVER_OPTIMIZERS = ("sgd", "adam", "adagrad")  # FedPA's SERVEROPT
_DSVGD_SCHEDULERS = ("round-robin", "random")
CLIENT_IDENTITIES = ("bound", "reconnect")
NOISE_MODES = ("shared", "independent")  # BayesADMM's training noise across clients and rounds


class ConfigError(ValueError):
    """A run or node configuration value is missing or invalid."""


def pyproject_run_config(pyproject: Path | str) -> dict[str, Any]:
    """Every run-config key with its default, as pyproject.toml's [tool.flwr.app.config] declares them."""
    with open(pyproject, "rb") as file:
        return tomllib.load(file)["tool"]["flwr"]["app"]["config"]


@dataclass(frozen=True)
class RunSettings:
    strategy: str
    num_server_rounds: int
    federation: str
    results_path: str
    server_state_dir: str
    dataset: str
    data_root: str
    download: bool
    fraction: float
    split: str
    seed: int
    dirichlet_alpha_sizes: float
    dirichlet_alpha_classes: float
    min_client_size: int
    two_class_per_class: int
    split_file: str
    split_file_overlap: bool
    model: str
    hidden: str
    activation: str
    pool: int
    local_epochs: int
    batch_size: int
    lr: float
    optimizer: str
    weight_decay: float
    device: str
    input_scale: float
    fraction_train: float
    proximal_mu: float
    rho: float
    dual_damping: float
    temperature: float
    prior_precision: float
    hess_init: float
    beta1: float
    beta2: float
    mc_samples: int
    rescale_lr: bool
    reset_posterior: bool
    lr_schedule: str
    ensemble_samples: int
    noise: str
    # FedDyn / FedLap / FedLap-Cov (../shared/specs/feddyn-fedlap-splits.md): FedDyn's local weight decay is
    # `weight-decay`, FedLap's prior precision δ is `prior-precision`.
    feddyn_alpha: float
    max_grad_norm: float
    min_clients: int
    wait_for_clients: int
    wait_for_clients_timeout: float
    round_timeout: float
    poll_interval: float
    max_payload_mb: float
    max_failed_rounds: int
    max_clients: int
    max_client_examples: int
    client_identity: str
    client_registry: str
    eval_batch_size: int
    # FedPA (../shared/specs/fedpa.md §7)
    burn_in_rounds: int
    samples: int
    local_burnin_epochs: int
    shrinkage: float
    server_optimizer: str
    server_lr: float
    server_momentum: float
    server_beta1: float
    server_beta2: float
    server_eps: float
    server_adagrad_init: float
    # DSVGD / P-DSVGD (../shared/specs/dsvgd.md §8)
    particles: int
    kde_bandwidth: float
    local_steps: int
    distill_steps: int
    server_steps: int
    svgd_lr: float
    distill_lr: float
    svgd_beta: float
    svgd_fudge: float
    dsvgd_alpha: float
    dsvgd_scheduler: str
    udsvgd_max_visits: int

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> RunSettings:
        values = {}
        for field in fields(cls):
            key = field.name.replace("_", "-")
            if key not in run_config:
                raise ConfigError(f"run config is missing '{key}'")
            values[field.name] = _coerce(key, run_config[key], field.type)
        settings = cls(**values)
        settings.validate()
        return settings

    def round_lr(self, server_round: int) -> float:
        """The local learning rate of a round: constant, or cosine-annealed over the rounds."""
        if self.lr_schedule == "constant":
            return self.lr
        progress = (server_round - 1) / max(self.num_server_rounds, 1)
        return 0.5 * self.lr * (1.0 + math.cos(math.pi * progress))

    def validate(self) -> None:
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
        _choice("optimizer", self.optimizer, _OPTIMIZERS)
        _choice("device", self.device, DEVICES)
        _choice("lr-schedule", self.lr_schedule, _LR_SCHEDULES)
        _check("num-server-rounds", self.num_server_rounds >= 1, "must be >= 1")
        _check("fraction", 0.0 < self.fraction <= 1.0, "must be in (0, 1]")
        _check("fraction", not self.split_file or self.fraction == 1.0,
               "must be 1 with a split-file: the file names every client's rows of the whole training set")
        _check("fraction-train", 0.0 < self.fraction_train <= 1.0, "must be in (0, 1]")
        _check("local-epochs", self.local_epochs >= 1, "must be >= 1")
        _check("batch-size", self.batch_size >= 1, "must be >= 1")
        _check("eval-batch-size", self.eval_batch_size >= 1, "must be >= 1")
        _check("lr", self.lr > 0.0, "must be > 0")
        _check("weight-decay", self.weight_decay >= 0.0, "must be >= 0")
        _check("proximal-mu", self.proximal_mu >= 0.0, "must be >= 0")
        _check("input-scale", self.input_scale > 0.0, "must be > 0")
        _check("pool", self.pool >= 1, "must be >= 1")
        for key, value in (("rho", self.rho), ("dual-damping", self.dual_damping), ("temperature", self.temperature),
                           ("prior-precision", self.prior_precision), ("hess-init", self.hess_init)):
            _check(key, value > 0.0, "must be > 0")
        _check("beta1", 0.0 <= self.beta1 < 1.0, "must be in [0, 1)")
        _check("beta2", 0.0 <= self.beta2 < 1.0, "must be in [0, 1)")
        _check("mc-samples", self.mc_samples >= 1, "must be >= 1")
        _check("ensemble-samples", self.ensemble_samples >= 0, "must be >= 0")
        _choice("noise", self.noise, NOISE_MODES)
        _check("feddyn-alpha", self.feddyn_alpha > 0.0, "must be > 0")
        _check("max-grad-norm", self.max_grad_norm >= 0.0, "must be >= 0 (0 = no clipping)")
        _check("min-clients", self.min_clients >= 1, "must be >= 1")
        _check("wait-for-clients", self.wait_for_clients >= 0, "must be >= 0")
        _check("round-timeout", self.round_timeout > 0.0, "must be > 0")
        _check("poll-interval", self.poll_interval > 0.0, "must be > 0")
        _check("max-payload-mb", self.max_payload_mb > 0.0, "must be > 0")
        _check("max-failed-rounds", self.max_failed_rounds >= 1, "must be >= 1")
        _check("max-clients", self.max_clients >= 1, "must be >= 1")
        _check("max-client-examples", 1 <= self.max_client_examples <= 2**40, "must be in [1, 2^40]")
        _choice("client-identity", self.client_identity, CLIENT_IDENTITIES)
        # "" = the ServerApp names a new federation at start (server/app.py); resuming one always names it.
        _check("federation", self.federation == "" or _is_safe_name(self.federation),
               'must be "" (a new federation) or match [A-Za-z0-9._-]+')
        # FedPA
        _check("burn-in-rounds", self.burn_in_rounds >= 0, "must be >= 0")
        _check("samples", self.samples >= 1, "must be >= 1")
        _check("local-burnin-epochs", self.local_burnin_epochs >= 0, "must be >= 0")
        _check("shrinkage", math.isfinite(self.shrinkage) and self.shrinkage >= 0.0, "must be finite and >= 0")
        _choice("server-optimizer", self.server_optimizer, SERVER_OPTIMIZERS)
        _check("server-lr", self.server_lr > 0.0, "must be > 0")
        _check("server-momentum", 0.0 <= self.server_momentum < 1.0, "must be in [0, 1)")
        _check("server-beta1", 0.0 <= self.server_beta1 < 1.0, "must be in [0, 1)")
        _check("server-beta2", 0.0 <= self.server_beta2 < 1.0, "must be in [0, 1)")
        _check("server-eps", self.server_eps > 0.0, "must be > 0")
        _check("server-adagrad-init", self.server_adagrad_init >= 0.0, "must be >= 0")
        # DSVGD / P-DSVGD
        _check("particles", self.particles >= 1, "must be >= 1")
        for key, value in (("local-steps", self.local_steps), ("distill-steps", self.distill_steps),
                           ("server-steps", self.server_steps)):
            _check(key, value >= 0, "must be >= 0")
        for key, value in (("kde-bandwidth", self.kde_bandwidth), ("svgd-lr", self.svgd_lr),
                           ("distill-lr", self.distill_lr), ("svgd-fudge", self.svgd_fudge),
                           ("dsvgd-alpha", self.dsvgd_alpha)):
            _check(key, value > 0.0, "must be > 0")
        _check("svgd-beta", 0.0 <= self.svgd_beta < 1.0, "must be in [0, 1)")
        _choice("dsvgd-scheduler", self.dsvgd_scheduler, _DSVGD_SCHEDULERS)
        _check("udsvgd-max-visits", self.udsvgd_max_visits >= 1, "must be >= 1")


def round_seed(seed: int, server_round: int) -> int:
    """One seed per (run seed, round), the same in every process: the server's node sampling, scheduling and
    posterior samples, and (mixed with a client's id) its minibatch order and noise."""
    return seed * 1_000_003 + server_round


def _coerce(key: str, value: Any, annotation: str) -> Any:
    """Flower's TOML parsing gives 1 for `lr=1`; accept ints for floats, nothing else."""
    kind = {"int": int, "float": float, "str": str, "bool": bool}[annotation]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"run config '{key}' must be {annotation}, got {value!r}")
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
    return bool(name) and all(c.isalnum() or c in "._-" for c in name) and name not in (".", "..")
