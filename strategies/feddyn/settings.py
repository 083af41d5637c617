"""FedDyn's run-config keys. Its local weight decay is the core's `weight-decay` (paper grid 1e-4..1e-6)."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class FedDynSettings:
    """FedDyn (Acar et al., 2021), as its official code runs it."""

    feddyn_alpha: float = key(0.01, "α; client k uses α_k = α·N/(K·N_k) (paper FMNIST grid 1e-2..1e-6)", POSITIVE)
    max_grad_norm: float = key(
        0.0, "clip local gradients at this norm; 0 = off (the official FedDyn code: 10)", NON_NEGATIVE
    )
