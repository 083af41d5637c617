"""Gaussian natural/expectation parameters in all three covariance shapes."""

import pytest
import torch

from fedbayes.bayes.gaussian import Gaussian, scaled_identity, solve


def random_spd(size, generator):
    a = torch.randn(size, size, generator=generator, dtype=torch.float64)
    return a @ a.T + size * torch.eye(size, dtype=torch.float64)


def families(generator):
    mean = torch.randn(4, generator=generator, dtype=torch.float64)
    return [
        Gaussian(mean, torch.tensor(2.5, dtype=torch.float64)),
        Gaussian(mean, torch.rand(4, generator=generator, dtype=torch.float64) + 0.5),
        Gaussian(mean, random_spd(4, generator)),
    ]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_natural_and_expectation_parameters_against_the_dense_gaussian(index):
    """η = (S m, −S/2) and μ = (m, E[x xᵀ] = m mᵀ + S⁻¹), summed to what each family keeps (its diagonal, its trace)."""
    q = families(torch.Generator().manual_seed(index))[index]
    size = q.mean.numel()
    dense = q.precision * torch.eye(size, dtype=torch.float64) if q.precision.ndim < 2 else q.precision
    dense = torch.diag(q.precision) if q.precision.ndim == 1 else dense
    second_moment = torch.outer(q.mean, q.mean) + torch.linalg.inv(dense)
    eta1, eta2 = q.natural()
    torch.testing.assert_close(eta1, dense @ q.mean)
    torch.testing.assert_close(eta2, -0.5 * q.precision)
    mu1, mu2 = q.expectation()
    torch.testing.assert_close(mu1, q.mean)
    expected = {0: second_moment.trace(), 1: second_moment.diagonal(), 2: second_moment}[index]
    torch.testing.assert_close(mu2, expected)


def test_natural_parameters_by_hand():
    q = Gaussian(torch.tensor([1.0, -2.0]), torch.tensor([4.0, 0.5]))
    eta1, eta2 = q.natural()
    torch.testing.assert_close(eta1, torch.tensor([4.0, -1.0]))
    torch.testing.assert_close(eta2, torch.tensor([-2.0, -0.25]))
    mu1, mu2 = q.expectation()
    torch.testing.assert_close(mu2, torch.tensor([1.0 + 0.25, 4.0 + 2.0]))
    full = Gaussian(torch.tensor([1.0, 0.0]), torch.tensor([[2.0, 0.0], [0.0, 4.0]]))
    torch.testing.assert_close(full.expectation()[1], torch.tensor([[1.5, 0.0], [0.0, 0.25]]))
    iso = Gaussian(torch.tensor([1.0, 2.0]), torch.tensor(2.0))
    assert iso.expectation()[1].item() == pytest.approx(5.0 + 2 / 2.0)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_samples_have_the_right_moments(index):
    generator = torch.Generator().manual_seed(10 + index)
    q = families(generator)[index]
    samples = q.sample(200_000, generator)
    torch.testing.assert_close(samples.mean(0), q.mean, atol=0.02, rtol=0)
    covariance = torch.cov(samples.T)
    if q.kind == "full":
        expected = torch.linalg.inv(q.precision)
    elif q.kind == "diagonal":
        expected = torch.diag(1 / q.precision)
    else:
        expected = torch.eye(4, dtype=torch.float64) / q.precision
    torch.testing.assert_close(covariance, expected, atol=0.02, rtol=0.03)


def test_solve_and_identity_follow_the_shape():
    matrix = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    torch.testing.assert_close(matrix @ solve(matrix, torch.tensor([1.0, 2.0])), torch.tensor([1.0, 2.0]))
    torch.testing.assert_close(solve(torch.tensor([2.0, 4.0]), torch.tensor([1.0, 2.0])), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(scaled_identity(matrix, 0.5), 0.5 * torch.eye(2))
    torch.testing.assert_close(scaled_identity(torch.ones(3), 0.5), torch.full((3,), 0.5))


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="precision"):
        Gaussian(torch.zeros(3), torch.ones(2))
