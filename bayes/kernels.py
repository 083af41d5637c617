"""Particle methods: SVGD on (N, d) particle sets and Gaussian kernel density estimates of them.

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
    """(M, N) ‖points_m - centres_n‖² as ‖a‖² + ‖c‖² - 2a·c (matrix products: 3x faster than direct
    differences for network-sized particles), after moving the origin to the centres' mean: the round-off
    scales with the squared norms, which this keeps at the particles' spread (about 1e-2 in float32 for
    80k-parameter particles, against 2λ² = 0.6 in the kernels' exponents)."""
    origin = centres.mean(0)
    points, centres = points - origin, centres - origin
    cross = points @ centres.T
    return (points.square().sum(1)[:, None] + centres.square().sum(1)[None, :] - 2 * cross).clamp_min(0)


def rbf_kernel(particles: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The SVGD kernel matrix K[j, n] = k(θ_j, θ_n) and its bandwidth h (median heuristic)."""
    distances = squared_distances(particles, particles)
    median = torch.quantile(distances.flatten().double(), 0.5).item()  # numpy's median, not torch's lower one
    bandwidth = max(median / math.log(particles.shape[0] + 1), MIN_SVGD_BANDWIDTH)
    return torch.exp(-distances / bandwidth), bandwidth


def svgd_direction(particles: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Eq. 8/13: φ(θ_n) = (1/N) Σ_j [k(θ_j, θ_n) ∇log p(θ_j) + ∇_{θ_j} k(θ_j, θ_n)] for every n at once;
    `scores` are ∇log p at the particles. ∇_{θ_j} k(θ_j, θ_n) = (2/h)(θ_n - θ_j) k(θ_j, θ_n)."""
    kernel, bandwidth = rbf_kernel(particles)
    repulsion = (2.0 / bandwidth) * (particles * kernel.sum(1, keepdim=True) - kernel @ particles)
    return (kernel @ scores + repulsion) / particles.shape[0]


def grad_log_kde(points: torch.Tensor, centres: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """∇_θ log KDE(θ) = Σ_n w_n(θ) (c_n - θ) / λ², w = softmax_n(-‖θ - c_n‖² / 2λ²); centres are constants."""
    weights = torch.softmax(-squared_distances(points, centres) / (2 * bandwidth**2), dim=1)
    return (weights @ centres - points) / bandwidth**2


class AdaGradMomentum:
    """The reference code's "AdaGrad with momentum" (an RMSProp-like rule on the SVGD direction Δ):
    G = Δ² at the first step, then G = βG + (1-β)Δ²; θ += lr·Δ / (fudge + √G), elementwise.
    One instance per SVGD loop: its state starts afresh with every loop."""

    def __init__(self, lr: float, beta: float = 0.9, fudge: float = 1e-6) -> None:
        self.lr, self.beta, self.fudge = lr, beta, fudge
        self.squared: torch.Tensor | None = None

    def step(self, particles: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
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
    """`steps` SVGD updates of `particles` towards the density whose score (∇log p, (N, d) -> (N, d)) is `score`."""
    for _ in range(steps):
        particles = stepper.step(particles, svgd_direction(particles, score(particles)))
    return particles
