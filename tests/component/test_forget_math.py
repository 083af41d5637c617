"""Forgetting a client (issue 28, docs/guides/forgetting.md) against closed forms: each strategy's `forget` on a state
that its own update rules brought to the fixed point (driven through the math functions, exact local solves), with no
client work, compared with the posterior or optimum of the data without the client; then the refusals, and that
`forget` changes nothing until the caller commits its state."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedbayes.bayes.gaussian import Gaussian, kl_divergence
from fedbayes.bayes.params import unflatten
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode, encode, new_header
from fedbayes.server.round_core import Change
from fedbayes.strategies import get_algorithm, run_settings
from fedbayes.strategies.base import ClientForget, ForgetRefused, ServerState
from fedbayes.strategies.bayesadmm.math import (
    Duals,
    LocalPosterior,
    as_sent,
    dual_step,
    fixed_point_natural,
    fixed_point_residual,
    newton_client_step,
    server_natural_without,
    server_step,
    shares_step,
)
from fedbayes.strategies.dsvgd.math import (
    SVGDSettings,
    Visit,
    agent_round,
    forget_update,
    gaussian_prior_score,
    server_distillation,
    tilted_update,
    unconstrained_forget_update,
    unconstrained_tilted_update,
)
from fedbayes.strategies.feddyn.math import ClientLambda, client_alpha, lambda_step
from fedbayes.strategies.feddyn.math import server_step as feddyn_server_step
from fedbayes.strategies.fedlap.math import Site
from fedbayes.strategies.membership import Membership
from tests.support import DEFAULTS, InProcessFederation
from tests.support.problems import (
    Problem,
    fedlap_round,
    gaussian_loss_gradient,
    make_problem,
    relative_error,
    ridge_problem,
    run_fedlap,
)
from tests.support.rogue import overrides

DTYPE = torch.float64
ACCEPTED_ROUND = 7


# ---- strategies in a given state ----------------------------------------------------------------------------------
def server(strategy: str, layout: dict, **overrides):
    settings = run_settings({**DEFAULTS, "model": "logreg", "strategy": strategy, **overrides})
    return get_algorithm(strategy).build_server(settings, layout)


def holding(strategy, **state) -> None:
    """`strategy` committed to its state with `state`'s fields."""
    strategy.commit(replace(strategy.state, **state))


def snapshot(strategy) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    state = strategy.save_state(strategy.state)
    return {name: value.copy() for name, value in state.tensors.items()}, dict(state.metadata)


def assert_unchanged(strategy, before) -> None:
    tensors, metadata = snapshot(strategy)
    assert metadata == before[1] and tensors.keys() == before[0].keys()
    for name, value in tensors.items():
        np.testing.assert_array_equal(value, before[0][name], err_msg=name)


def assert_forgotten_bookkeeping(strategy, forgotten, client: str, remaining: list[str]) -> None:
    """What the caller will commit is a state of the strategy's own type, which holds the remaining clients alone (the
    core's accepted rounds and identities are the caller's)."""
    assert type(forgotten.state) is type(strategy.state)
    per_client = next(value for value in vars(forgotten.state).values() if isinstance(value, dict) and value)
    assert sorted(per_client) == sorted(remaining)


def without(items: list, k: int) -> list:
    return [item for j, item in enumerate(items) if j != k]


def membership(clients: list[str], sizes: list[int]) -> Membership:
    return Membership(dict(zip(clients, sizes)), {client: ACCEPTED_ROUND for client in clients})


# ---- BayesADMM ----------------------------------------------------------------------------------------------------
def tempered_squared_loss(x, y, tau):
    return lambda theta: 0.5 * (x @ theta - y).square().sum() / tau


def admm_step(data, global_, duals, rho, delta, tau, server_round, gamma):
    """Alg. 1 with every client: one VON step solves the client's subproblem exactly on a quadratic loss (Prop. 3.2),
    the dual step γ (Eq. 36), the server step (Eqs. 37-38). Updates `duals` in place; returns q̄ and the locals."""
    locals_ = []
    for j, (x, y) in enumerate(data):
        local = newton_client_step(tempered_squared_loss(x, y, tau), global_, duals[j], rho, start=global_)
        duals[j] = dual_step(duals[j], local, global_, gamma, server_round)
        locals_.append(local)
    updated = server_step(locals_, duals, rho, delta)
    if global_.kind == "isotropic":  # federated ADMM: the covariance stays the identity
        return Gaussian(updated.mean, global_.precision), locals_
    return updated, locals_


def admm_round(data, global_, duals, rho, delta, tau, server_round):
    """`admm_step` with γ = ρ (after one round the duals are the exact sites of a quadratic loss); q̄ alone."""
    return admm_step(data, global_, duals, rho, delta, tau, server_round, gamma=rho)[0]


def held(clients, locals_, server_round) -> dict[str, LocalPosterior]:
    """The local posteriors as the server keeps them after a round they all replied in (BayesADMM.absorb)."""
    return {client: LocalPosterior.held(q, server_round) for client, q in zip(clients, locals_)}


def zero_duals(data, family: str) -> list[Duals]:
    features = data[0][0].shape[1]
    precision = torch.zeros(features, features, dtype=DTYPE) if family == "full" else torch.tensor(0.0, dtype=DTYPE)
    return [Duals(torch.zeros(features, dtype=DTYPE), precision.clone()) for _ in data]


def linear_gaussian_posterior(data, delta, tau) -> Gaussian:
    """N(0, I/δ) × Π_k exp(−½‖X_k θ − y_k‖²/τ): Bayesian linear regression with known noise variance τ."""
    x = torch.cat([d[0] for d in data])
    y = torch.cat([d[1] for d in data])
    precision = delta * torch.eye(x.shape[1], dtype=DTYPE) + x.T @ x / tau
    return Gaussian(torch.linalg.solve(precision, x.T @ y / tau), precision)


