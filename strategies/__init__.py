"""One module per algorithm, each holding both halves (server Strategy + client update), and the registry that
names them. Strategies from elsewhere plug in without editing this package (README "Write your own strategy"):
  - `strategy = "<module>:<attribute>"`: an `Algorithm` in any module importable by the server and every client
    (e.g. on PYTHONPATH, which `fedbayes local` passes on to every process it starts);
  - an installed package's entry point in the group `fedbayes.strategies` (name -> "<module>:<attribute>").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

from flwr.app import RecordDict

from fedbayes.protos.codec import TensorLayout
from fedbayes.tasks.config import ConfigError, Key, RunSettings

ENTRY_POINT_GROUP = "fedbayes.strategies"


@dataclass(frozen=True)
class Algorithm:
    """A strategy: its two halves and its hyperparameters. `server(settings, layout)` returns a
    `fedbayes.strategies.base.WireStrategy`; `client_update(content, runtime)` turns an instruction's content into
    the reply's content on a client (a `fedbayes.client.core.ClientHalf`); `hyperparameters` are the run-config
    keys it reads besides the core's (`fedbayes.tasks.config.Key`), listed by `fedbayes strategies`."""

    server: Callable[[RunSettings, TensorLayout], object]
    client_update: Callable[..., RecordDict]  # (content, ClientRuntime) -> reply content
    hyperparameters: tuple[Key, ...] = ()


def _builtin() -> dict[str, Algorithm]:
    from fedbayes.strategies import bayesadmm, dsvgd, fedavg, feddyn, fedlap, fedpa

    return {
        "fedavg": Algorithm(fedavg.FedAvg, fedavg.client_update),
        "fedprox": Algorithm(fedavg.fedprox, fedavg.client_update, fedavg.FEDPROX_HYPERPARAMETERS),
        "bayesadmm": Algorithm(bayesadmm.BayesADMM, bayesadmm.client_update, bayesadmm.HYPERPARAMETERS),
        "fedadmm": Algorithm(bayesadmm.fedadmm, bayesadmm.client_update, bayesadmm.HYPERPARAMETERS),
        "bayesadmm-full": Algorithm(bayesadmm.bayesadmm_full, bayesadmm.client_update, bayesadmm.HYPERPARAMETERS),
        "feddyn": Algorithm(feddyn.FedDyn, feddyn.client_update, feddyn.HYPERPARAMETERS),
        "fedlap": Algorithm(fedlap.FedLap, fedlap.client_update, fedlap.HYPERPARAMETERS),
        "fedlap-cov": Algorithm(fedlap.fedlap_cov, fedlap.client_update, fedlap.HYPERPARAMETERS),
        "fedpa": Algorithm(fedpa.FedPA, fedpa.client_update, fedpa.HYPERPARAMETERS),
        "dsvgd": Algorithm(dsvgd.DSVGD, dsvgd.client_update, dsvgd.HYPERPARAMETERS),
        "p-dsvgd": Algorithm(dsvgd.p_dsvgd, dsvgd.client_update, dsvgd.HYPERPARAMETERS),
        "u-dsvgd": Algorithm(dsvgd.u_dsvgd, dsvgd.client_update, dsvgd.HYPERPARAMETERS),
    }


def algorithm_keys(strategy: str = "") -> list[Key]:
    """The hyperparameters of every built-in strategy, and of `strategy` when it is one from elsewhere (only that
    one is loaded: an unrelated broken plugin must not break every run). An unknown or unloadable `strategy` is
    a ConfigError naming it, here, before its keys could be mistaken for unknown ones."""
    keys = [key for algorithm in _builtin().values() for key in algorithm.hyperparameters]
    if strategy and strategy not in _builtin():
        keys += get_algorithm(strategy).hyperparameters
    return keys


def _installed() -> dict[str, str]:
    """Strategies other packages declare: name -> "<module>:<attribute>"."""
    return {entry.name: entry.value for entry in entry_points(group=ENTRY_POINT_GROUP)}


def load_algorithm(reference: str) -> Algorithm:
    """The `Algorithm` at "<module>:<attribute>"; a ConfigError naming `strategy` when it is not one."""
    module_name, _, attribute = reference.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ConfigError(f"run config 'strategy': cannot load {reference!r}: {error} (the module must be "
                          "importable on the server and on every client, e.g. on PYTHONPATH)") from None
    if not isinstance(found, Algorithm):
        raise ConfigError(f"run config 'strategy': {reference!r} is {found!r}, not a "
                          "fedbayes.strategies.Algorithm(server, client_update)")
    return found


def get_algorithm(name: str) -> Algorithm:
    builtin = _builtin()
    if name in builtin:
        return builtin[name]
    if ":" in name:
        return load_algorithm(name)
    installed = _installed()
    if name in installed:
        return load_algorithm(installed[name])
    raise ConfigError(f"run config 'strategy' must be one of {', '.join(algorithm_names())} or "
                      f"'<module>:<attribute>', got {name!r}")


def algorithm_names() -> list[str]:
    return [*_builtin(), *_installed()]
