"""FedProx's run-config key; FedAvg reads the core keys alone."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import NON_NEGATIVE, key


@dataclass(frozen=True)
class FedProxSettings:
    """FedProx: the clients add μ/2·‖w − w_g‖² to their loss (FedAvg is μ = 0)."""

    proximal_mu: float = key(0.01, "FedProx: μ of the clients' proximal term μ/2·‖w − w_g‖²", NON_NEGATIVE)
