"""Particle methods: SVGD on (N, d) particle sets and Gaussian kernel density estimates of them.

Every function also takes a batch of independent particle sets, shape (..., N, d) (e.g. (T, N, d) for T trials run
at once): each set has its own median-heuristic bandwidth and its own KDE. A single (N, d) set gives the same bits as
before batching was added (the federations' determinism rests on it).

Two different kernels (docs/algorithms/dsvgd.md):
- the SVGD kernel k(x, x') = exp(-‖x - x'‖² / h), h = med² / log(N + 1) (median heuristic; med² is the
  median of all N x N squared distances, zero diagonal included, as in the reference code; recomputed
  from the particles being moved at every step);
- the KDE kernel 𝒦(θ, c) = 𝒩(θ | c, λ² I) with λ the KDE bandwidth, a standard deviation.

Log-densities of a KDE underflow at once in many dimensions (‖θ - c‖²/2λ² is in the hundreds), so
they are computed with logsumexp and their gradients in the softmax form.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

MIN_SVGD_BANDWIDTH = 1e-12  # all particles equal (N = 1, or collapse): k = 1, no repulsion


def squared_distances(points: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """(..., M, N) ‖points_m - centres_n‖² for points (..., M, d) and centres (..., N, d), as ‖a‖² + ‖c‖² - 2a·c
    (matrix products: 3x faster than direct differences for network-sized particles), after moving the origin to the
    centres' mean: the round-off scales with the squared norms, which this keeps at the particles' spread (about 1e-2
    in float32 for 80k-parameter particles, against 2λ² = 0.6 in the kernels' exponents).

    Args:
        points: (..., M, d).
        centres: (..., N, d), the batch shape of `points`.

    Returns:
        The squared distances, (..., M, N), >= 0.
    """
    origin = centres.mean(-2, keepdim=True)
    points, centres = points - origin, centres - origin
    cross = points @ centres.mT
    return (points.square().sum(-1)[..., :, None] + centres.square().sum(-1)[..., None, :] - 2 * cross).clamp_min(0)


def rbf_kernel(particles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The SVGD kernel matrices K[..., j, n] = k(θ_j, θ_n), (..., N, N), of particles (..., N, d), and their
    bandwidths h (median heuristic), float64 of the batch shape (...) (0-dim for one set).

    Args:
        particles: (..., N, d).

    Returns:
        The kernel matrices (..., N, N) in the particles' dtype, and the bandwidths h, float64 (...).
    """
    distances = squared_distances(particles, particles)
    # numpy's median (torch.quantile interpolates; torch.median takes the lower one), in float64
    median = torch.quantile(distances.flatten(-2).double(), 0.5, dim=-1)
    bandwidth = (median / math.log(particles.shape[-2] + 1)).clamp_min(MIN_SVGD_BANDWIDTH)
    # h rounded to the particles' dtype, then divided: what dividing by h as a Python float did
    return torch.exp(-distances / bandwidth.to(distances.dtype)[..., None, None]), bandwidth


def svgd_direction(particles: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Eq. 8/13: φ(θ_n) = (1/N) Σ_j [k(θ_j, θ_n) ∇log p(θ_j) + ∇_{θ_j} k(θ_j, θ_n)] for every n at once, in every set
    of particles (..., N, d); `scores` (..., N, d) are ∇log p at the particles.
    ∇_{θ_j} k(θ_j, θ_n) = (2/h)(θ_n - θ_j) k(θ_j, θ_n).

    Args:
        particles: (..., N, d).
        scores: ∇log p at the particles, (..., N, d).

    Returns:
        φ at every particle, (..., N, d).
    """
    kernel, bandwidth = rbf_kernel(particles)
    factor = (2.0 / bandwidth).to(particles.dtype)[..., None, None]  # 2/h in float64, then rounded, as before
    repulsion = factor * (particles * kernel.sum(-1, keepdim=True) - kernel @ particles)
    return (kernel @ scores + repulsion) / particles.shape[-2]


def grad_log_kde(points: torch.Tensor, centres: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """∇_θ log KDE(θ) = Σ_n w_n(θ) (c_n - θ) / λ², w = softmax_n(-‖θ - c_n‖² / 2λ²), at points (..., M, d) for
    the KDE of centres (..., N, d) (each set of points against its own set of centres); centres are constants.

    Args:
        points: θ, (..., M, d).
        centres: c, (..., N, d), the batch shape of `points`.
        bandwidth: λ, the KDE kernel's standard deviation.

    Returns:
        The gradients, (..., M, d).
    """
    weights = torch.softmax(-squared_distances(points, centres) / (2 * bandwidth**2), dim=-1)
    return (weights @ centres - points) / bandwidth**2


class AdaGradMomentum:
    """The reference code's "AdaGrad with momentum" (an RMSProp-like rule on the SVGD direction Δ):
    G = Δ² at the first step, then G = βG + (1-β)Δ²; θ += lr·Δ / (fudge + √G), elementwise.
    One instance per SVGD loop: its state starts afresh with every loop."""

    def __init__(self, lr: float, beta: float = 0.9, fudge: float = 1e-6) -> None:
        self.lr, self.beta, self.fudge = lr, beta, fudge
        self.squared: torch.Tensor | None = None

    def step(self, particles: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        """One step of the rule: G updated with `direction`, then the moved particles.

        Args:
            particles: θ, any shape.
            direction: the SVGD direction Δ, shape of `particles`.

        Returns:
            θ + lr·Δ / (fudge + √G), shape of `particles`.
        """
        if self.squared is None:
            self.squared = direction.square()
        else:
            self.squared = self.beta * self.squared + (1 - self.beta) * direction.square()
        return particles + self.lr * direction / (self.fudge + self.squared.sqrt())


def svgd(
    particles: torch.Tensor,
    score: Callable[[torch.Tensor], torch.Tensor],
    steps: int,
    stepper: AdaGradMomentum,
) -> torch.Tensor:
    """`steps` SVGD updates of `particles` (..., N, d) towards the density whose score (∇log p,
    (..., N, d) -> (..., N, d)) is `score`; a batch of sets moves independently.

    Args:
        particles: the start, (..., N, d).
        score: ∇log p, (..., N, d) -> (..., N, d).
        steps: the number of updates.
        stepper: the step rule, fresh for this loop.

    Returns:
        The moved particles, (..., N, d).
    """
    for _ in range(steps):
        particles = stepper.step(particles, svgd_direction(particles, score(particles)))
    return particles
