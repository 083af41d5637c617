"""BayesADMM's run-config keys (also federated ADMM's and bayesadmm-full's)."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class BayesADMMSettings:
    """The defaults are the paper's for FMNIST-10% heterogeneous (Möllenhoff et al., the reference code), except
    IVON's h0 and β2: 0 derives them from each client's data and steps a round (bayes/ivon.py), which gives the
    paper's values on the paper's client and sensible ones on data it never saw (docs/extending/data.md). The
    paper's own values: `--preset bayesadmm-paper`, or hess-init=0.001 beta2=0.9998."""

    rho: float = key(0.2, "ρ: the primal step, the weight of KL(q ‖ q̄) in the client's objective (Eq. 28)", POSITIVE)
    dual_damping: float = key(0.001, "γ/ρ: the dual step is γ = damping·ρ (federated ADMM: γ = ρ)", POSITIVE)
    temperature: float = key(0.001, "τ: the client minimises loss_sum / τ (App. D)", POSITIVE)
    prior_precision: float = key(1.0, "δ: the prior's precision, q̄'s precision at the start (Alg. 1)", POSITIVE)
    hess_init: float = key(
        0.0,
        "IVON's initial Hessian h0; 0: from the client's data, 2 x its mean diagonal GGN per example at q̄'s mean, "
        "raised where that would make the first posterior over 3x as wide as the weights (the paper: 0.001)",
        NON_NEGATIVE,
    )
    beta1: float = key(0.9, "IVON's gradient momentum", MOMENTUM)
    beta2: float = key(
        0.0,
        "IVON's Hessian momentum; 0: from the client's T steps a round, 0.9998^(190/T) (the paper's 0.9998 at its "
        "190 steps)",
        MOMENTUM,
    )
    mc_samples: int = key(1, "IVON's weight samples per step", AT_LEAST_ONE)
    rescale_lr: bool = key(False, "IVON's rescale_lr")
    reset_posterior: bool = key(
        True,
        "start IVON's posterior at q̄ every round (the reference code does); false: at m̄ with the Hessian the client "
        "carried from its last round (with few clients or on the CNNs, where q̄'s precision otherwise collapses; "
        "docs/extending/data.md)",
    )
    noise: str = key(
        "shared",
        "shared: every client draws its minibatch order and IVON's weight noise from one generator seeded with the "
        "run seed, the same in every round (the reference code); independent: per client and round",
        choices=("shared", "independent"),
    )
