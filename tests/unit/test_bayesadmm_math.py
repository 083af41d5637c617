"""BayesADMM's updates against closed forms: Prop. 3.2, federated ADMM (Eqs. 21-25), dual signs."""

import math

import pytest
import torch

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.strategies.bayesadmm.math import (
    COLLAPSE_SHARE,
    Duals,
    added_precision_share,
    collapse_warning,
    dual_step,
    newton_client_step,
    prior_weight,
    reply_effect,
    server_natural,
    server_step,
    unit_precision,
)
from tests.support.problems import ridge_problem

DTYPE = torch.float64


def squared_loss(x, y):
    return lambda theta: 0.5 * (x @ theta - y).square().sum()


def one_round(data, global_, all_duals, rho, delta, server_round):
    """Every client solves its subproblem exactly (one VON step on a quadratic), dual step, server step."""
    locals_ = []
    for k, (x, y) in enumerate(data):
        local = newton_client_step(squared_loss(x, y), global_, all_duals[k], rho, start=global_)
        all_duals[k] = dual_step(all_duals[k], local, global_, rho, server_round)
        locals_.append(local)
    return server_step(locals_, all_duals, rho, delta), locals_


def test_prop_3_2_full_covariance_gives_the_centralised_posterior_in_one_round():
    data = ridge_problem()
    features, delta = 4, 0.7
    rho = 1.0 / len(data)
    x = torch.cat([d[0] for d in data])
    y = torch.cat([d[1] for d in data])
    precision = x.T @ x + delta * torch.eye(features, dtype=DTYPE)
    centralised_mean = torch.linalg.solve(precision, x.T @ y)
    prior = Gaussian(torch.zeros(features, dtype=DTYPE), delta * torch.eye(features, dtype=DTYPE))
    duals = [Duals(torch.zeros(features, dtype=DTYPE), torch.zeros(features, features, dtype=DTYPE)) for _ in data]
    global_, _ = one_round(data, prior, duals, rho, delta, 1)
    torch.testing.assert_close(global_.mean, centralised_mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(global_.precision, precision, rtol=1e-6, atol=0)
    # The duals are the clients' natural gradients (Eq. 9): v_k = X_k^T y_k, U_k = X_k^T X_k.
    for (xk, yk), dual in zip(data, duals):
        torch.testing.assert_close(dual.mean, xk.T @ yk)
        torch.testing.assert_close(dual.precision, xk.T @ xk)


def federated_admm_reference(data, rho, delta, rounds):
    """Eqs. 21-23 written out directly, with ℓ_0 = δ/2 ‖θ‖² (Eq. 24 generalised)."""
    features = data[0][0].shape[1]
    theta_bar = torch.zeros(features, dtype=DTYPE)
    v = [torch.zeros(features, dtype=DTYPE) for _ in data]
    history = []
    for _ in range(rounds):
        thetas = []
        for k, (x, y) in enumerate(data):
            # Eq. 21: argmin ½‖Xθ - y‖² + v·θ + ρ/2 ‖θ - θ̄‖²
            theta = torch.linalg.solve(
                x.T @ x + rho * torch.eye(features, dtype=DTYPE), x.T @ y - v[k] + rho * theta_bar
            )
            v[k] = v[k] + rho * (theta - theta_bar)  # Eq. 22
            thetas.append(theta)
        # Eq. 23: argmin δ/2‖θ̄‖² + Σ ρ/2‖θ̄ - θ_k‖² - v_k·θ̄
        theta_bar = (rho * sum(thetas) + sum(v)) / (delta + rho * len(data))
        history.append((theta_bar.clone(), [t.clone() for t in thetas], [d.clone() for d in v]))
    return history


@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_isotropic_family_is_federated_admm_step_by_step(delta):
    data = ridge_problem(seed=1)
    rho, features = 0.5, 4
    reference = federated_admm_reference(data, rho, delta, rounds=4)
    global_ = Gaussian(torch.zeros(features, dtype=DTYPE), torch.tensor(1.0, dtype=DTYPE))
    duals = [Duals(torch.zeros(features, dtype=DTYPE), torch.tensor(0.0, dtype=DTYPE)) for _ in data]
    for server_round, (theta_bar, thetas, v) in enumerate(reference, start=1):
        global_, locals_ = one_round(data, global_, duals, rho, delta, server_round)
        global_ = Gaussian(global_.mean, torch.tensor(1.0, dtype=DTYPE))  # fixed unit covariance
        for local, theta, dual, v_k in zip(locals_, thetas, duals, v):
            torch.testing.assert_close(local.mean, theta)
            torch.testing.assert_close(dual.mean, v_k)
        torch.testing.assert_close(global_.mean, theta_bar)
    if delta == 1.0:  # Eq. 25 literally: θ̄ = (1-α) Mean(θ_k) + α Sum(v_k)
        alpha = 1 / (1 + rho * len(data))
        torch.testing.assert_close(
            global_.mean, (1 - alpha) * torch.stack(thetas).mean(0) + alpha * torch.stack(v).sum(0)
        )


def test_plain_federated_admm_is_not_exact_after_one_round():
    data = ridge_problem()
    delta, rho = 0.7, 1.0 / 3
    x = torch.cat([d[0] for d in data])
    y = torch.cat([d[1] for d in data])
    centralised = torch.linalg.solve(x.T @ x + delta * torch.eye(4, dtype=DTYPE), x.T @ y)
    (theta_bar, _, _), *_ = federated_admm_reference(data, rho, delta, rounds=1)
    assert (theta_bar - centralised).norm() / centralised.norm() > 0.05


def test_dual_step_and_server_step_signs_and_units_on_two_clients():
    """Diagonal family, numbers by hand: duals add (client - server); the server adds the sums."""
    global_ = Gaussian(torch.tensor([1.0, 0.0], dtype=DTYPE), torch.tensor([2.0, 4.0], dtype=DTYPE))
    local_a = Gaussian(torch.tensor([2.0, 1.0], dtype=DTYPE), torch.tensor([10.0, 6.0], dtype=DTYPE))
    local_b = Gaussian(torch.tensor([0.0, -1.0], dtype=DTYPE), torch.tensor([4.0, 8.0], dtype=DTYPE))
    zero = Duals(torch.zeros(2, dtype=DTYPE), torch.zeros(2, dtype=DTYPE))
    gamma = 0.5
    dual_a = dual_step(zero, local_a, global_, gamma, 1)
    dual_b = dual_step(zero, local_b, global_, gamma, 1)
    # v = γ (s_k m_k - s̄ m̄): a: 0.5 * ([20, 6] - [2, 0]); u = γ (s_k - s̄): a: 0.5 * ([10, 6] - [2, 4])
    torch.testing.assert_close(dual_a.mean, torch.tensor([9.0, 3.0], dtype=DTYPE))
    torch.testing.assert_close(dual_a.precision, torch.tensor([4.0, 1.0], dtype=DTYPE))
    torch.testing.assert_close(dual_b.mean, torch.tensor([-1.0, -4.0], dtype=DTYPE))
    torch.testing.assert_close(dual_b.precision, torch.tensor([1.0, 2.0], dtype=DTYPE))
    rho, delta = 0.5, 1.0
    updated = server_step([local_a, local_b], [dual_a, dual_b], rho, delta)
    alpha = 1 / (1 + rho * 2)  # = 0.5
    precision = (1 - alpha) * torch.tensor([7.0, 7.0], dtype=DTYPE) + alpha * (
        delta + torch.tensor([5.0, 3.0], dtype=DTYPE)
    )
    eta = (1 - alpha) * torch.tensor([10.0, -1.0], dtype=DTYPE) + alpha * torch.tensor([8.0, -1.0], dtype=DTYPE)
    torch.testing.assert_close(updated.precision, precision)
    torch.testing.assert_close(updated.mean, eta / precision)


@pytest.mark.parametrize("clients", [3, 10])
def test_clients_that_add_no_precision_shrink_it_by_one_minus_alpha_and_are_warned_of(clients):
    """Eq. 37 with zero duals: S̄' = (1 - α) Mean_k S_k + α δ. Clients adding a share s of S̄ give
    S̄' = (1 - α)(1 + s) S̄ + α δ: at s = 0 the factor 1 - α = ρK / (1 + ρK) towards δ (the warning names it), at
    s = α / (1 - α) = 1 / (ρK) S̄ stays (no warning)."""
    rho, delta, size = 0.2, 1.0, 5
    alpha = 1.0 / (1.0 + rho * clients)
    start = Gaussian(
        torch.zeros(size, dtype=torch.float64), torch.tensor([100.0, 200.0, 50.0, 400.0, 150.0], dtype=torch.float64)
    )
    zero = Duals(torch.zeros(size, dtype=torch.float64), torch.zeros(size, dtype=torch.float64))
    for share, shrinks in ((0.0, True), (1.0 / (rho * clients), False)):
        locals_ = [Gaussian(start.mean, (1.0 + share) * start.precision) for _ in range(clients)]
        assert added_precision_share(locals_, start) == pytest.approx(share, rel=1e-12)
        after = server_step(locals_, [zero] * clients, rho, delta)
        torch.testing.assert_close(after.precision, (1 - alpha) * (1 + share) * start.precision + alpha * delta)
        warning = collapse_warning(share, rho, clients, start, after)
        if shrinks:
            assert (
                f"shrinks to about {1 - alpha:.3f} of itself a round" in warning and "reset-posterior=false" in warning
            )
            assert "150 -> " in warning  # the medians before and after
        else:
            assert share >= COLLAPSE_SHARE and warning == ""


def test_the_share_of_a_full_precision_is_that_of_its_diagonal():
    start = Gaussian(torch.zeros(2, dtype=torch.float64), torch.tensor([[4.0, 1.0], [1.0, 8.0]], dtype=torch.float64))
    local = Gaussian(start.mean, torch.tensor([[6.0, -3.0], [-3.0, 12.0]], dtype=torch.float64))
    assert added_precision_share([local], start) == pytest.approx(0.5)


def test_reply_effect_is_the_server_step_with_one_reply_and_q_bar_for_the_rest():
    """Eqs. 37-38 with one local posterior and duals that make δI + ΣU_k = S̄, Σv_k = S̄ m̄ (so the prior's and the
    duals' part is q̄ itself) move q̄ by exactly reply_effect, for K = 3 (w = 1 − α = 0.375 at ρ = 0.2)."""
    generator = torch.Generator().manual_seed(0)
    q_bar = Gaussian(torch.randn(6, generator=generator, dtype=torch.float64), torch.rand(6, generator=generator) + 0.5)
    local = Gaussian(torch.randn(6, generator=generator, dtype=torch.float64), torch.rand(6, generator=generator) * 9)
    rho, delta, clients = 0.2, 1.0, 3
    site = Duals((q_bar.precision * q_bar.mean) / clients, (q_bar.precision.double() - delta) / clients)
    eta, precision = server_natural([local], [site] * clients, rho, delta)
    weight = 1.0 - prior_weight(rho, clients)
    effect = reply_effect(local, q_bar, weight)
    torch.testing.assert_close(effect[:6], eta / precision - q_bar.mean)
    torch.testing.assert_close(effect[6:], precision.log() - q_bar.precision.double().log())
    assert weight == pytest.approx(0.375)


def test_reply_effect_in_closed_form_and_for_a_wide_local_posterior():
    """S̄ = 2, m̄ = 1, S_k = 6, m_k = 3, w = 1/2: S̄' = 4 and m̄' − m̄ = ½·6·2 / 4 = 1.5. A local posterior 1000 x wider than
    q̄ whose mean is 10^6 away moves q̄'s mean by w S_k Δm / S̄' ≈ 10^3 (its raw distance would be 10^6); the full
    family's matrices, diagonal, give the diagonal's; the fixed-covariance family's is w (m_k − m̄)."""
    one = torch.ones(1, dtype=torch.float64)
    effect = reply_effect(Gaussian(3 * one, 6 * one), Gaussian(one, 2 * one), 0.5)
    torch.testing.assert_close(effect, torch.tensor([1.5, math.log(2.0)], dtype=torch.float64))
    wide = reply_effect(Gaussian(1e6 * one, 1e-3 * one), Gaussian(0 * one, one), 0.5)
    assert wide[0].item() == pytest.approx(0.5 * 1e-3 * 1e6 / (0.5 + 0.5e-3))
    means = torch.tensor([3.0, -1.0], dtype=torch.float64), torch.tensor([1.0, 0.5], dtype=torch.float64)
    precisions = torch.tensor([6.0, 0.2], dtype=torch.float64), torch.tensor([2.0, 4.0], dtype=torch.float64)
    diagonal = reply_effect(Gaussian(means[0], precisions[0]), Gaussian(means[1], precisions[1]), 0.3)
    full = reply_effect(
        Gaussian(means[0], torch.diag(precisions[0])), Gaussian(means[1], torch.diag(precisions[1])), 0.3
    )
    torch.testing.assert_close(full, diagonal)
    fixed = reply_effect(Gaussian(means[0], unit_precision()), Gaussian(means[1], unit_precision()), 0.3)
    torch.testing.assert_close(fixed, 0.3 * (means[0] - means[1]))
