"""One module per algorithm, each holding both halves (server Strategy + client update)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flwr.app import RecordDict
from flwr.serverapp.strategy import Strategy

from protos.codec import TensorLayout
from tasks.config import ConfigError, RunSettings


@dataclass(frozen=True)
class Algorithm:
    server: Callable[[RunSettings, TensorLayout], Strategy]
    client_update: Callable[..., RecordDict]  # (content, ClientRuntime) -> reply content


def _registry() -> dict[str, Algorithm]:
    from strategies import bayesadmm, dsvgd, fedavg, feddyn, fedlap, fedpa

    return {
        "fedavg": Algorithm(fedavg.FedAvg, fedavg.client_update),
        "fedprox": Algorithm(fedavg.fedprox, fedavg.client_update),
        "bayesadmm": Algorithm(bayesadmm.BayesADMM, bayesadmm.client_update),
        "fedadmm": Algorithm(bayesadmm.fedadmm, bayesadmm.client_update),
        "bayesadmm-full": Algorithm(bayesadmm.bayesadmm_full, bayesadmm.client_update),
        "feddyn": Algorithm(feddyn.FedDyn, feddyn.client_update),
        "fedlap": Algorithm(fedlap.FedLap, fedlap.client_update),
        "fedlap-cov": Algorithm(fedlap.fedlap_cov, fedlap.client_update),
        "fedpa": Algorithm(fedpa.FedPA, fedpa.client_update),
        "dsvgd": Algorithm(dsvgd.DSVGD, dsvgd.client_update),
        "p-dsvgd": Algorithm(dsvgd.p_dsvgd, dsvgd.client_update),
        "u-dsvgd": Algorithm(dsvgd.DSVGD, dsvgd.client_update),
    }


def get_algorithm(name: str) -> Algorithm:
    registry = _registry()
    if name not in registry:
        raise ConfigError(f"run config 'strategy' must be one of {', '.join(registry)}, got {name!r}")
    return registry[name]


def algorithm_names() -> list[str]:
    return list(_registry())