def test_bayesadmm_full_forgets_to_the_exact_posterior_of_the_remaining_data():
    """Linear-Gaussian: loss_k = ½‖X_k θ − y_k‖², temperature τ = 0.5, prior N(0, I/δ) (δ = prior-precision). Then
    forget.md's tempered posterior p_0 Π_k exp(−loss_k/τ) is the Bayesian linear-regression posterior with known
    noise variance τ, and Alg. 1's fixed point is that posterior, its duals the sites (X_kᵀX_k/τ, X_kᵀy_k/τ).
    Forgetting client k from the server's state alone must give the posterior of the data without k, to 1e-6.

    With the local posteriors held too, redoing the last server step without k is not that: there every S_j = S̄, so
    it gives S̄ - α' U_k, S̄ m̄ - α' v_k (α' = 1/(1 + ρ(K-1))) and keeps 1 - α' of k's site. `forget` takes the
    fixed-point formula, as q̄ is at its duals' fixed point."""
    data = ridge_problem(clients=4, features=4, per_client=15)
    delta, tau, rho, k = 0.7, 0.5, 0.4, 1
    global_ = Gaussian(torch.zeros(4, dtype=DTYPE), delta * torch.eye(4, dtype=DTYPE))
    duals = zero_duals(data, "full")
    for server_round in range(1, 71):
        global_, locals_ = admm_step(data, global_, duals, rho, delta, tau, server_round, gamma=rho)
    assert fixed_point_residual(global_, duals, delta) < 1e-12
    full = linear_gaussian_posterior(data, delta, tau)
    torch.testing.assert_close(global_.mean, full.mean, rtol=1e-9, atol=0)

    strategy = server("bayesadmm-full", {"weight": (1, 4)}, **{"prior-precision": delta, "rho": rho})
    clients = [f"client-{j}" for j in range(len(data))]
    local_posteriors = held(clients, locals_, 70)
    holding(strategy, global_=as_sent(global_), duals=dict(zip(clients, duals)), local_posteriors=local_posteriors)
    redone = server_natural_without(clients[k], local_posteriors, dict(zip(clients, duals)), rho, delta)
    alpha = 1 / (1 + rho * (len(data) - 1))
    torch.testing.assert_close(redone.precision, global_.precision - alpha * duals[k].precision, rtol=1e-9, atol=0)
    torch.testing.assert_close(redone.eta, global_.natural()[0] - alpha * duals[k].mean, rtol=1e-9, atol=1e-9)
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)

    expected = linear_gaussian_posterior(without(data, k), delta, tau)
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), expected.mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(forgotten.state.global_.precision, expected.precision, rtol=1e-6, atol=0)
    closed_form = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(full.mean, precision_matrix=full.precision),
        torch.distributions.MultivariateNormal(expected.mean, precision_matrix=expected.precision),
    ).item()
    assert closed_form > 0.1  # client k mattered, so the checks above can fail
    assert forgotten.kl_before_after == pytest.approx(closed_form, rel=1e-4)
    assert sorted(forgotten.state.duals) == sorted(forgotten.state.local_posteriors) == without(clients, k)
    assert_forgotten_bookkeeping(strategy, forgotten, clients[k], without(clients, k))
    assert forgotten.exact is False  # guaranteed for a quadratic loss only; the full family's clients train CE
    assert forgotten.note.startswith("q̄ from the 3 remaining clients' duals at the fixed point")

    # Committed, the next ordinary round of the remaining clients leaves q̄ where it is: the fixed point without k.
    strategy.commit(forgotten.state)
    again = admm_round(without(data, k), strategy.global_, list(strategy.state.duals.values()), rho, delta, tau, 71)
    torch.testing.assert_close(again.mean, expected.mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(again.precision, expected.precision, rtol=1e-6, atol=0)


def ridge_optimum(data, delta) -> torch.Tensor:
    return linear_gaussian_posterior(data, delta, 1.0).mean


def test_federated_admm_forgets_by_one_gradient_step_and_its_rounds_go_on_to_the_optimum_without_k():
    """The isotropic family (fedadmm) on ridge regression, ℓ_j = ½‖X_j θ − y_j‖², ℓ_0 = δ/2‖θ‖²: at the fixed point
    v_j = −∇ℓ_j(θ*), so θ̄' = Σ_{j≠k} v_j/δ = θ* − ∇F'(θ*)/δ for F' = Σ_{j≠k} ℓ_j + δ/2‖θ‖². Not the optimum of F'
    (no curvature is kept), but the remaining duals are valid multipliers: ordinary rounds reach it."""
    data = ridge_problem(clients=4, features=4, per_client=15, seed=3)
    delta, rho, k = 2.0, 50.0, 2
    global_ = Gaussian(torch.zeros(4, dtype=DTYPE), torch.tensor(1.0, dtype=DTYPE))
    duals = zero_duals(data, "isotropic")
    for server_round in range(1, 151):
        global_ = admm_round(data, global_, duals, rho, delta, 1.0, server_round)
    optimum = ridge_optimum(data, delta)
    torch.testing.assert_close(global_.mean, optimum, rtol=1e-10, atol=0)

    strategy = server("fedadmm", {"weight": (1, 4)}, **{"prior-precision": delta, "rho": rho})
    clients = [f"client-{j}" for j in range(len(data))]
    holding(strategy, global_=as_sent(global_), duals=dict(zip(clients, duals)))
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)

    remaining = without(data, k)
    gradient = sum(x.T @ (x @ optimum - y) for x, y in remaining) + delta * optimum
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), optimum - gradient / delta, rtol=1e-6, atol=1e-7)
    target = ridge_optimum(remaining, delta)
    assert relative_error(forgotten.weights, target.numpy()) > 1e-2  # an estimate: the flag says so
    assert forgotten.exact is False and forgotten.kl_before_after is None
    assert_forgotten_bookkeeping(strategy, forgotten, clients[k], without(clients, k))

    strategy.commit(forgotten.state)
    global_, duals = strategy.global_, list(strategy.state.duals.values())
    for server_round in range(1, 151):
        global_ = admm_round(remaining, global_, duals, rho, delta, 1.0, server_round)
    assert relative_error(global_.mean.numpy(), target.numpy()) < 1e-6


def test_bayesadmm_far_from_the_fixed_point_forgets_by_redoing_the_last_server_step_without_k():
    """The linear-Gaussian problem above with the dual step damped (γ = ρ/100, as the default dual-damping damps it),
    after 10 rounds: q̄ is far from its duals' fixed point (the duals are not yet sites), so the fixed-point formula's
    precision is 90% off the posterior's without k. `forget` redoes round 10's server step without k instead: k's local
    posterior out of the mean, its duals out of the sums, α with K - 1, equal to `server_step` by hand to 1e-6. An
    estimate (the remaining local posteriors were fitted against a q̄ that held k), closer here to the posterior
    without k than q̄ was."""
    data = ridge_problem(clients=4, features=4, per_client=15)
    delta, tau, rho, k = 0.7, 0.5, 0.4, 1
    global_ = Gaussian(torch.zeros(4, dtype=DTYPE), delta * torch.eye(4, dtype=DTYPE))
    duals = zero_duals(data, "full")
    for server_round in range(1, 11):
        global_, locals_ = admm_step(data, global_, duals, rho, delta, tau, server_round, gamma=rho / 100)
    assert fixed_point_residual(global_, duals, delta) > 0.5

    strategy = server("bayesadmm-full", {"weight": (1, 4)}, **{"prior-precision": delta, "rho": rho})
    clients = [f"client-{j}" for j in range(len(data))]
    holding(
        strategy,
        global_=as_sent(global_),
        duals=dict(zip(clients, duals)),
        local_posteriors=held(clients, locals_, 10),
    )
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)

    by_hand = server_step(without(locals_, k), without(duals, k), rho, delta)  # K - 1 = 3 duals: α = 1/(1 + 3ρ)
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), by_hand.mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(forgotten.state.global_.precision, by_hand.precision, rtol=1e-6, atol=0)
    expected = linear_gaussian_posterior(without(data, k), delta, tau)
    old_eta, old_precision = fixed_point_natural(without(duals, k), delta, global_.precision)
    old = Gaussian(torch.linalg.solve(old_precision, old_eta), old_precision)
    # KL(posterior without k ‖ ·): 2.8 for the fixed-point formula, 0.16 for q̄ before, 0.054 for the redone step
    assert kl_divergence(expected, old) > 1.0
    assert kl_divergence(expected, forgotten.state.global_) < 0.5 * kl_divergence(expected, global_)
    assert forgotten.note.startswith(
        "round 10's server step (Eqs. 37-38) redone without 'client-1': the mean of its 3 remaining local posteriors"
    )
    assert "q̄ was 0.9 from its duals' fixed point" in forgotten.note
    assert forgotten.exact is False and forgotten.kl_before_after > 0
    assert sorted(forgotten.state.duals) == sorted(forgotten.state.local_posteriors) == without(clients, k)


