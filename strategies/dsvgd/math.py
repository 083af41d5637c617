"""DSVGD's math: the two SVGD loops, U-DSVGD's update, the forget steps (Forget-SVGD), P-DSVGD's server distillation,
Θ^(0)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedbayes.bayes.kernels import AdaGradMomentum, grad_log_kde, svgd
from fedbayes.bayes.params import TensorLayout

Score = Callable[[torch.Tensor], torch.Tensor]  # (N, P) particles -> (N, P) gradients


@dataclass(frozen=True)
class SVGDSettings:
    local_steps: int  # L
    distill_steps: int  # L'
    kde_bandwidth: float  # λ
    lr: float
    distill_lr: float
    beta: float = 0.9
    fudge: float = 1e-6
    alpha: float = 1.0  # temperature

    def stepper(self, lr: float) -> AdaGradMomentum:
        """A fresh AdaGrad-with-momentum stepper for one SVGD loop, at step size `lr`.

        Args:
            lr: the loop's step size (`lr` or `distill_lr`).

        Returns:
            The stepper, with this setting's β and fudge.
        """
        return AdaGradMomentum(lr, self.beta, self.fudge)


def gaussian_prior_score(precision: float) -> Score:
    """∇log p_0 for p_0 = N(0, I/precision).

    Args:
        precision: the prior's precision, 1 / variance.

    Returns:
        The score, (N, P) particles -> (N, P) gradients.
    """
    return lambda theta: -precision * theta


def tilted_update(
    downloaded: torch.Tensor, local: torch.Tensor, prior_score: Score, loss_gradient: Score, settings: SVGDSettings
) -> torch.Tensor:
    """Loop 1 (eqs. 13-14, convention B): L SVGD steps from Θ^(i-1) towards
    q^(i-1)/s_k^(i-1) · p_0 · exp(-L_k/α). The KDE centres stay at the downloaded particles and the stored
    local particles while the particles move.

    Args:
        downloaded: Θ^(i-1), the global particles downloaded, (N, P).
        local: the client's stored local particles, (N, P).
        prior_score: ∇log p_0.
        loss_gradient: ∇L_k, the gradient of the client's loss at each particle.
        settings: the SVGD settings (L, λ, lr, α, ...).

    Returns:
        Θ^(i), the updated global particles, (N, P).
    """
    bandwidth = settings.kde_bandwidth

    def score(theta: torch.Tensor) -> torch.Tensor:
        return (
            grad_log_kde(theta, downloaded, bandwidth)
            - grad_log_kde(theta, local, bandwidth)
            + prior_score(theta)
            - loss_gradient(theta) / settings.alpha
        )

    return svgd(downloaded.clone(), score, settings.local_steps, settings.stepper(settings.lr))


def distill(
    local: torch.Tensor, downloaded: torch.Tensor, updated: torch.Tensor, settings: SVGDSettings
) -> torch.Tensor:
    """Loop 2 (eq. 17): L' SVGD steps of the local particles towards t_k^(i) ∝ q^(i)/q^(i-1) · t_k^(i-1), the
    three KDEs centred on Θ^(i), Θ^(i-1) and a frozen copy of the old local particles.

    Args:
        local: the client's stored local particles, (N, P).
        downloaded: Θ^(i-1), (N, P).
        updated: Θ^(i) from `tilted_update`, (N, P).
        settings: the SVGD settings (L', λ, distill_lr, ...).

    Returns:
        The new local particles, (N, P).
    """
    bandwidth = settings.kde_bandwidth

    def score(theta: torch.Tensor) -> torch.Tensor:
        return (
            grad_log_kde(theta, updated, bandwidth)
            - grad_log_kde(theta, downloaded, bandwidth)
            + grad_log_kde(theta, local, bandwidth)
        )

    return svgd(local.clone(), score, settings.distill_steps, settings.stepper(settings.distill_lr))


def agent_round(
    downloaded: torch.Tensor, local: torch.Tensor, prior_score: Score, loss_gradient: Score, settings: SVGDSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scheduled client's round: (new global particles to upload, new local particles to keep).

    Args:
        downloaded: Θ^(i-1), the global particles downloaded, (N, P).
        local: the client's stored local particles, (N, P).
        prior_score: ∇log p_0.
        loss_gradient: ∇L_k, the gradient of the client's loss at each particle.
        settings: the SVGD settings.

    Returns:
        Θ^(i) and the new local particles, each (N, P).
    """
    updated = tilted_update(downloaded, local, prior_score, loss_gradient, settings)
    return updated, distill(local, downloaded, updated, settings)


@dataclass(frozen=True)
class Visit:
    """A round j an U-DSVGD agent was scheduled in: the global particles it downloaded, Θ^(j-1) (None for
    Θ^(0), whose density is q^(0) = p_0), and the ones it uploaded, Θ^(j)."""

    before: torch.Tensor | None
    after: torch.Tensor


def global_score(particles: torch.Tensor | None, prior_score: Score, bandwidth: float) -> Score:
    """∇log q^(j): p_0's score for q^(0) (`particles` None), else that of the KDE of Θ^(j).

    Args:
        particles: Θ^(j), (N, P), or None for Θ^(0).
        prior_score: ∇log p_0.
        bandwidth: λ, the KDE bandwidth.

    Returns:
        The score ∇log q^(j).
    """
    if particles is None:
        return prior_score
    return lambda theta: grad_log_kde(theta, particles, bandwidth)


def unconstrained_tilted_update(
    downloaded: torch.Tensor,
    downloaded_is_initial: bool,
    visits: list[Visit],
    prior_score: Score,
    loss_gradient: Score,
    settings: SVGDSettings,
) -> torch.Tensor:
    """U-DSVGD's round (Alg. 4 lines 3-12, eqs. 13-14): L SVGD steps from Θ^(i-1) towards
    q^(i-1)/t_k^(i-1) · exp(-L_k/α), with ∇log t_k^(i-1) = Σ_{j∈I_k} [∇log q^(j) - ∇log q^(j-1)] (eq. 10 as a
    product over the agent's earlier visits; eq. 15 is its recursion) and q^(0) = p_0.

    Args:
        downloaded: Θ^(i-1), the global particles downloaded, (N, P).
        downloaded_is_initial: whether `downloaded` is Θ^(0), whose density is p_0.
        visits: the agent's earlier visits I_k.
        prior_score: ∇log p_0.
        loss_gradient: ∇L_k, the gradient of the client's loss at each particle.
        settings: the SVGD settings.

    Returns:
        Θ^(i), (N, P).
    """
    bandwidth = settings.kde_bandwidth
    current = global_score(None if downloaded_is_initial else downloaded, prior_score, bandwidth)
    factors = [
        (global_score(v.after, prior_score, bandwidth), global_score(v.before, prior_score, bandwidth)) for v in visits
    ]

    def score(theta: torch.Tensor) -> torch.Tensor:
        log_factor = sum((after(theta) - before(theta) for after, before in factors), torch.zeros_like(theta))
        return current(theta) - log_factor - loss_gradient(theta) / settings.alpha

    return svgd(downloaded.clone(), score, settings.local_steps, settings.stepper(settings.lr))


def no_loss(theta: torch.Tensor) -> torch.Tensor:
    """∇L_k ≡ 0: a tilted update with the client's loss left out (forgetting needs no data).

    Args:
        theta: the particles, (N, P).

    Returns:
        Zeros, shape of `theta`.
    """
    return torch.zeros_like(theta)


def forget_update(
    particles: torch.Tensor, local: torch.Tensor, prior_score: Score, settings: SVGDSettings
) -> torch.Tensor:
    """Forget-SVGD for DSVGD (Gong, Simeone, Kassab & Kang, arXiv 2111.12056): L SVGD steps from the global particles Θ
    towards q/t_k, the global posterior without client k's factor, run by client k from its stored local particles.
    It is loop 1 (DSVGD eqs. 13-14, convention B) with the loss left out: q · p_0 / s_k with s_k = KDE(local) ≈ p_0·t_k
    is q/t_k = p_0 Π_{j≠k} t_j. At DSVGD's fixed point t_k ∝ exp(-L_k/α), so this is also q·exp(L_k/α), the target
    that would need the client's data; this one needs only its stored factor.

    Args:
        particles: the global particles Θ, (N, P).
        local: client k's stored local particles, (N, P).
        prior_score: ∇log p_0.
        settings: the SVGD settings.

    Returns:
        The particles without client k's factor, (N, P).
    """
    return tilted_update(particles, local, prior_score, no_loss, settings)


def unconstrained_forget_update(
    particles: torch.Tensor, visits: list[Visit], prior_score: Score, settings: SVGDSettings
) -> torch.Tensor:
    """Forget-SVGD for U-DSVGD: L SVGD steps from Θ towards q/t_k with t_k = Π_{j∈I_k} q^(j)/q^(j-1) over the agent's
    visits (eq. 10): U-DSVGD's update (Alg. 4, eqs. 13-14) with the loss left out. Θ is never Θ^(0) here (forgetting
    needs an accepted round), so q is the KDE of Θ.

    Args:
        particles: the global particles Θ, (N, P); not Θ^(0).
        visits: the agent's visits I_k.
        prior_score: ∇log p_0.
        settings: the SVGD settings.

    Returns:
        The particles without client k's factor, (N, P).
    """
    return unconstrained_tilted_update(particles, False, visits, prior_score, no_loss, settings)


def server_distillation(
    particles: torch.Tensor, local_sets: list[torch.Tensor], prior_score: Score, steps: int, settings: SVGDSettings
) -> torch.Tensor:
    """P-DSVGD (eqs. 28-29): `steps` SVGD steps of φ towards p_0 Π_k t_k over the clients that reported a set,
    where each set approximates p_0·t_k (convention B): ∇log q = ∇log p_0 + Σ_k [∇log KDE(Θ_k) - ∇log p_0].

    Args:
        particles: φ, the particles the server moves, (N, P).
        local_sets: the reported sets Θ_k, each (N, P).
        prior_score: ∇log p_0.
        steps: the number of SVGD steps.
        settings: the SVGD settings (λ, distill_lr, ...).

    Returns:
        The distilled particles, (N, P).
    """
    bandwidth = settings.kde_bandwidth

    def score(theta: torch.Tensor) -> torch.Tensor:
        prior = prior_score(theta)
        return prior + sum(grad_log_kde(theta, local, bandwidth) - prior for local in local_sets)

    return svgd(particles.clone(), score, steps, settings.stepper(settings.distill_lr))


def initial_particles(layout: TensorLayout, count: int, seed: int) -> np.ndarray:
    """Θ^(0), (count, P) float32: each particle drawn like torch's default initialiser of Linear and Conv layers,
    weight and bias ~ U(±1/√fan_in) (fan_in = the weight's size over its first axis); normalisation parameters
    (GroupNorm, FRN) take their constant initial values (scale 1, shift and threshold 0) in every particle.
    Deterministic in `seed`, so the server and every client draw the same.

    Args:
        layout: the model's parameter layout, names ending in .weight, .bias, .gamma, .beta or .tau.
        count: N, the number of particles.
        seed: the seed of the draw.

    Returns:
        Θ^(0), (count, P) float32.

    Raises:
        ValueError: a parameter is none of a Linear, Conv, GroupNorm or FRN layer's.
    """
    generator = torch.Generator().manual_seed(seed)
    inits = {name: _initialiser(name, layout) for name in layout}
    particles = []
    for _ in range(count):
        pieces = []
        for name, shape in layout.items():
            kind, value = inits[name]
            if kind == "uniform":
                pieces.append((torch.rand(math.prod(shape), generator=generator) * 2 - 1) * value)
            else:
                pieces.append(torch.full((math.prod(shape),), value))
        particles.append(torch.cat(pieces))
    return torch.stack(particles).numpy()


def _initialiser(name: str, layout: TensorLayout) -> tuple[str, float]:
    """("uniform", 1/√fan_in) for a Linear/Conv weight (≥ 2 axes) or its bias; ("constant", c) for a normalisation
    parameter."""
    layer, _, kind = name.rpartition(".")
    weight_shape = layout.get(f"{layer}.weight", ())
    if kind in ("weight", "bias") and len(weight_shape) >= 2:
        return "uniform", 1.0 / math.sqrt(math.prod(weight_shape[1:]))
    if kind in ("weight", "gamma"):
        return "constant", 1.0
    if kind in ("bias", "beta", "tau"):
        return "constant", 0.0
    raise ValueError(f"initial_particles knows Linear, Conv, GroupNorm and FRN parameters, got {name} {layout[name]}")


VARIANTS = ("dsvgd", "p-dsvgd", "u-dsvgd")
