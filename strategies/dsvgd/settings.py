"""DSVGD's, P-DSVGD's and U-DSVGD's run-config keys."""

from __future__ import annotations

from dataclasses import dataclass

from fedbayes.tasks.config import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class DSVGDSettings:
    """The defaults are the paper's BNN values (Kassab & Simeone, Sec. 7), but its prior precision is e: set
    prior-precision=2.718 for that, and DSVGD's KDE bandwidth is 1.5 instead of its 0.55 (the server's
    `DSVGD.default_kde_bandwidth`). Particles hold all model parameters: a payload is particles x P float32."""

    particles: int = key(20, "N, global and local particles alike (payload: N x P float32)", AT_LEAST_ONE)
    kde_bandwidth: float = key(
        0.0, "λ, the std of the Gaussian KDE kernel; 0: the variant's (DSVGD 1.5, P-/U-DSVGD 0.55)", NON_NEGATIVE
    )
    local_steps: int = key(200, "L: SVGD steps towards the tilted distribution (eq. 13-14)", NON_NEGATIVE)
    distill_steps: int = key(200, "L': SVGD steps distilling the client's local particles (eq. 17)", NON_NEGATIVE)
    server_steps: int = key(200, "L_s: P-DSVGD's server distillation steps (eq. 29)", NON_NEGATIVE)
    svgd_lr: float = key(
        0.001, "AdaGrad-with-momentum learning rate of loop 1 (over the rounds as `lr-schedule` sets)", POSITIVE
    )
    distill_lr: float = key(
        0.001, "... of loop 2 (over the rounds as `lr-schedule` sets) and of the P-DSVGD server", POSITIVE
    )
    svgd_beta: float = key(0.9, "momentum of the squared-direction average", MOMENTUM)
    svgd_fudge: float = key(1e-6, "smoothing term of the step rule", POSITIVE)
    dsvgd_alpha: float = key(1.0, "α, the temperature of the Gibbs posterior (1 = Bayes)", POSITIVE)
    prior_precision: float = key(1.0, "the prior p_0 = N(0, I / prior-precision)", POSITIVE)
    dsvgd_scheduler: str = key("round-robin", "which client a DSVGD round schedules", choices=("round-robin", "random"))
    udsvgd_max_visits: int = key(
        16, "U-DSVGD: the visits an agent may keep (2·N·P float32 each); more is refused", AT_LEAST_ONE
    )