def admm_with_shares(data, clients, rounds, rho, delta, tau, gamma):
    """`admm_step` for `rounds` rounds from the prior, with the server's bookkeeping of each client's share of q̄
    (`shares_step`, as BayesADMM.absorb keeps it). Returns q̄, the duals, the last locals and the shares."""
    global_ = Gaussian(torch.zeros(4, dtype=DTYPE), delta * torch.eye(4, dtype=DTYPE))
    duals, shares = zero_duals(data, "full"), {}
    for server_round in range(1, rounds + 1):
        sent = global_
        global_, locals_ = admm_step(data, sent, duals, rho, delta, tau, server_round, gamma)
        shares = shares_step(shares, dict(zip(clients, locals_)), dict(zip(clients, duals)), sent, rho, server_round)
    return global_, duals, locals_, shares


@pytest.mark.parametrize(("rounds", "damping", "exact"), [(70, 1.0, True), (10, 0.01, False)])
def test_bayesadmm_forgets_by_taking_the_clients_share_out_of_q(rounds, damping, exact):
    """The linear-Gaussian federation of the tests above, with the server's shares (`shares_step`): they add up to
    q̄ with the initial q̄'s and the prior's parts, at every round, and `forget` takes the client's share out first.
    At the fixed point (γ = ρ, 70 rounds) every share is its client's site, so q̄ less k's share is the posterior of the
    data without k, to 1e-6. Far from it (γ = ρ/100, 10 rounds: q̄ 0.9 from its duals' fixed point, the duals not yet
    sites) it is still all but that posterior (KL 2e-6, the redone server step's 0.054, q̄'s 0.16): each round's term of
    a client is then its site plus γ (S_k m_k - S̄ m̄), and its share holds 1 - (1-α)^10 > 99% of them."""
    data = ridge_problem(clients=4, features=4, per_client=15)
    delta, tau, rho, k = 0.7, 0.5, 0.4, 1
    clients = [f"client-{j}" for j in range(len(data))]
    global_, duals, locals_, shares = admm_with_shares(data, clients, rounds, rho, delta, tau, damping * rho)
    alpha = 1 / (1 + rho * len(data))
    initial_part = (1 - alpha) ** rounds
    prior_part = delta * (1 - initial_part) * torch.eye(4, dtype=DTYPE)
    added_up = initial_part * delta * torch.eye(4, dtype=DTYPE) + prior_part + sum(c.precision for c in shares.values())
    torch.testing.assert_close(global_.precision, added_up, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(global_.natural()[0], sum(c.mean for c in shares.values()), rtol=1e-9, atol=1e-9)

    strategy = server("bayesadmm-full", {"weight": (1, 4)}, **{"prior-precision": delta, "rho": rho})
    holding(
        strategy,
        global_=as_sent(global_),
        duals=dict(zip(clients, duals)),
        local_posteriors=held(clients, locals_, rounds),
        shares=shares,
    )
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)
    assert forgotten.note.startswith(f"q̄ less {clients[k]!r}'s share of it")
    assert sorted(forgotten.state.shares) == without(clients, k)
    expected = linear_gaussian_posterior(without(data, k), delta, tau)
    if exact:
        torch.testing.assert_close(torch.from_numpy(forgotten.weights), expected.mean, rtol=1e-6, atol=0)
        torch.testing.assert_close(forgotten.state.global_.precision, expected.precision, rtol=1e-6, atol=0)
        return
    assert fixed_point_residual(global_, duals, delta) > 0.5
    redone = server_step(without(locals_, k), without(duals, k), rho, delta)
    assert kl_divergence(expected, redone) > 0.05 and kl_divergence(expected, global_) > 0.1
    assert kl_divergence(expected, forgotten.state.global_) < 1e-4


DIAGONAL = {"weight": (1, 3)}


def test_diagonal_bayesadmm_keeps_q_where_less_than_the_prior_precision_would_remain():
    """IVON's local precisions can fall below q̄'s, so some clients' shares carry negative precision and another's can
    exceed what the rest leave: on the FMNIST MLP q̄ less the largest client's share kept less than δ in 0.5% of the
    parameters. There q̄ keeps its own entry (mean and precision); elsewhere the share comes out, in closed form."""
    strategy = server("bayesadmm", DIAGONAL)
    delta = strategy.hyperparameters.prior_precision
    global_ = Gaussian(torch.tensor([1.0, -2.0, 0.5], dtype=DTYPE), torch.full((3,), 4.0 * delta, dtype=DTYPE))
    share = Duals(torch.tensor([0.5, 1.0, 2.0], dtype=DTYPE), torch.tensor([1.0, -2.0, 3.5], dtype=DTYPE) * delta, 7)
    keep = Duals(torch.zeros(3, dtype=DTYPE), torch.zeros(3, dtype=DTYPE), 7)
    duals = {"client-a": keep, "client-b": keep}
    holding(strategy, global_=global_, duals=duals, shares={"client-a": share, "client-b": keep})
    forgotten = strategy.forget("client-a")
    precision = torch.tensor([3.0, 6.0, 4.0], dtype=DTYPE) * delta
    eta = global_.precision * global_.mean - torch.tensor([0.5, 1.0, 0.0], dtype=DTYPE)
    torch.testing.assert_close(forgotten.state.global_.precision, precision, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), eta / precision, rtol=1e-6, atol=0)
    assert forgotten.weights[2] == pytest.approx(0.5)  # q̄'s own: 4δ - 3.5δ < δ would have remained
    assert "in 1 of 3 parameters q̄ kept its own, as less than δ would remain" in forgotten.note


def diagonal_state(rng, clients: dict[str, int]) -> dict:
    """A diagonal BayesADMM state far from its duals' fixed point: q̄ with precision 10, each client's duals (U_k =
    0.5) and local posterior of the round `clients` names."""

    def vector(low, high):
        return torch.from_numpy(rng.uniform(low, high, 3))

    return {
        "global_": Gaussian(vector(-1, 1), torch.full((3,), 10.0, dtype=DTYPE)),
        "duals": {c: Duals(vector(-1, 1), torch.full((3,), 0.5, dtype=DTYPE), r) for c, r in clients.items()},
        "local_posteriors": {c: LocalPosterior(vector(-1, 1), vector(5, 15), r) for c, r in clients.items()},
    }


