"""FedPA's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class FedPASettings:
    """Rounds 1..burn-in-rounds are FedAvg rounds; each later round runs local-burnin-epochs discarded epochs, then
    `samples` epochs, each averaged into one IASG sample (Al-Shedivat et al., ICLR 2021; the released code)."""

    burn_in_rounds: int = key(10, "rounds of FedAvg before sampling starts", NON_NEGATIVE)
    samples: int = key(4, "ℓ: IASG samples per sampling round, one per epoch", AT_LEAST_ONE)
    local_burnin_epochs: int = key(
        1, "epochs discarded at the start of a sampling round (the released code: 1)", NON_NEGATIVE
    )
    shrinkage: float = key(0.01, "ρ of Thm 3; the identity weight is ρ_ℓ = 1/(1 + (ℓ-1)ρ)", NON_NEGATIVE)
    server_optimizer: str = key(
        "sgd", "the server's optimizer on the averaged delta", choices=("sgd", "adam", "adagrad")
    )
    server_lr: float = key(1.0, "the server optimizer's learning rate", POSITIVE)
    server_momentum: float = key(0.0, "sgd's momentum", MOMENTUM)
    server_beta1: float = key(0.9, "adam's β1", MOMENTUM)
    server_beta2: float = key(0.99, "adam's β2", MOMENTUM)
    server_eps: float = key(0.001, "τ of adam and adagrad", POSITIVE)
    server_adagrad_init: float = key(
        0.1, "adagrad's initial accumulator (Keras' default, as the released code)", NON_NEGATIVE
    )
