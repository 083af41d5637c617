"""FedDyn's update rules against closed forms (docs/algorithms/feddyn.md): with exact
local solves it converges to argmin Σ_k ℓ_k + (N·wd/2)‖w‖² computed centrally; FedAvg does not."""

import numpy as np
import pytest
import torch

from fedbayes.strategies.feddyn.math import client_alpha, lambda_step, server_step
from tests.support.problems import make_problem, relative_error


def run_feddyn(problem, alpha, wd, rounds):
    """FedDyn with exact local solves of mean loss + (α_k/2)‖w − (w_g − λ_k)‖² + (wd/2)‖w‖², all clients each round."""
    sizes, clients = problem.sizes, len(problem.sizes)
    total = sum(sizes)
    global_ = torch.zeros(problem.dim, dtype=torch.float64)
    lambdas = [torch.zeros_like(global_) for _ in sizes]
    for _ in range(rounds):
        locals_ = []
        for k, size in enumerate(sizes):
            alpha_k = client_alpha(alpha, size, clients, total)
            anchor = (global_ - lambdas[k]).numpy()
            # (α_k/2)‖w − a‖² + (wd/2)‖w‖² = ((α_k + wd)/2)‖w − α_k a/(α_k + wd)‖² + const
            local = problem.solve_local(k, 1.0 / size, alpha_k + wd, alpha_k * anchor / (alpha_k + wd), global_.numpy())
            locals_.append(torch.from_numpy(local))
        lambdas = [lambda_step(lam, local, global_) for lam, local in zip(lambdas, locals_)]
        global_ = server_step(locals_, torch.stack(lambdas).sum(0), clients)
    return global_.numpy(), lambdas, locals_


def test_alpha_k_is_official_scaling_and_plain_alpha_before_sizes_are_known():
    assert client_alpha(0.1, num_examples=20, known_clients=4, known_examples=80) == pytest.approx(0.1)
    assert client_alpha(0.1, num_examples=10, known_clients=4, known_examples=80) == pytest.approx(0.2)
    assert client_alpha(0.1, num_examples=10, known_clients=0, known_examples=0) == 0.1


def test_feddyn_with_weight_decay_converges_to_the_regularised_optimum_logistic():
    problem = make_problem("logistic", seed=1)
    total, delta = sum(problem.sizes), 5.0
    global_, lambdas, locals_ = run_feddyn(problem, alpha=0.1, wd=delta / total, rounds=150)
    target = problem.optimum(delta)  # wd plays the role of δ/N
    assert relative_error(global_, target) < 1e-6
    assert max(relative_error(local.numpy(), target) for local in locals_) < 1e-6  # w_k = w_g at the fixed point
    # T6: α_k λ_k = −(∇ℓ̄_k(w*) + wd·w*)
    for k, (size, lam) in enumerate(zip(problem.sizes, lambdas)):
        expected = -(problem.grad(k, target) / size + delta / total * target)
        np.testing.assert_allclose(client_alpha(0.1, size, 4, total) * lam.numpy(), expected, atol=1e-6)


def test_feddyn_without_weight_decay_converges_to_the_unregularised_least_squares_optimum():
    problem = make_problem("ridge", seed=2)
    global_, _, _ = run_feddyn(problem, alpha=0.1, wd=0.0, rounds=400)
    assert relative_error(global_, problem.optimum(0.0)) < 1e-6


def test_fedavg_with_exact_local_solves_stops_at_a_biased_point():
    """The negative control (T8): clients jump to their own optimum, the server averages by N_k."""
    problem = make_problem("ridge", seed=2)
    sizes = problem.sizes
    global_ = np.zeros(problem.dim)
    for _ in range(50):
        locals_ = [problem.solve_local(k, 1.0, 0.0, global_, global_) for k in range(len(sizes))]
        global_ = np.average(locals_, axis=0, weights=sizes)
    assert relative_error(global_, problem.optimum(0.0)) > 1e-2