@pytest.mark.parametrize(
    ("rounds", "forgotten_client", "step_round", "repliers"),
    [
        ({"a": 8, "b": 8, "c": 5}, "c", 8, ["a", "b"]),  # c did not reply in the last round
        ({"a": 8, "b": 8, "c": 8, "d": 5}, "a", 8, ["b", "c"]),  # d's local of round 5 is not in round 8's mean
        ({"a": 6, "b": 6, "c": 7}, "c", 6, ["a", "b"]),  # c alone replied in round 7: round 6 is the last step
    ],
)
def test_bayesadmm_redoes_the_last_step_a_remaining_client_replied_in(rounds, forgotten_client, step_round, repliers):
    """Partial participation: the mean of the locals runs over the last round's repliers (those of the latest round
    among the remaining clients), the sums over every remaining client's duals."""
    state = diagonal_state(np.random.default_rng(0), rounds)
    strategy = server("bayesadmm", DIAGONAL)
    holding(strategy, **state)
    forgotten = strategy.forget(forgotten_client)
    hp = strategy.hyperparameters
    remaining = [c for c in rounds if c != forgotten_client]
    by_hand = server_step(
        [state["local_posteriors"][c].gaussian() for c in repliers],
        [state["duals"][c] for c in remaining],
        hp.rho,
        hp.prior_precision,
    )
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), by_hand.mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(forgotten.state.global_.precision, by_hand.precision, rtol=1e-6, atol=0)
    assert forgotten.note.startswith(
        f"round {step_round}'s server step (Eqs. 37-38) redone without {forgotten_client!r}: the mean of its "
        f"{len(repliers)} remaining local posteriors with the prior and the {len(remaining)} remaining clients' duals"
    )
    assert sorted(forgotten.state.local_posteriors) == remaining


def test_bayesadmm_forgets_where_the_fixed_point_formula_would_have_refused():
    """Early diagonal duals are differences of precisions and can be negative: without client a, δ + U_b = 1 - 2 is no
    precision, which the fixed-point formula alone refused. Redoing the last server step without a, with K - 1 = 1
    (α' = 1/(1 + ρ)), keeps b's local posterior: S̄' = (1 - α') S_b + α' (δ + U_b) > 0, in closed form. Where b's local
    precision is too small for that too, the refusal names both estimates."""
    strategy = server("bayesadmm", DIAGONAL)
    hp = strategy.hyperparameters
    a = Duals(torch.zeros(3, dtype=DTYPE), torch.full((3,), 2.5, dtype=DTYPE), ACCEPTED_ROUND)
    b = Duals(torch.tensor([0.5, -1.0, 2.0], dtype=DTYPE), torch.full((3,), -2.0, dtype=DTYPE), ACCEPTED_ROUND)
    old_eta, old_precision = fixed_point_natural([b], hp.prior_precision, torch.ones(3, dtype=DTYPE))
    assert (old_precision <= 0).all()
    local_b = LocalPosterior(torch.tensor([1.0, 2.0, -1.0], dtype=DTYPE), torch.tensor([30.0, 12.0, 6.0]), 7)
    local_a = LocalPosterior(torch.zeros(3, dtype=DTYPE), torch.full((3,), 20.0, dtype=DTYPE), 7)
    holding(
        strategy,
        global_=Gaussian(torch.zeros(3, dtype=DTYPE), torch.full((3,), 4.0, dtype=DTYPE)),
        duals={"client-a": a, "client-b": b},
        local_posteriors={"client-a": local_a, "client-b": local_b},
    )
    forgotten = strategy.forget("client-a")
    alpha = 1 / (1 + hp.rho)
    precision = (1 - alpha) * local_b.precision + alpha * (hp.prior_precision + b.precision)
    assert (precision > 0).all()
    mean = ((1 - alpha) * local_b.precision * local_b.mean + alpha * b.mean) / precision
    torch.testing.assert_close(forgotten.state.global_.precision, precision, rtol=1e-6, atol=0)
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), mean, rtol=1e-6, atol=0)
    assert forgotten.note.startswith("round 7's server step (Eqs. 37-38) redone without 'client-a'")

    too_small = LocalPosterior(local_b.mean, torch.tensor([30.0, 12.0, 0.5], dtype=DTYPE), 7)
    holding(strategy, local_posteriors={"client-a": local_a, "client-b": too_small})
    before = snapshot(strategy)
    with pytest.raises(
        ForgetRefused,
        match="without client 'client-a' no estimate makes a posterior .*: q̄ less its share: the server holds no "
        r"shares \(kept from a federation's first round on, and this one's checkpoint started before they were\); the "
        "last server step without it: 1 global "
        "precisions would be <= 0; the fixed point of the remaining duals: 3 global precisions would be <= 0: the "
        "remaining duals are not yet sites; run more rounds first, or retrain",
    ):
        strategy.forget("client-a")
    assert_unchanged(strategy, before)


def test_bayesadmm_state_without_local_posteriors_forgets_at_the_fixed_point_and_says_why():
    """A checkpoint from before the server kept local posteriors loads with none (BayesADMM.load_state): the last
    server step cannot be redone, so `forget` takes the fixed-point formula, S̄' = δI + Σ_{j≠k} U_j, m̄' =
    S̄'⁻¹ Σ_{j≠k} v_j, whatever the residual, and the note says why (the refusal where that fails: the test above)."""
    strategy = server("bayesadmm", DIAGONAL)
    state = diagonal_state(np.random.default_rng(1), {"a": 4, "b": 4, "c": 4})
    holding(strategy, **state)
    saved = strategy.save_state(strategy.state)
    old = ServerState(
        {name: value for name, value in saved.tensors.items() if not name.startswith("local_posteriors/")},
        {name: value for name, value in saved.metadata.items() if name != "local_posteriors"},
    )
    assert old.tensors.keys() < saved.tensors.keys()
    strategy.commit(strategy.load_state(old))
    assert strategy.state.local_posteriors == {} and sorted(strategy.state.duals) == ["a", "b", "c"]
    forgotten = strategy.forget("b")
    eta, precision = fixed_point_natural(
        [state["duals"][c] for c in ("a", "c")], strategy.hyperparameters.prior_precision, torch.ones(3, dtype=DTYPE)
    )
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), eta / precision, rtol=1e-6, atol=0)
    torch.testing.assert_close(forgotten.state.global_.precision, precision, rtol=1e-6, atol=0)
    assert forgotten.note.startswith(
        "q̄ from the 2 remaining clients' duals at the fixed point (the sites of IVON's approximate fixed point: an "
        "estimate) (not q̄ less its share: the server holds no shares (kept from a federation's first round on, and "
        "this one's checkpoint started before they were); the last server step without it: no remaining client's "
        "local posterior is held (a checkpoint from before the server kept them, and since then only 'b' replied))"
    )


