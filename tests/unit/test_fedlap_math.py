"""FedLap and FedLap-Cov update rules against closed forms (docs/algorithms/fedlap.md
T1, T2, T5, T6), with exact local solves on the shared convex problem and a random (non-zero) w_0."""

import numpy as np
import pytest
import torch

from fedbayes.strategies.fedlap.math import Site, cavity, client_damping, global_from_sites
from tests.support.problems import fedlap_round, make_problem, relative_error, run_fedlap


@pytest.mark.parametrize(("covariance", "rounds"), [(False, 250), (True, 80)])
def test_fixed_point_is_the_map_with_the_prior_at_zero(covariance, rounds):
    problem, delta = make_problem("logistic", seed=3), 5.0
    target = problem.optimum(delta)
    mean, precision, sites, locals_ = run_fedlap(problem, delta, covariance, rounds)
    assert relative_error(mean.numpy(), target) < 1e-6
    assert max(relative_error(local.numpy(), target) for local in locals_) < 1e-6
    # T6: the site is the linearisation of the client's loss at w*: v_k − V_k∘w* = −∇ℓ_k(w*), V_k = diag H_k(w*).
    for k, site in enumerate(sites):
        np.testing.assert_allclose((site.mean - site.precision * mean).numpy(), -problem.grad(k, target), atol=1e-5)
        if covariance:
            np.testing.assert_allclose(site.precision.numpy(), np.diag(problem.hess(k, target)), rtol=1e-5)
    if covariance:  # S_g → δ + Σ_k diag H_k(w*), the diagonal Laplace precision
        laplace = delta + sum(np.diag(problem.hess(k, target)) for k in range(len(sites)))
        np.testing.assert_allclose(precision.numpy(), laplace, rtol=1e-5)


def test_fedlap_server_step_is_the_weighted_average_when_the_dampings_sum_to_one():
    problem, delta = make_problem("logistic", seed=4), 2.0
    _, _, sites, _ = run_fedlap(problem, delta, covariance=False, rounds=3)  # non-trivial sites, Σ v_k = δ w_g
    new_sites, locals_, _ = fedlap_round(problem, sites, delta, covariance=False)
    rhos = [client_damping(False, size, 4, sum(problem.sizes)) for size in problem.sizes]
    assert sum(rhos) == pytest.approx(1.0)
    new_mean, new_precision = global_from_sites(
        torch.stack([s.mean for s in new_sites]).sum(0), torch.stack([s.precision for s in new_sites]).sum(0), delta
    )
    torch.testing.assert_close(new_mean, sum(rho * local for rho, local in zip(rhos, locals_)), rtol=1e-12, atol=1e-12)
    assert torch.all(new_precision == delta)


def test_fedlap_cov_server_step_is_precision_weighted_averaging_with_rho_one_over_k():
    problem, delta = make_problem("ridge", seed=5), 1.0
    _, _, sites, _ = run_fedlap(problem, delta, covariance=True, rounds=2)
    new_sites, locals_, local_precisions = fedlap_round(problem, sites, delta, covariance=True)
    new_mean, new_precision = global_from_sites(
        torch.stack([s.mean for s in new_sites]).sum(0), torch.stack([s.precision for s in new_sites]).sum(0), delta
    )
    stacked = torch.stack(local_precisions)
    torch.testing.assert_close(new_precision, stacked.mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        new_mean, (stacked * torch.stack(locals_)).sum(0) / stacked.sum(0), rtol=1e-10, atol=1e-12
    )
    assert all((site.precision >= 0).all() for site in new_sites) and (stacked > 0).all()


def test_cavity_is_the_global_without_the_site_and_never_below_the_prior():
    global_mean, global_precision = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 1.0 + 1e-9])
    site = Site(torch.tensor([0.5, 0.0]), torch.tensor([2.0, 1.0]))
    anchor, precision = cavity(global_mean, global_precision, site, prior_precision=1.0)
    torch.testing.assert_close(precision, torch.tensor([1.0, 1.0]))  # the second clamps rounding to δ
    torch.testing.assert_close(anchor, torch.tensor([(3.0 - 0.5) / 1.0, -2.0 * (1.0 + 1e-9)]))
