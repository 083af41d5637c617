"""bayes/kernels.py: SVGD direction, median heuristic, KDE log-density and gradient, step rule."""

import math

import numpy as np
import torch

from fedbayes.bayes.kernels import AdaGradMomentum, grad_log_kde, rbf_kernel, squared_distances, svgd, svgd_direction


def log_kde(points: torch.Tensor, centres: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """log (1/N) Σ_n 𝒩(points_m | centres_n, λ² I) for each of the M points: the density whose gradient
    grad_log_kde is, differentiated by autograd below."""
    dimension = centres.shape[1]
    exponents = -squared_distances(points, centres) / (2 * bandwidth**2)
    normaliser = math.log(centres.shape[0]) + 0.5 * dimension * math.log(2 * math.pi * bandwidth**2)
    return torch.logsumexp(exponents, dim=1) - normaliser


def test_median_heuristic_matches_numpy_over_all_squared_distances():
    particles = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kernel, bandwidth = rbf_kernel(particles)
    x = particles.numpy()
    squared = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    expected_bandwidth = np.median(squared) / math.log(8)  # zero diagonal included, log(N + 1)
    assert math.isclose(bandwidth, expected_bandwidth, rel_tol=1e-12)
    np.testing.assert_allclose(kernel.numpy(), np.exp(-squared / expected_bandwidth), rtol=1e-12)


def test_svgd_direction_matches_autograd_of_the_kernel():
    generator = torch.Generator().manual_seed(1)
    particles = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    scores = torch.randn(6, 4, generator=generator, dtype=torch.float64)
    kernel, bandwidth = rbf_kernel(particles)
    moving = particles.clone().requires_grad_(True)
    expected = torch.zeros_like(particles)
    for n in range(6):
        k_n = torch.exp(-(moving - particles[n]).square().sum(1) / bandwidth)  # k(θ_j, θ_n), j = 0..N-1
        (repulsion,) = torch.autograd.grad(k_n.sum(), moving)  # row j: ∇_{θ_j} k(θ_j, θ_n)
        expected[n] = (k_n.detach()[:, None] * scores).sum(0) + repulsion.sum(0)
    torch.testing.assert_close(svgd_direction(particles, scores), expected / 6, rtol=1e-12, atol=1e-12)


def test_one_particle_svgd_is_gradient_ascent():
    particle = torch.tensor([[0.3, -1.2]], dtype=torch.float64)
    score = torch.tensor([[2.0, 5.0]], dtype=torch.float64)
    torch.testing.assert_close(svgd_direction(particle, score), score)


def test_svgd_samples_a_standard_normal():
    start = 3.0 + 0.5 * torch.randn(100, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    particles = svgd(start, lambda theta: -theta, 1000, AdaGradMomentum(lr=0.05, fudge=1e-6))
    assert particles.mean(0).abs().max() < 0.1
    variance = particles.var(0)
    assert ((variance > 0.9) & (variance < 1.1)).all(), variance


def test_log_kde_is_the_mixture_density_and_its_gradient_matches_autograd():
    generator = torch.Generator().manual_seed(3)
    centres = torch.randn(5, 2, generator=generator, dtype=torch.float64)
    points = torch.randn(4, 2, generator=generator, dtype=torch.float64)
    bandwidth = 0.55
    direct = torch.stack(
        [
            torch.stack(
                [
                    torch.exp(-(p - c).square().sum() / (2 * bandwidth**2)) / (2 * math.pi * bandwidth**2)
                    for c in centres
                ]
            ).mean()
            for p in points
        ]
    ).log()
    torch.testing.assert_close(log_kde(points, centres, bandwidth), direct, rtol=1e-12, atol=1e-12)
    moving = points.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(log_kde(moving, centres, bandwidth).sum(), moving)
    torch.testing.assert_close(grad_log_kde(points, centres, bandwidth), expected, rtol=1e-10, atol=1e-10)


def test_kde_gradient_is_finite_where_the_density_underflows():
    """10,000 dimensions: every kernel value is exp(-thousands) = 0 in float32, the gradient is not."""
    generator = torch.Generator().manual_seed(4)
    centres = torch.randn(3, 10_000, generator=generator)
    points = centres[:1] + 0.3 * torch.randn(1, 10_000, generator=generator)
    gradient = grad_log_kde(points, centres, 0.55)
    assert torch.isfinite(gradient).all() and torch.isfinite(log_kde(points, centres, 0.55)).all()
    # nearest centre dominates: the gradient points back at it
    torch.testing.assert_close(gradient, (centres[:1] - points) / 0.55**2, rtol=1e-4, atol=1e-4)


def test_adagrad_momentum_rule():
    stepper = AdaGradMomentum(lr=0.1, beta=0.9, fudge=1e-6)
    theta = torch.zeros(3, dtype=torch.float64)
    first = torch.tensor([1.0, -4.0, 0.5], dtype=torch.float64)
    theta = stepper.step(theta, first)
    torch.testing.assert_close(theta, 0.1 * first / (1e-6 + first.abs()))  # ≈ lr per coordinate, any scale
    second = torch.tensor([2.0, 0.0, 0.5], dtype=torch.float64)
    squared = 0.9 * first.square() + 0.1 * second.square()
    torch.testing.assert_close(stepper.step(theta, second), theta + 0.1 * second / (1e-6 + squared.sqrt()))


def _particle_sets(trials: int, count: int, dimension: int, seed: int) -> torch.Tensor:
    """`trials` particle sets at different scales, so that each needs its own median-heuristic bandwidth."""
    generator = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-2, 1, trials, dtype=torch.float64)[:, None, None]
    return scales * torch.randn(trials, count, dimension, generator=generator, dtype=torch.float64)


def test_batched_kernel_and_direction_are_the_separate_sets():
    particles = _particle_sets(4, 6, 5, seed=5)
    scores = torch.randn(particles.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    kernels, bandwidths = rbf_kernel(particles)
    directions = svgd_direction(particles, scores)
    assert kernels.shape == (4, 6, 6) and bandwidths.shape == (4,) and directions.shape == particles.shape
    for t in range(4):
        kernel, bandwidth = rbf_kernel(particles[t])
        assert bandwidth.dim() == 0 and math.isclose(bandwidths[t], bandwidth, rel_tol=1e-12)  # bmm vs mm round-off
        torch.testing.assert_close(kernels[t], kernel, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(directions[t], svgd_direction(particles[t], scores[t]), rtol=1e-12, atol=1e-12)


def test_batched_kde_gradient_uses_each_sets_own_centres():
    points, centres = _particle_sets(3, 4, 7, seed=7), _particle_sets(3, 5, 7, seed=8)
    gradients = grad_log_kde(points, centres, 0.55)
    for t in range(3):
        torch.testing.assert_close(gradients[t], grad_log_kde(points[t], centres[t], 0.55), rtol=1e-12, atol=1e-12)


def test_batched_svgd_moves_each_set_as_if_alone():
    """(T, N, d) through 50 AdaGrad-momentum steps towards a KDE-and-Gaussian target per set: T separate runs."""
    start, centres = _particle_sets(3, 6, 4, seed=9), _particle_sets(3, 4, 4, seed=10)

    def score(theta: torch.Tensor, centres: torch.Tensor = centres) -> torch.Tensor:
        return -0.5 * theta + grad_log_kde(theta, centres, 0.55)

    together = svgd(start.clone(), score, 50, AdaGradMomentum(lr=0.05, fudge=1e-9))
    for t in range(3):
        alone = svgd(
            start[t].clone(), lambda theta, t=t: score(theta, centres[t]), 50, AdaGradMomentum(lr=0.05, fudge=1e-9)
        )
        torch.testing.assert_close(together[t], alone, rtol=1e-10, atol=1e-10)