# ---- FedLap / FedLap-Cov ------------------------------------------------------------------------------------------
def axis_aligned_problem(sizes=(12, 20, 8), dim=4, seed=0) -> Problem:
    """Linear regression whose every observation measures one coordinate (rows c·e_d): the curvature X_kᵀX_k is
    diagonal, so FedLap-Cov's diagonal sites can be exact."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=dim)
    xs, ys = [], []
    for size in sizes:
        x = np.zeros((size, dim))
        x[np.arange(size), rng.integers(0, dim, size)] = rng.uniform(0.5, 2.0, size)
        xs.append(x)
        ys.append(x @ (truth + 0.5 * rng.normal(size=dim)) + 0.3 * rng.normal(size=size))
    return Problem("ridge", xs, ys)


def sub_problem(problem: Problem, k: int) -> Problem:
    return Problem(problem.kind, without(problem.xs, k), without(problem.ys, k))


def exact_posterior(problem: Problem, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """N(0, I/δ) × Π_k exp(−½‖X_k w − y_k‖²): mean and (diagonal, for an axis-aligned design) precision."""
    x, y = np.concatenate(problem.xs), np.concatenate(problem.ys)
    precision = delta * np.eye(problem.dim) + x.T @ x
    assert np.count_nonzero(precision - np.diag(np.diag(precision))) == 0
    return torch.from_numpy(np.linalg.solve(precision, x.T @ y)), torch.from_numpy(np.diag(precision).copy())


def fedlap_strategy(name, problem, delta, sites, mean, precision):
    strategy = server(name, {"weight": (1, problem.dim)}, **{"prior-precision": delta})
    clients = [f"client-{j}" for j in range(len(sites))]
    holding(
        strategy,
        global_mean=mean.float().double(),
        global_precision=precision.float().double(),
        unclaimed=torch.zeros_like(mean),  # every round-1 client replied: the init is all claimed
        sites={client: Site(site.mean, site.precision, ACCEPTED_ROUND) for client, site in zip(clients, sites)},
        membership=membership(clients, problem.sizes),
    )
    return strategy, clients


def test_fedlap_cov_forgets_to_the_exact_posterior_when_the_curvature_is_diagonal():
    """A linear-Gaussian problem with unit noise (FedLap has no temperature) and an axis-aligned design, prior
    N(0, I/δ): FedLap-Cov's fixed point is the exact posterior, its sites (X_kᵀy_k, diag X_kᵀX_k); dropping client
    k's site gives the posterior of the data without k, to 1e-6; K and N stop counting k."""
    problem, delta, k = axis_aligned_problem(), 0.5, 1
    mean, precision, sites, _ = run_fedlap(problem, delta, covariance=True, rounds=120)
    full_mean, full_precision = exact_posterior(problem, delta)
    torch.testing.assert_close(mean, full_mean, rtol=1e-9, atol=0)
    torch.testing.assert_close(precision, full_precision, rtol=1e-9, atol=0)

    strategy, clients = fedlap_strategy("fedlap-cov", problem, delta, sites, mean, precision)
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)

    expected_mean, expected_precision = exact_posterior(sub_problem(problem, k), delta)
    torch.testing.assert_close(torch.from_numpy(forgotten.weights), expected_mean, rtol=1e-6, atol=0)
    torch.testing.assert_close(forgotten.state.global_precision, expected_precision, rtol=1e-6, atol=0)
    closed_form = torch.distributions.kl_divergence(
        torch.distributions.Normal(full_mean, full_precision**-0.5),
        torch.distributions.Normal(expected_mean, expected_precision**-0.5),
    )
    assert closed_form.sum().item() > 0.1
    assert forgotten.kl_before_after == pytest.approx(closed_form.sum().item(), rel=1e-4)
    remaining = without(clients, k)
    assert sorted(forgotten.state.sites) == remaining
    assert forgotten.state.membership == membership(remaining, without(problem.sizes, k))
    assert_forgotten_bookkeeping(strategy, forgotten, clients[k], remaining)

    # Committed, the next ordinary round of the remaining clients (ρ_j = 1/(K−1)) leaves q_g where it is.
    strategy.commit(forgotten.state)
    new_sites, _, _ = fedlap_round(sub_problem(problem, k), list(strategy.state.sites.values()), delta, covariance=True)
    torch.testing.assert_close(
        sum(site.mean for site in new_sites) / expected_precision, expected_mean, rtol=1e-6, atol=0
    )
    torch.testing.assert_close(delta + sum(site.precision for site in new_sites), expected_precision, rtol=1e-6, atol=0)


@pytest.mark.parametrize(("name", "rounds"), [("fedlap", 250), ("fedlap-cov", 80)])
def test_fedlap_forgets_by_one_step_on_the_remaining_map_objective(name, rounds):
    """Logistic regression, prior N(0, I/δ): at the fixed point every site is its loss linearised at w*, so dropping
    site k gives w* − (δ + Σ_{j≠k} V_j)⁻¹ ∇F'(w*), F' = Σ_{j≠k} ℓ_j + δ/2‖w‖², with V_j = diag ∇²ℓ_j(w*) (FedLap-Cov:
    a diagonal Newton step) or 0 (FedLap: a gradient step of size 1/δ). Not the MAP without k; the remaining sites
    go on to it in ordinary rounds."""
    covariance = name == "fedlap-cov"
    problem, delta, k = make_problem("logistic", seed=3), 5.0, 3
    mean, precision, sites, _ = run_fedlap(problem, delta, covariance, rounds)
    optimum = problem.optimum(delta)
    strategy, clients = fedlap_strategy(name, problem, delta, sites, mean, precision)
    forgotten = strategy.forget(clients[k])

    remaining = [j for j in range(len(clients)) if j != k]
    gradient = sum(problem.grad(j, optimum) for j in remaining) + delta * optimum
    curvature = delta + sum(np.diag(problem.hess(j, optimum)) for j in remaining) if covariance else delta
    np.testing.assert_allclose(forgotten.weights, optimum - gradient / curvature, rtol=1e-5)
    target = sub_problem(problem, k).optimum(delta)
    assert relative_error(forgotten.weights, target) > 1e-3
    assert forgotten.exact is False

    strategy.commit(forgotten.state)
    sites = list(strategy.state.sites.values())
    for server_round in range(1, rounds + 1):
        sites, locals_, _ = fedlap_round(sub_problem(problem, k), sites, delta, covariance, server_round)
    assert max(relative_error(local.numpy(), target) for local in locals_) < 1e-6


# ---- FedDyn -------------------------------------------------------------------------------------------------------
def feddyn_rounds(problem, global_, lambdas, alpha, wd, rounds):
    """FedDyn with exact local solves of mean loss + (α_j/2)‖w − (w_g − λ_j)‖² + (wd/2)‖w‖², every client each round,
    α_j counted over `problem`'s clients."""
    sizes = problem.sizes
    for _ in range(rounds):
        locals_ = []
        for j, size in enumerate(sizes):
            alpha_j = client_alpha(alpha, size, len(sizes), sum(sizes))
            anchor = (global_ - lambdas[j]).numpy()
            locals_.append(
                torch.from_numpy(
                    problem.solve_local(j, 1.0 / size, alpha_j + wd, alpha_j * anchor / (alpha_j + wd), global_.numpy())
                )
            )
        lambdas = [lambda_step(lam, local, global_) for lam, local in zip(lambdas, locals_)]
        global_ = feddyn_server_step(locals_, torch.stack(lambdas).sum(0), len(sizes))
    return global_, lambdas


