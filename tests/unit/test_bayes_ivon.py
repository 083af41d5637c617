"""IVON with prior mean and Lagrange terms (BayesADMM Alg. 2) against closed forms."""

import ivon
import pytest
import torch

from fedbayes.bayes.curvature import diag_ggn
from fedbayes.bayes.ivon import (
    MAX_INITIAL_WIDTH,
    IVONWithPrior,
    hessian_init,
    hessian_init_within_weights,
    hessian_momentum,
    hessian_under_prior,
)


def run_quadratic(optimizer, theta, curvature, target, steps):
    """loss(theta) = mean_i 1/2 a_i (theta_i - b_i)^2 summed over coordinates."""
    for _ in range(steps):
        with optimizer.sampled_params(train=True):
            optimizer.zero_grad()
            loss = 0.5 * (curvature * (theta - target).square()).sum()
            loss.backward()
        optimizer.step()


def test_without_prior_mean_and_duals_it_is_stock_ivon():
    results = []
    for optimizer_class in (ivon.IVON, IVONWithPrior):
        torch.manual_seed(0)
        theta = torch.nn.Parameter(torch.zeros(5))
        kwargs = dict(lr=0.05, ess=100.0, hess_init=0.5, beta2=0.999)
        if optimizer_class is ivon.IVON:
            optimizer = optimizer_class([theta], weight_decay=0.01, **kwargs)
        else:
            optimizer = optimizer_class([theta], prior_precision=0.01, **kwargs)
        run_quadratic(optimizer, theta, torch.linspace(0.5, 2.0, 5), torch.linspace(-1.0, 1.0, 5), steps=50)
        results.append((theta.detach().clone(), optimizer.param_groups[0]["hess"].clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


def test_reaches_the_closed_form_minimiser_of_eq_30():
    """ess·E_q[loss + v·theta - 1/2 u theta^2] + KL(q || N(m_p, 1/(ess·delta))) with a quadratic loss
    is minimised by precision ess·(a - u + delta) and mean (a b - v + delta m_p) / (a - u + delta)."""
    torch.manual_seed(1)
    # Moderate ess: little sampling noise in the last iterate, and a small upward bias of IVON's
    # Hessian correction term (which grows with ess * (1 - beta2) * gradient^2).
    ess = 200.0
    curvature = torch.tensor([1.0, 2.0, 0.5, 3.0])
    target = torch.tensor([0.5, -1.0, 2.0, 0.0])
    u = torch.tensor([-0.4, 0.5, 0.2, -1.0])  # u < a keeps the objective convex
    prior_mean = torch.tensor([1.0, 1.0, -1.0, 0.5])
    prior_precision = ess * torch.tensor([0.2, 0.1, 0.3, 0.05])  # absolute units
    # v chosen so that the optimum sits at the loss minimum b: the Price Hessian samples then have
    # low variance and the final h can be compared tightly (the mean check is no weaker for it).
    v = u * target - prior_precision / ess * (target - prior_mean)
    theta = torch.nn.Parameter(torch.zeros(4))
    optimizer = IVONWithPrior([theta], lr=0.05, ess=ess, hess_init=1.0, beta1=0.9, beta2=0.999, rescale_lr=False)
    optimizer.set_prior(prior_mean, prior_precision)
    optimizer.set_lagrange(v, u)
    run_quadratic(optimizer, theta, curvature, target, steps=5000)
    delta = prior_precision / ess
    expected_mean = (curvature * target - v + delta * prior_mean) / (curvature - u + delta)
    expected_precision = ess * (curvature - u + delta)
    mean, precision = optimizer.posterior()
    torch.testing.assert_close(mean, expected_mean, atol=1e-2, rtol=0)
    # The tolerance separates the right signs from the wrong ones.
    flipped_v = (curvature * target + v + delta * prior_mean) / (curvature - u + delta)
    flipped_u = (curvature * target - v + delta * prior_mean) / (curvature + u + delta)
    assert (flipped_v - expected_mean).abs().max() > 0.1 and (flipped_u - expected_mean).abs().max() > 0.1
    torch.testing.assert_close(precision, expected_precision, rtol=0.05, atol=0)


def test_posterior_setter_round_trips_and_state_dict_keeps_the_terms():
    theta = torch.nn.Parameter(torch.zeros(3))
    optimizer = IVONWithPrior([theta], lr=0.1, ess=10.0, prior_precision=0.5)
    optimizer.set_posterior(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([20.0, 30.0, 40.0]))
    mean, precision = optimizer.posterior()
    torch.testing.assert_close(mean, torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(precision, torch.tensor([20.0, 30.0, 40.0]))
    optimizer.set_lagrange(torch.ones(3), 2 * torch.ones(3))
    group = optimizer.state_dict()["param_groups"][0]
    assert torch.equal(group["dual_quadratic"], 2 * torch.ones(3)) and "prior_mean" in group
    with pytest.raises(ValueError, match="expected 3 values"):
        optimizer.set_prior(torch.zeros(4), torch.ones(4))


def test_a_carried_hessian_is_kept_where_the_new_prior_keeps_its_precision_positive():
    hess = torch.tensor([-2.0, -1.0, -0.5, 0.0, 1.0])
    torch.testing.assert_close(hessian_under_prior(hess, torch.ones(5)), torch.tensor([0.0, 0.0, -0.5, 0.0, 1.0]))


def test_carrying_a_negative_hessian_into_a_looser_prior_samples_finite_weights():
    """h = -0.5 was valid under δ = 1 (h + δ > 0); the next round's prior δ' = 0.1 would give a negative
    variance there (NaN weights, the `reset-posterior` off failure): the carried h keeps the new prior's
    precision instead, and leaves the other coordinates as they were."""
    ess = 10.0
    theta = torch.nn.Parameter(torch.zeros(3))
    optimizer = IVONWithPrior([theta], lr=0.1, ess=ess, hess_init=1.0)
    optimizer.set_prior(torch.zeros(3), ess * torch.tensor([0.1, 0.1, 0.1]))
    carried = {"momentum": torch.zeros(3), "hess": torch.tensor([-0.5, 0.3, -0.05]), "step": torch.tensor([7])}
    optimizer.carry_on(carried)
    _, precision = optimizer.posterior()
    torch.testing.assert_close(precision, ess * torch.tensor([0.1, 0.4, 0.05]))
    assert optimizer.current_step == 7
    torch.manual_seed(0)
    run_quadratic(optimizer, theta, torch.ones(3), torch.ones(3), steps=3)
    assert torch.isfinite(theta).all() and torch.isfinite(optimizer.posterior()[1]).all()


@pytest.mark.parametrize("steps", [1, 5, 19, 190, 1900])
def test_hessian_momentum_gives_a_round_the_papers_weight_of_its_hessian_samples(steps):
    """1 - β2^T is the weight a round of T steps gives its Hessian samples (from h = 0): the paper's 1 - 0.9998^190."""
    beta2 = hessian_momentum(steps)
    assert 1.0 - beta2**steps == pytest.approx(1.0 - 0.9998**190, rel=1e-9)
    assert 0.0 < beta2 < 1.0


def test_hessian_momentum_is_the_papers_at_its_190_steps_and_refuses_no_steps():
    assert hessian_momentum(190) == pytest.approx(0.9998, rel=1e-12)
    with pytest.raises(ValueError, match="steps_per_round must be >= 1"):
        hessian_momentum(0)


def test_hessian_init_is_twice_the_mean_ggn_per_example_closed_form_for_logistic_regression():
    """Softmax regression at zero weights: p_c = 1/C for every input, so the diagonal GGN per example is
    x_j² p(1-p) for each weight w_cj and p(1-p) for each bias: mean over parameters p(1-p) (Σ_j E[x_j²] + 1)/(D + 1)."""
    torch.manual_seed(0)
    classes, features, examples = 4, 6, 50
    model = torch.nn.Linear(features, classes)
    torch.nn.init.zeros_(model.weight), torch.nn.init.zeros_(model.bias)
    x = torch.randn(examples, features) * torch.linspace(0.5, 3.0, features)
    p = 1.0 / classes
    expected = 2.0 * p * (1 - p) * (x.double().square().mean(0).sum().item() + 1.0) / (features + 1)
    assert hessian_init(diag_ggn(model, x), examples) == pytest.approx(expected, rel=1e-6)


def test_hessian_init_refuses_a_flat_loss_nan_and_no_examples():
    for ggn in (torch.zeros(10, dtype=torch.float64), torch.full((10,), float("nan"), dtype=torch.float64)):
        with pytest.raises(ValueError, match="no curvature to derive IVON's h0 from .* set hess-init > 0"):
            hessian_init(ggn, 5)
    with pytest.raises(ValueError, match="examples must be >= 1"):
        hessian_init(torch.ones(10, dtype=torch.float64), 0)


def test_hessian_init_within_weights_keeps_the_curvatures_h0_unless_the_first_posterior_drowns_the_weights():
    """Weights of root mean square 0.1 and ess 1e4: variance 1/(ess·h0) equals their mean square 0.01 at h0 = 0.01.
    The curvature's h0 stands while its standard deviation is at most MAX_INITIAL_WIDTH x 0.1: h0 >= 0.01 / 9."""
    weights = torch.tensor([0.1, -0.1, 0.1, -0.1], dtype=torch.float64)
    width_one = 1.0 / (1e4 * 0.01)
    assert MAX_INITIAL_WIDTH == 3.0
    for kept in (0.5, 0.01, 0.002, width_one / 9.0):
        assert hessian_init_within_weights(kept, weights, 1e4) == kept
    for too_small in (width_one / 9.0 * 0.999, 1e-6):
        assert hessian_init_within_weights(too_small, weights, 1e4) == pytest.approx(width_one, rel=1e-12)
        width = (1.0 / (1e4 * too_small)) ** 0.5 / 0.1  # what the curvature's h0 would have given
        assert width > MAX_INITIAL_WIDTH


def test_hessian_init_within_weights_refuses_no_weight_scale_and_no_ess():
    for weights in (torch.zeros(4, dtype=torch.float64), torch.full((4,), float("nan"), dtype=torch.float64)):
        with pytest.raises(ValueError, match="no weight scale to bound IVON's h0 by .* set hess-init > 0"):
            hessian_init_within_weights(1e-3, weights, 1e4)
    with pytest.raises(ValueError, match="ess must be > 0"):
        hessian_init_within_weights(1e-3, torch.ones(4), 0.0)
