"""The registry of strategies: their names, their halves and their run-config keys.

A built-in strategy is a package, fedbayes.strategies.<name>: settings.py (its run-config keys), math.py (what both
halves compute), server.py (its server half) and client.py (its client half). The registry names each half by
"<module>:<attribute>" and imports it only when asked for that half, so a client never imports server code.

Strategies from elsewhere plug in without editing this package (README "Write your own strategy"):
  - `strategy = "<module>:<attribute>"`: an `Algorithm` in any module importable by the server and every client
    (e.g. on PYTHONPATH, which `fedbayes local` passes on to every process it starts);
  - an installed package's entry point in the group `fedbayes.strategies` (name -> "<module>:<attribute>").
"""

from __future__ import annotations

if __name__ != "fedbayes.strategies":  # fedbayes/strategies is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.strategies, not {__name__}")

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from fedbayes.strategies.bayesadmm.settings import BayesADMMSettings
from fedbayes.strategies.dsvgd.settings import DSVGDSettings
from fedbayes.strategies.fedavg.settings import FedProxSettings
from fedbayes.strategies.feddyn.settings import FedDynSettings
from fedbayes.strategies.fedlap.settings import FedLapSettings
from fedbayes.strategies.fedlap_func.settings import FedLapFuncSettings
from fedbayes.strategies.fedpa.settings import FedPASettings
from fedbayes.tasks import config
from fedbayes.tasks.config import ConfigError, Key, NoHyperparameters, RunSettings, keys_of

if TYPE_CHECKING:  # reading the registry (`fedbayes strategies`, the Flower app's keys) needs no torch
    from fedbayes.bayes.params import TensorLayout

ENTRY_POINT_GROUP = "fedbayes.strategies"


@dataclass(frozen=True)
class Algorithm:
    """A strategy: its two halves and its hyperparameters.

    server    the server half, a `fedbayes.strategies.base.ServerStrategy` subclass (built with the run's settings and
              the model's layouts), or "<module>:<attribute>" naming it: the server imports it when it needs it
    client    the client half (a `fedbayes.client.core.ClientHalf`), or "<module>:<attribute>" naming it
    settings  the frozen dataclass of the run-config keys it reads besides the core's, each field declared with
              `fedbayes.tasks.config.key` (`fedbayes strategies` lists them); the server half reads them typed with
              `RunSettings.hyperparameters(settings)`
    lr_schedule  the learning-rate schedule of a run whose `lr-schedule` is auto (the default): constant or cosine
    """

    server: Callable[..., Any] | str
    client: Callable[..., Any] | str
    settings: type = NoHyperparameters
    lr_schedule: str = "constant"

    def __post_init__(self) -> None:
        if self.lr_schedule not in config.LR_SCHEDULES:
            raise ValueError(
                f"Algorithm lr_schedule must be {' or '.join(map(repr, config.LR_SCHEDULES))}, got {self.lr_schedule!r}"
            )

    @property
    def hyperparameters(self) -> tuple[Key, ...]:
        """The run-config keys `settings` declares."""
        return keys_of(self.settings)

    def server_half(self) -> Callable[..., Any]:
        """The server half, imported if `server` names it.

        Returns:
            The ServerStrategy subclass (or any callable building one from settings and layouts).

        Raises:
            ImportError: the named module cannot be imported.
            AttributeError: it has no such attribute.
        """
        return _resolved(self.server)

    def client_half(self) -> Callable[..., Any]:
        """The client half, imported if `client` names it.

        Returns:
            The ClientHalf (called with a message's content and the client's runtime).

        Raises:
            ImportError: the named module cannot be imported.
            AttributeError: it has no such attribute.
        """
        return _resolved(self.client)

    def build_server(
        self, settings: RunSettings, layout: TensorLayout, buffer_layout: TensorLayout | None = None
    ) -> Any:
        """The server half for this run: the class `server` names, built for the model's parameters (`layout`) and
        buffers; it reads its own keys typed from `settings` as this algorithm's `settings`.

        Args:
            settings: the run's settings.
            layout: the model's parameters.
            buffer_layout: the model's buffers (BatchNorm statistics); None for none.

        Returns:
            The server half.

        Raises:
            ImportError: the named module cannot be imported.
            AttributeError: it has no such attribute.
        """
        return self.server_half()(settings, layout, buffer_layout)


