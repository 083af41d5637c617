"""FedLap's and FedLap-Cov's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class FedLapSettings:
    """FedLap and FedLap-Cov (Swaroop et al., ICLR 2025)."""

    prior_precision: float = key(1.0, "δ: the prior's precision (paper grid 1..1e-4)", POSITIVE)
    max_grad_norm: float = key(0.0, "clip local gradients at this norm; 0 = off", NON_NEGATIVE)
