"""FedLap-Func's run-config keys: FedLap's and the function-space ones."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.strategies.fedlap.settings import FedLapSettings
from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class FedLapFuncSettings(FedLapSettings):
    """FedLap-Func (Swaroop et al., ICLR 2025, §3.4): FedLap's keys and these."""

    memory_points_per_class: int = key(
        1,
        "M_{k,c}: training inputs each client sends once per class it holds (raw examples; the server keeps them and "
        "sends them to no one); 0 = FedLap exactly",
        NON_NEGATIVE,
    )
    function_weight: float = key(
        0.01,
        "τ_f: memory point i of class c weighs τ_i = τ_f · N_{k,c}/M_{k,c} ([P] App. E; FMNIST grid 1..1e-4)",
        POSITIVE,
    )
    server_fit_steps: int = key(
        5000, "E_g: full-batch Adam steps of the server's fit of w_g ([P] Eq. 17; App. E.5 FMNIST: 5000)", NON_NEGATIVE
    )
    server_fit_lr: float = key(1e-3, "the server fit's Adam learning rate ([P] App. E.5 FMNIST: 1e-3)", POSITIVE)