def _resolved(half: Callable[..., Any] | str) -> Callable[..., Any]:
    if not isinstance(half, str):
        return half
    module, _, attribute = half.partition(":")
    return getattr(importlib.import_module(module), attribute)


def _builtin_halves(package: str, server: str, client: str = "client_update") -> tuple[str, str]:
    return f"fedbayes.strategies.{package}.server:{server}", f"fedbayes.strategies.{package}.client:{client}"


BUILTIN = {
    "fedavg": Algorithm(*_builtin_halves("fedavg", "FedAvg")),
    "fedprox": Algorithm(*_builtin_halves("fedavg", "FedProx"), FedProxSettings),
    # cosine: the paper's schedule, and the one tuning chose on FMNIST (docs/results/compare.md "The defaults")
    "bayesadmm": Algorithm(*_builtin_halves("bayesadmm", "BayesADMM"), BayesADMMSettings, lr_schedule="cosine"),
    "fedadmm": Algorithm(*_builtin_halves("bayesadmm", "FedADMM"), BayesADMMSettings),
    "bayesadmm-full": Algorithm(*_builtin_halves("bayesadmm", "BayesADMMFull"), BayesADMMSettings),
    "feddyn": Algorithm(*_builtin_halves("feddyn", "FedDyn"), FedDynSettings),
    "fedlap": Algorithm(*_builtin_halves("fedlap", "FedLap"), FedLapSettings),
    "fedlap-cov": Algorithm(*_builtin_halves("fedlap", "FedLapCov"), FedLapSettings),
    "fedlap-func": Algorithm(*_builtin_halves("fedlap_func", "FedLapFunc"), FedLapFuncSettings),
    "fedpa": Algorithm(*_builtin_halves("fedpa", "FedPA"), FedPASettings),
    "dsvgd": Algorithm(*_builtin_halves("dsvgd", "DSVGD"), DSVGDSettings),
    "p-dsvgd": Algorithm(*_builtin_halves("dsvgd", "PDSVGD"), DSVGDSettings),
    "u-dsvgd": Algorithm(*_builtin_halves("dsvgd", "UDSVGD"), DSVGDSettings),
}


def algorithm_keys(strategy: str = "") -> list[Key]:
    """The hyperparameters of every built-in strategy, and of `strategy` when it is one from elsewhere (only that
    one is loaded: an unrelated broken plugin must not break every run). An unknown or unloadable `strategy` is
    a ConfigError naming it, here, before its keys could be mistaken for unknown ones.

    Args:
        strategy: the run's `strategy`; "" or a built-in name adds nothing.

    Returns:
        The keys, built-in strategies' first; a key several strategies share appears once per strategy.

    Raises:
        ConfigError: `strategy` is unknown or cannot be loaded (get_algorithm).
    """
    keys = [key for algorithm in BUILTIN.values() for key in algorithm.hyperparameters]
    if strategy and strategy not in BUILTIN:
        keys += get_algorithm(strategy).hyperparameters
    return keys


def declared_keys(strategy: str = "") -> dict[str, Key]:
    """Every run-config key by name: the core's, every built-in strategy's, and `strategy`'s when it is one from
    elsewhere.

    Args:
        strategy: the run's `strategy`; "" or a built-in name adds nothing.

    Returns:
        Name -> its Key.

    Raises:
        ConfigError: `strategy` is unknown or cannot be loaded, or two declarations of one key disagree
            (tasks/config.py merge_keys).

    Examples:
        >>> rho = declared_keys()["rho"]
        >>> rho.default, rho.parse(2)  # an int where a float is declared is that float
        (0.2, 2.0)
        >>> rho.parse(-1)
        Traceback (most recent call last):
        ...
        fedbayes.tasks.config.ConfigError: run config 'rho' must be > 0
    """
    return config.merge_keys(algorithm_keys(strategy))