def test_feddyn_forgets_by_its_first_server_step_without_the_client():
    """Ridge with weight decay: FedDyn's fixed point is w* = argmin Σ ℓ_k + (N wd/2)‖w‖², Σ λ_k = 0. Dropping λ_k gives
    w* − λ_k/(K−1), one gradient step of size K/((K−1)αN) on F' = Σ_{j≠k} ℓ_j + (N' wd/2)‖w‖²: an estimate (not the
    model trained without k). Refinement rounds with the remaining λ_j, and α_j counted without k, reach it."""
    problem, alpha, k = make_problem("ridge", seed=2), 1.0, 1
    sizes, clients = problem.sizes, [f"client-{j}" for j in range(len(problem.sizes))]
    total, wd = sum(sizes), 5.0 / sum(sizes)
    start = torch.zeros(problem.dim, dtype=DTYPE)
    global_, lambdas = feddyn_rounds(problem, start, [torch.zeros_like(start) for _ in sizes], alpha, wd, 120)
    optimum = problem.optimum(total * wd)
    assert relative_error(global_.numpy(), optimum) < 1e-9

    strategy = server("feddyn", {"weight": (1, problem.dim)}, **{"feddyn-alpha": alpha, "weight-decay": wd})
    holding(
        strategy,
        global_=global_.float().double(),
        lambdas={client: ClientLambda(lam, ACCEPTED_ROUND) for client, lam in zip(clients, lambdas)},
        membership=membership(clients, sizes),
    )
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)

    count, remaining = len(sizes), [j for j in range(len(sizes)) if j != k]
    np.testing.assert_allclose(forgotten.weights, optimum - lambdas[k].numpy() / (count - 1), rtol=1e-6)
    gradient = sum(problem.grad(j, optimum) for j in remaining) + (total - sizes[k]) * wd * optimum
    step = count / ((count - 1) * alpha * total)
    np.testing.assert_allclose(forgotten.weights, optimum - step * gradient, rtol=1e-6)
    target = sub_problem(problem, k).optimum((total - sizes[k]) * wd)
    assert relative_error(forgotten.weights, target) > 1e-2
    assert forgotten.exact is False and forgotten.kl_before_after is None
    assert forgotten.state.membership == membership(without(clients, k), without(sizes, k))
    assert_forgotten_bookkeeping(strategy, forgotten, clients[k], without(clients, k))

    strategy.commit(forgotten.state)
    refined, _ = feddyn_rounds(
        sub_problem(problem, k),
        strategy.global_,
        [entry.value for entry in strategy.state.lambdas.values()],
        alpha,
        wd,
        120,
    )
    assert relative_error(refined.numpy(), target) < 1e-6


# ---- P-DSVGD, and Forget-SVGD's client-side route of DSVGD and U-DSVGD -------------------------------------------
PRIOR_VARIANCE = 4.0
LIKELIHOODS = [(1.0, 2.0), (-0.5, 3.0), (2.0, 1.5)]  # test A's two agents and a third, N(θ; mean, variance)


def gaussian_posterior(likelihoods) -> tuple[float, float]:
    precision = 1 / PRIOR_VARIANCE + sum(1 / variance for _, variance in likelihoods)
    return sum(mean / variance for mean, variance in likelihoods) / precision, 1 / precision


