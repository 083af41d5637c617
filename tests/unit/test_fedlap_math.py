"""FedLap and FedLap-Cov update rules against closed forms (docs/algorithms/fedlap.md
T1, T2, T5, T6), with exact local solves on the shared convex problem and a random (non-zero) w_0."""

import numpy as np
import pytest
import torch

from fedbayes.strategies.fedlap.math import (
    Site,
    cavity,
    client_damping,
    curvature_damping,
    global_from_sites,
    site_step,
)
from tests.support.problems import fedlap_round, make_problem, relative_error, run_fedlap


@pytest.mark.parametrize(
    ("covariance", "rounds", "curvature_rule"), [(False, 250, False), (True, 80, False), (True, 80, True)]
)
def test_fixed_point_is_the_map_with_the_prior_at_zero(covariance, rounds, curvature_rule):
    problem, delta = make_problem("logistic", seed=3), 5.0
    target = problem.optimum(delta)
    mean, precision, sites, locals_ = run_fedlap(problem, delta, covariance, rounds, curvature_rule=curvature_rule)
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


def test_site_damping_replaces_the_papers_rule_where_set():
    assert client_damping(True, 30, 3, 100) == pytest.approx(1 / 3)
    assert client_damping(False, 30, 3, 100) == pytest.approx(0.3)
    assert client_damping(True, 30, 3, 100, site_damping=0.8) == 0.8
    assert client_damping(False, 30, 3, 100, site_damping=1.0) == 1.0


def test_fedlap_cov_with_site_damping_one_is_the_posterior_after_one_round_on_diagonal_quadratics():
    """PVI with ρ = 1 (Ashman et al., 2022): for ℓ_k(w) = ½ w·H_k w − b_k·w with diagonal H_k, each client's tilted
    optimum makes its site exact (v_k = b_k, V_k = H_k), so after one round from the consistent init q_g is the
    posterior N((δ + Σ H_k)⁻¹ Σ b_k, diag(δ + Σ H_k)⁻¹), whatever w_0. The paper's ρ = 1/K is not there yet."""
    rng, clients, dim, delta = np.random.default_rng(7), 3, 5, 0.7
    curvatures = [torch.from_numpy(rng.uniform(0.5, 5.0, dim)) for _ in range(clients)]
    linear = [torch.from_numpy(rng.normal(size=dim)) for _ in range(clients)]
    w0 = torch.from_numpy(rng.normal(size=dim))
    sites = [Site(delta * w0 / clients, torch.zeros(dim)) for _ in range(clients)]

    def one_round(site_damping: float) -> tuple[torch.Tensor, torch.Tensor]:
        mean, precision = global_from_sites(sum(s.mean for s in sites), sum(s.precision for s in sites), delta)
        new_sites = []
        for site, curvature, b in zip(sites, curvatures, linear):
            anchor, cavity_precision = cavity(mean, precision, site, delta)
            local = (b + cavity_precision * anchor) / (curvature + cavity_precision)  # the tilted optimum
            rho = client_damping(True, 10, clients, 0, site_damping)
            new_sites.append(site_step(site, local, curvature, mean, precision, rho, 1))
        return global_from_sites(sum(s.mean for s in new_sites), sum(s.precision for s in new_sites), delta)

    posterior_precision = delta + sum(curvatures)
    mean, precision = one_round(site_damping=1.0)
    torch.testing.assert_close(precision, posterior_precision, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mean, sum(linear) / posterior_precision, rtol=1e-10, atol=1e-12)
    _, paper_precision = one_round(site_damping=0.0)
    assert (paper_precision < posterior_precision - 1.0).all()


def test_curvature_damping_is_rho_on_the_cavitys_share_and_the_whole_step_on_the_clients_own():
    """ρ + (1 − ρ)·H/(H + P), coordinate by coordinate: ρ where the client has no curvature (FedLap, a flat
    direction), halfway to 1 where H = P, nearly 1 where its own curvature dominates."""
    curvature, cavity_precision = torch.tensor([0.0, 2.0, 2e6]), torch.tensor([2.0, 2.0, 2.0])
    rho = curvature_damping(0.25, curvature, cavity_precision)
    torch.testing.assert_close(rho, torch.tensor([0.25, 0.625, 0.25 + 0.75 * 2e6 / (2e6 + 2.0)]))
    assert torch.equal(curvature_damping(1.0, curvature, cavity_precision), torch.ones(3))


def test_curvature_rule_moves_flat_coordinates_by_the_clients_mean_step_and_curved_ones_nearly_to_the_posterior():
    """Parallel PVI's double counting: on a coordinate where every client's loss is linear (ℓ_k = −g_k·w, no
    curvature) the tilted optimum is m_k + g_k/P_k, and with ρ = 1 the global moves by the SUM of the K clients'
    steps; the curvature rule moves it by their mean, as the paper's 1/K does. On a coordinate where every client's
    quadratic curvature dwarfs the prior's, it takes nearly the whole PVI step to the posterior, which 1/K does not."""
    rng, clients, delta = np.random.default_rng(11), 4, 1.0
    curvature = [torch.tensor([0.0, h]) for h in rng.uniform(1e3, 2e3, clients)]  # [flat, strongly curved]
    linear = [torch.from_numpy(rng.normal(size=2)) for _ in range(clients)]
    w0 = torch.from_numpy(rng.normal(size=2))
    sites = [Site(delta * w0 / clients, torch.zeros(2)) for _ in range(clients)]
    mean, precision = global_from_sites(sum(s.mean for s in sites), sum(s.precision for s in sites), delta)

    def one_round(site_damping: float, curvature_rule: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        new_sites, steps = [], []
        for site, h, b in zip(sites, curvature, linear):
            anchor, cavity_precision = cavity(mean, precision, site, delta)
            local = (b + cavity_precision * anchor) / (h + cavity_precision)  # the tilted optimum
            rho = client_damping(True, 10, clients, 0, site_damping)
            if curvature_rule:
                rho = curvature_damping(rho, h, cavity_precision)
            new_sites.append(site_step(site, local, h, mean, precision, rho, 1))
            steps.append(local - mean)
        new_mean, _ = global_from_sites(sum(s.mean for s in new_sites), sum(s.precision for s in new_sites), delta)
        return new_mean, steps

    full_step, steps = one_round(site_damping=1.0, curvature_rule=False)
    curvature_step, _ = one_round(site_damping=0.0, curvature_rule=True)
    paper_step, _ = one_round(site_damping=0.0, curvature_rule=False)
    torch.testing.assert_close(full_step[0] - mean[0], sum(s[0] for s in steps), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(curvature_step[0] - mean[0], sum(s[0] for s in steps) / clients, rtol=1e-12, atol=1e-12)
    posterior = sum(b[1] for b in linear) / (delta + sum(h[1] for h in curvature))
    assert abs(curvature_step[1] - posterior) < 1e-2 * abs(paper_step[1] - posterior)


def test_cavity_is_the_global_without_the_site_and_never_below_the_prior():
    global_mean, global_precision = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 1.0 + 1e-9])
    site = Site(torch.tensor([0.5, 0.0]), torch.tensor([2.0, 1.0]))
    anchor, precision = cavity(global_mean, global_precision, site, prior_precision=1.0)
    torch.testing.assert_close(precision, torch.tensor([1.0, 1.0]))  # the second clamps rounding to δ
    torch.testing.assert_close(anchor, torch.tensor([(3.0 - 0.5) / 1.0, -2.0 * (1.0 + 1e-9)]))