def default_run_config(strategy: str = "") -> dict[str, Any]:
    """Every key with its default: what a Flower app's [tool.flwr.app.config] lists (`fedbayes app`).

    Args:
        strategy: the run's `strategy`; "" or a built-in name adds nothing.

    Returns:
        Key name -> default value.

    Raises:
        ConfigError: as declared_keys.
    """
    return {name: key.default for name, key in declared_keys(strategy).items()}


def run_settings(run_config: Mapping[str, Any]) -> RunSettings:
    """`run_config` parsed and checked against the core keys and those of every built-in strategy and of the run's
    own strategy (RunSettings.from_run_config), with `lr-schedule` auto made the strategy's own (`Algorithm`).

    Args:
        run_config: the run config, key -> value.

    Returns:
        The settings.

    Raises:
        ConfigError: the run's `strategy` is unknown or cannot be loaded, a key is unknown or missing, or a value is
            invalid.

    Examples:
        >>> base = default_run_config()
        >>> run_settings({**base, "strategy": "bayesadmm"}).lr_schedule, run_settings(base).lr_schedule
        ('cosine', 'constant')
    """
    settings = RunSettings.from_run_config(run_config, algorithm_keys(str(run_config.get("strategy", ""))))
    if settings.lr_schedule != "auto":
        return settings
    return settings.replace(lr_schedule=get_algorithm(settings.strategy).lr_schedule)


def _installed() -> dict[str, str]:
    """Strategies other packages declare: name -> "<module>:<attribute>"."""
    return {entry.name: entry.value for entry in entry_points(group=ENTRY_POINT_GROUP)}


def load_algorithm(reference: str) -> Algorithm:
    """The `Algorithm` at "<module>:<attribute>".

    Args:
        reference: "<module>:<attribute>".

    Returns:
        The Algorithm there.

    Raises:
        ConfigError: the module cannot be imported, has no such attribute, or it is not an Algorithm.
    """
    module_name, _, attribute = reference.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(
            f"run config 'strategy': cannot load {reference!r}: {error} (the module must be "
            "importable on the server and on every client, e.g. on PYTHONPATH)"
        ) from None
    if not isinstance(found, Algorithm):
        raise ConfigError(
            f"run config 'strategy': {reference!r} is {found!r}, not a fedbayes.strategies.Algorithm(server, client)"
        )
    return found


def get_algorithm(name: str) -> Algorithm:
    """The strategy called `name`: a built-in one, an installed package's (entry point), or "<module>:<attribute>".

    Args:
        name: a built-in strategy's name, an entry point's name in the group `fedbayes.strategies`, or
            "<module>:<attribute>".

    Returns:
        The Algorithm.

    Raises:
        ConfigError: `name` is none of these, or what it names cannot be loaded or is not an Algorithm.

    Examples:
        >>> algorithm = get_algorithm("bayesadmm")
        >>> [key.name for key in algorithm.hyperparameters][:3]
        ['rho', 'dual-damping', 'temperature']
        >>> get_algorithm("fedsgd")
        Traceback (most recent call last):
        ...
        fedbayes.tasks.config.ConfigError: run config 'strategy' must be one of fedavg, ... got 'fedsgd'
    """
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" in name:
        return load_algorithm(name)
    installed = _installed()
    if name in installed:
        return load_algorithm(installed[name])
    raise ConfigError(
        f"run config 'strategy' must be one of {', '.join(algorithm_names())} or '<module>:<attribute>', got {name!r}"
    )


def algorithm_names() -> list[str]:
    """The built-in strategies, then those installed packages declare.

    Returns:
        Their names, built-in ones in registry order.

    Examples:
        >>> algorithm_names()[:4]
        ['fedavg', 'fedprox', 'bayesadmm', 'fedadmm']
    """
    return [*BUILTIN, *_installed()]