def test_p_dsvgd_forgets_an_agent_on_the_server_towards_the_remaining_agents_posterior():
    """1-D conjugate problem (test A's prior N(0, 4) and agents, plus a third): one P-DSVGD round leaves every agent's
    local particles sampling p_0 exp(−L_k) and the server's φ the posterior of all three. Forgetting agent 3 distils
    φ towards p_0 Π_{j≠3} t_j = q/t_3 from the server's state alone. Tolerances: the KDE factors (width λ = 0.3)
    widen each t_j, which biases the variance up by about 8% here (Gaussian calculation), plus N = 100 particles' own
    error: mean within 0.1, variance within [0.95, 1.25] x the exact posterior of the two remaining agents' data."""
    settings = SVGDSettings(local_steps=200, distill_steps=200, kde_bandwidth=0.3, lr=0.05, distill_lr=0.05)
    prior_score, k = gaussian_prior_score(1 / PRIOR_VARIANCE), 2
    start = 2.0 * torch.randn(100, 1, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    local_sets = [
        agent_round(start, start.clone(), prior_score, gaussian_loss_gradient(mean, variance), settings)[1]
        for mean, variance in LIKELIHOODS
    ]
    particles = server_distillation(start, local_sets, prior_score, 200, settings)

    strategy = server(
        "p-dsvgd",
        {"fc.weight": (1, 1)},
        **{"particles": 100, "kde-bandwidth": 0.3, "distill-lr": 0.05, "server-steps": 200, "prior-precision": 0.25},
    )
    clients = [f"agent-{j}" for j in range(len(LIKELIHOODS))]
    holding(
        strategy,
        particles=particles.numpy().astype(np.float32),
        local_particles={client: local.numpy().astype(np.float32) for client, local in zip(clients, local_sets)},
    )
    before = snapshot(strategy)
    forgotten = strategy.forget(clients[k])
    assert_unchanged(strategy, before)

    expected_mean, expected_variance = gaussian_posterior(without(LIKELIHOODS, k))
    assert abs(particles.mean().item() - expected_mean) > 0.5  # before: far from it (the posterior of all three)
    forgotten_particles = forgotten.state.particles.astype(np.float64)
    assert abs(forgotten_particles.mean() - expected_mean) < 0.1
    assert 0.95 < forgotten_particles.var(ddof=1) / expected_variance < 1.25
    np.testing.assert_allclose(forgotten.weights, forgotten_particles.mean(0), rtol=1e-6)
    assert sorted(forgotten.state.local_particles) == without(clients, k)
    assert forgotten.exact is False and forgotten.kl_before_after is None
    assert_forgotten_bookkeeping(strategy, forgotten, clients[k], without(clients, k))


FORGET_SETTINGS = SVGDSettings(local_steps=200, distill_steps=200, kde_bandwidth=0.3, lr=0.05, distill_lr=0.05)


def trained_agents(variant: str, rounds: int = 6):
    """`rounds` rounds (two round-robin cycles) of DSVGD or U-DSVGD over LIKELIHOODS from 100 particles of p_0; the
    global particles and each agent's factor (DSVGD: its local particles; U-DSVGD: its visits)."""
    prior_score = gaussian_prior_score(1 / PRIOR_VARIANCE)
    particles = PRIOR_VARIANCE**0.5 * torch.randn(100, 1, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    factors: list = [particles.clone() for _ in LIKELIHOODS] if variant == "dsvgd" else [[] for _ in LIKELIHOODS]
    for i in range(rounds):
        k, loss = i % len(LIKELIHOODS), gaussian_loss_gradient(*LIKELIHOODS[i % len(LIKELIHOODS)])
        if variant == "dsvgd":
            particles, factors[k] = agent_round(particles, factors[k], prior_score, loss, FORGET_SETTINGS)
        else:
            updated = unconstrained_tilted_update(particles, i == 0, factors[k], prior_score, loss, FORGET_SETTINGS)
            factors[k].append(Visit(None if i == 0 else particles, updated))
            particles = updated
    return particles, factors


def gaussian_kl(mean: float, variance: float, target: tuple[float, float]) -> float:
    """KL(N(mean, variance) ‖ N(target)), 1-D."""
    target_mean, target_variance = target
    ratio = variance / target_variance
    return 0.5 * (ratio - 1 - math.log(ratio) + (mean - target_mean) ** 2 / target_variance)


@pytest.mark.parametrize("variant", ["dsvgd", "u-dsvgd"])
def test_forget_svgd_takes_the_particles_to_the_posterior_of_the_remaining_agents(variant):
    """1-D conjugate problem, p_0 = N(0, 4) and three agents' Gaussian likelihoods; two round-robin cycles bring the
    particles to the posterior of all three, N(0.952, 0.571). Forgetting agent 2 (N(θ; -0.5, 3)) is its part of
    Forget-SVGD alone: SVGD from the global particles towards q/t_2 (`forget_update`, `unconstrained_forget_update`),
    no data. The result must be the posterior without agent 2, N(1.294, 0.706), within: mean ±0.15, variance x
    [0.8, 1.4]. Why that much: every factor is a KDE of width λ = 0.3, which widens it by λ²; the Gaussian recursion of
    the DSVGD tests (N -> ∞, exact SVGD) extended by this step puts the forget at N(1.318, 0.844) for DSVGD and
    N(1.394, 0.922) for U-DSVGD: +0.02/+0.10 in the mean, +20%/+31% in the variance. N = 100 particles and 8 SVGD loops
    add about ±0.05 to the mean and ±20% to the variance (DSVGD's own training lands at variance 0.57 where that
    recursion says 0.66). And it must be far nearer the remaining agents' posterior than the full one: KL to it under
    a quarter of KL to the full posterior (the particles before the forget were the other way round)."""
    particles, factors = trained_agents(variant)
    prior_score, k = gaussian_prior_score(1 / PRIOR_VARIANCE), 1
    if variant == "dsvgd":
        forgotten = forget_update(particles, factors[k], prior_score, FORGET_SETTINGS)
    else:
        forgotten = unconstrained_forget_update(particles, factors[k], prior_score, FORGET_SETTINGS)

    full, remaining = gaussian_posterior(LIKELIHOODS), gaussian_posterior(without(LIKELIHOODS, k))
    mean, variance = forgotten.mean().item(), forgotten.var().item()
    assert abs(mean - remaining[0]) < 0.15
    assert 0.8 < variance / remaining[1] < 1.4
    assert gaussian_kl(mean, variance, remaining) < gaussian_kl(mean, variance, full) / 4
    before = particles.mean().item(), particles.var().item()
    assert abs(before[0] - full[0]) < 0.1 and gaussian_kl(*before, full) < gaussian_kl(*before, remaining)


def test_the_forget_step_is_the_tilted_update_with_the_loss_left_out():
    """Same arithmetic, step for step: the forget reuses loop 1 (and U-DSVGD's update) with ∇L_k = 0."""
    particles, factors = trained_agents("dsvgd", rounds=3)
    prior, zero = gaussian_prior_score(0.25), lambda theta: torch.zeros_like(theta)
    settings = replace(FORGET_SETTINGS, local_steps=5)
    assert torch.equal(
        forget_update(particles, factors[0], prior, settings),
        tilted_update(particles, factors[0], prior, zero, settings),
    )
    particles, visits = trained_agents("u-dsvgd", rounds=3)
    assert torch.equal(
        unconstrained_forget_update(particles, visits[0], prior, settings),
        unconstrained_tilted_update(particles, False, visits[0], prior, zero, settings),
    )


@pytest.mark.parametrize("variant", ["dsvgd", "u-dsvgd"])
def test_dsvgd_forget_asks_the_client_and_adopts_its_answer_without_changing_the_strategy(variant):
    """DSVGD's factor t_k is in client k's store: `forget` is a ClientForget, the request carrying Θ and loop 1's step
    settings; `finish` on the client's (checked) answer makes it Θ, changing nothing until committed."""
    strategy = server(variant, {"fc.weight": (1, 1)}, **{"particles": 4, "local-steps": 7})
    particles = np.arange(4, dtype=np.float32).reshape(4, 1)
    holding(strategy, particles=particles)
    before = snapshot(strategy)
    asked = strategy.forget("agent-1")
    assert isinstance(asked, ClientForget) and isinstance(asked.instruction, pb.DSVGDForgetInstruction)
    assert asked.instruction.variant == variant and asked.instruction.steps == 7
    assert asked.instruction.particle_count == 4 and asked.reply_type is pb.DSVGDForgetReply
    np.testing.assert_array_equal(asked.tensors["particles"]["particles"], particles)
    assert asked.factor == ("the particles of its visits" if variant == "u-dsvgd" else "its local particles")

    answer = particles + 0.5
    content = encode(
        pb.Reply(header=new_header("fed", 3, "agent-1")), pb.DSVGDForgetReply(), {"particles": {"particles": answer}}
    )
    forgotten = asked.finish(decode(content, pb.Reply, pb.DSVGDForgetReply, asked.reply_layouts, sender="test"))
    assert_unchanged(strategy, before)
    np.testing.assert_array_equal(forgotten.state.particles, answer)
    np.testing.assert_allclose(forgotten.weights, [2.0])
    assert forgotten.exact is False and forgotten.kl_before_after is None and "q/t_k" in forgotten.note


# ---- refusals, and the untouched strategy --------------------------------------------------------------------------
LAYOUT = {"weight": (1, 3)}


def populated(name: str, clients: list[str]):
    """A strategy of `name` holding a small valid state of `clients`."""
    strategy = server(name, LAYOUT, **({"particles": 4, "server-steps": 2} if name == "p-dsvgd" else {}))
    zeros = torch.zeros(3, dtype=DTYPE)
    if name in ("bayesadmm", "bayesadmm-full"):
        precision = torch.eye(3, dtype=DTYPE) if name == "bayesadmm-full" else torch.ones(3, dtype=DTYPE)
        holding(
            strategy,
            global_=Gaussian(zeros, precision * (1 + len(clients))),
            duals={c: Duals(torch.arange(3, dtype=DTYPE), precision, ACCEPTED_ROUND) for c in clients},
        )
    elif name == "fedlap-cov":
        holding(
            strategy,
            global_mean=zeros,
            global_precision=torch.full_like(zeros, 1.0 + len(clients)),
            unclaimed=zeros,
            membership=membership(clients, [10] * len(clients)),
            sites={c: Site(torch.ones(3, dtype=DTYPE), torch.ones(3, dtype=DTYPE), ACCEPTED_ROUND) for c in clients},
        )
    elif name == "feddyn":
        holding(
            strategy,
            global_=zeros,
            membership=membership(clients, [10] * len(clients)),
            lambdas={c: ClientLambda(torch.full_like(zeros, 0.1), ACCEPTED_ROUND) for c in clients},
        )
    else:  # p-dsvgd
        generator = np.random.default_rng(0)
        holding(
            strategy,
            particles=generator.normal(size=(4, 3)).astype(np.float32),
            local_particles={c: generator.normal(size=(4, 3)).astype(np.float32) for c in clients},
        )
    return strategy


FORGETTING = ["bayesadmm", "bayesadmm-full", "fedlap-cov", "feddyn", "p-dsvgd"]


@pytest.mark.parametrize("name", FORGETTING)
def test_forget_computes_without_changing_the_strategy_and_refuses_unknown_and_last_clients(name):
    strategy = populated(name, ["client-a", "client-b"])
    before = snapshot(strategy)
    forgotten = strategy.forget("client-a")
    assert_unchanged(strategy, before)
    assert_forgotten_bookkeeping(strategy, forgotten, "client-a", ["client-b"])
    assert forgotten.weights.shape == (3,) and np.isfinite(forgotten.weights).all() and forgotten.note
    with pytest.raises(ForgetRefused, match="'client-z' is unknown"):
        strategy.forget("client-z")
    assert_unchanged(strategy, before)

    alone = populated(name, ["client-a"])
    before = snapshot(alone)
    with pytest.raises(ForgetRefused, match="'client-a' is the last remaining client"):
        alone.forget("client-a")
    assert_unchanged(alone, before)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedpa"])
def test_strategies_without_per_client_factors_refuse_and_name_the_retraining(name):
    strategy = server(name, LAYOUT)
    before = snapshot(strategy)
    with pytest.raises(
        ForgetRefused,
        match="no per-client factor.*retrain from the last checkpoint that predates the "
        "client's first accepted round, or from scratch",
    ):
        strategy.forget("client-a")
    assert_unchanged(strategy, before)


def test_feddyn_forget_under_a_robust_rule_takes_that_rule_over_the_remaining_lambdas():
    """With `robust-aggregation = median` the server step is w_g + median_j(w_j − w_g) + median_j λ_j: at the fixed
    point (w_j = w_g) forgetting client c leaves w_g + the coordinate-wise median of the other three λ_j."""
    strategy = server("feddyn", LAYOUT, **{"robust-aggregation": "median"})
    clients = ["client-a", "client-b", "client-c", "client-d"]
    values = [[0.5, 5.0, -1.0], [0.25, -3.0, 0.0], [10.0, 0.0, 0.5], [0.75, 1.0, 1.0]]
    holding(
        strategy,
        global_=torch.tensor([1.0, 2.0, 3.0], dtype=DTYPE),
        membership=membership(clients, [10, 20, 30, 40]),
        lambdas={c: ClientLambda(torch.tensor(v, dtype=DTYPE), ACCEPTED_ROUND) for c, v in zip(clients, values)},
    )
    forgotten = strategy.forget("client-c")
    np.testing.assert_array_equal(forgotten.weights, [1.5, 3.0, 3.0])


def test_bayesadmm_refuses_when_the_remaining_duals_make_no_posterior():
    """Diagonal duals early in a run are differences of precisions and can be negative: without client a, δ + U_b < 0
    is no precision. The refusal says the duals are not yet sites."""
    strategy = populated("bayesadmm", ["client-a", "client-b"])
    negative = Duals(torch.zeros(3, dtype=DTYPE), torch.full((3,), -2.0, dtype=DTYPE), ACCEPTED_ROUND)
    holding(strategy, duals={**strategy.state.duals, "client-b": negative})
    before = snapshot(strategy)
    with pytest.raises(ForgetRefused, match="precisions would be <= 0: the remaining duals are not yet sites"):
        strategy.forget("client-a")
    assert_unchanged(strategy, before)


@pytest.mark.parametrize("name", FORGETTING)
def test_committed_forget_lets_the_remaining_clients_go_on_and_holds_nothing_of_the_forgotten_one(tmp_path, name):
    """Real client halves in one process: after two rounds, client-2 is forgotten and its state committed (as the
    round core commits an Update). The next round's replies of the remaining clients pass every replay check against
    the state they left. Nothing names a state of client-2 any more: its node, told of no accepted round, starts
    afresh and is taken as a new client (whether it may come back at all is the caller's: it revokes the id)."""
    federation = InProcessFederation(tmp_path, overrides(name), sizes=[10, 14, 12])
    for server_round in (1, 2):
        federation.round(server_round, [1, 2, 3])
    core = federation.core
    forgotten = core.strategy.forget("client-2")
    core.adopt(Change(forgotten.state, dropped="client-2"))
    federation.arrays = ArrayRecord({n: Array(v) for n, v in unflatten(forgotten.weights, federation.layout).items()})
    federation.round(3, [1, 3])
    assert federation.report.accepted == ["client-1", "client-3"] and not federation.report.rejected
    assert "client-2" not in core.accepted_rounds
    federation.round(4, [1, 2, 3])
    assert federation.report.accepted == ["client-1", "client-2", "client-3"] and not federation.report.rejected
    assert core.accepted_rounds == {"client-1": 4, "client-2": 4, "client-3": 4}


# ---- the Gaussian KL ----------------------------------------------------------------------------------------------
def test_gaussian_kl_matches_the_closed_forms_of_every_family():
    generator = torch.Generator().manual_seed(0)
    m0, m1 = torch.randn(3, generator=generator, dtype=DTYPE), torch.randn(3, generator=generator, dtype=DTYPE)
    a = torch.randn(3, 3, generator=generator, dtype=DTYPE)
    s0, s1 = a @ a.T + torch.eye(3, dtype=DTYPE), 2 * torch.eye(3, dtype=DTYPE) + 0.5 * torch.ones(3, 3, dtype=DTYPE)
    mvn = torch.distributions.MultivariateNormal
    assert kl_divergence(Gaussian(m0, s0), Gaussian(m1, s1)) == pytest.approx(
        torch.distributions.kl_divergence(mvn(m0, precision_matrix=s0), mvn(m1, precision_matrix=s1)).item(), rel=1e-10
    )
    d0, d1 = torch.tensor([1.0, 4.0, 0.5], dtype=DTYPE), torch.tensor([2.0, 1.0, 3.0], dtype=DTYPE)
    normal = torch.distributions.Normal
    assert kl_divergence(Gaussian(m0, d0), Gaussian(m1, d1)) == pytest.approx(
        torch.distributions.kl_divergence(normal(m0, d0**-0.5), normal(m1, d1**-0.5)).sum().item(), rel=1e-10
    )
    i0, i1 = torch.tensor(2.0, dtype=DTYPE), torch.tensor(0.5, dtype=DTYPE)
    assert kl_divergence(Gaussian(m0, i0), Gaussian(m1, i1)) == pytest.approx(
        kl_divergence(Gaussian(m0, i0 * torch.eye(3, dtype=DTYPE)), Gaussian(m1, i1 * torch.eye(3, dtype=DTYPE))),
        rel=1e-10,
    )
    assert kl_divergence(Gaussian(m0, s0), Gaussian(m0, s0)) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="between a diagonal and a full Gaussian"):
        kl_divergence(Gaussian(m0, d0), Gaussian(m1, s1))
