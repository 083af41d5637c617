"""FedLap's and FedLap-Cov's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, Check, key

DAMPING = Check(lambda value: 0.0 <= value <= 1.0, "must be in [0, 1] (0: the paper's rule)")


@dataclass(frozen=True)
class FedLapSettings:
    """FedLap and FedLap-Cov (Swaroop et al., ICLR 2025)."""

    prior_precision: float = key(1.0, "δ: the prior's precision (paper grid 1..1e-4)", POSITIVE)
    max_grad_norm: float = key(0.0, "clip local gradients at this norm; 0 = off", NON_NEGATIVE)
    site_damping: float = key(
        0.0,
        "ρ_k, how far each site moves to its new value in a round ([P] Eq. 21); 0 = the paper's rule: N_k/N for "
        "FedLap, 1/K for FedLap-Cov",
        DAMPING,
    )
    site_damping_rule: str = key(
        "curvature",
        "FedLap-Cov: curvature = ρ_k on the cavity's share of the local precision only, the client's own curvature's "
        "share takes its whole step (docs/algorithms/fedlap.md); paper = ρ_k on every coordinate. FedLap has no "
        "curvature: both are the paper's rule",
        choices=("curvature", "paper"),
    )
