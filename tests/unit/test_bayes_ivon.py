"""IVON with prior mean and Lagrange terms (BayesADMM Alg. 2) against closed forms; its multi-tensor path against
its single-tensor one."""

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
from fedbayes.bayes.params import parameter_views, uses_multi_tensor
from tests.support import NO_GPU

PATHS = pytest.mark.parametrize("foreach", [False, True], ids=["single-tensor", "multi-tensor"])


def run_quadratic(optimizer, theta, curvature, target, steps):
    """loss(theta) = mean_i 1/2 a_i (theta_i - b_i)^2 summed over coordinates."""
    for _ in range(steps):
        with optimizer.sampled_params(train=True):
            optimizer.zero_grad()
            loss = 0.5 * (curvature * (theta - target).square()).sum()
            loss.backward()
        optimizer.step()


@PATHS
def test_without_prior_mean_and_duals_it_is_stock_ivon(foreach):
    results = []
    for optimizer_class in (ivon.IVON, IVONWithPrior):
        torch.manual_seed(0)
        theta = torch.nn.Parameter(torch.zeros(5))
        kwargs = dict(lr=0.05, ess=100.0, hess_init=0.5, beta2=0.999)
        if optimizer_class is ivon.IVON:
            optimizer = optimizer_class([theta], weight_decay=0.01, **kwargs)
        else:
            optimizer = optimizer_class([theta], prior_precision=0.01, foreach=foreach, **kwargs)
        run_quadratic(optimizer, theta, torch.linspace(0.5, 2.0, 5), torch.linspace(-1.0, 1.0, 5), steps=50)
        results.append((theta.detach().clone(), optimizer.param_groups[0]["hess"].clone()))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])


@PATHS
def test_reaches_the_closed_form_minimiser_of_eq_30(foreach):
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
    optimizer = IVONWithPrior(
        [theta], lr=0.05, ess=ess, hess_init=1.0, beta1=0.9, beta2=0.999, rescale_lr=False, foreach=foreach
    )
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


def small_network() -> torch.nn.Module:
    """Tensors of four shapes (a convolution's weight and bias, a linear layer's), an unused one among them."""
    torch.manual_seed(3)
    network = torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3), torch.nn.Sigmoid(), torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 5)
    )
    network.register_parameter("unused", torch.nn.Parameter(torch.zeros(2), requires_grad=False))
    return network


def trained(foreach: bool, device: torch.device, steps: int = 6, **options) -> tuple[torch.Tensor, ...]:
    """`steps` steps on a small network with a prior, both Lagrange terms and a carried momentum and Hessian;
    returns the posterior's mean and precision and IVON's momentum."""
    network = small_network().to(device)
    size = sum(p.numel() for p in network.parameters())
    generator = torch.Generator().manual_seed(4)
    values = {name: torch.randn(size, generator=generator) for name in ("mean", "v", "momentum")}
    ess = 500.0
    optimizer = IVONWithPrior(
        network.parameters(), lr=0.05, ess=ess, hess_init=0.5, beta2=0.99, foreach=foreach, **options
    )
    optimizer.set_prior(0.1 * values["mean"].to(device), ess * torch.linspace(0.1, 1.0, size, device=device))
    optimizer.set_lagrange(0.01 * values["v"].to(device), torch.linspace(-0.05, 0.05, size, device=device))
    hess = torch.linspace(0.2, 2.0, size)
    optimizer.carry_on({"momentum": 0.1 * values["momentum"], "hess": hess, "step": torch.tensor([3])})
    images = torch.rand(16, 2, 6, 6, generator=generator).to(device)
    labels = torch.randint(0, 5, (16,), generator=generator).to(device)
    torch.manual_seed(5)  # the weight noise: the same draws on both paths
    for _ in range(steps):
        for _ in range(optimizer.mc_samples):
            with optimizer.sampled_params(train=True):
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(network(images), labels).backward()
        optimizer.step()
    mean, precision = optimizer.posterior()
    return mean, precision, optimizer.param_groups[0]["momentum"]


OPTIONS = [
    {},
    {"rescale_lr": False},
    {"mc_samples": 3},
    {"clip_radius": 0.01},
    {"hess_approx": "gradsq"},
    {"debias": False},
]


def assert_paths_agree(device: torch.device, options: dict) -> None:
    single, multi = trained(False, device, **options), trained(True, device, **options)
    for name, a, b in zip(("mean", "precision", "momentum"), single, multi):
        # float32 round-off over a few steps: a few ulps of each vector's scale
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6 * float(a.abs().max()), msg=f"{name}, {options}")
    before = trained(False, device, steps=0, **options)
    assert (single[0] - before[0]).abs().max() > 1e-3  # the steps moved the mean: the comparison says something


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_the_multi_tensor_step_equals_the_single_tensor_step_on_the_cpu(options):
    assert_paths_agree(torch.device("cpu"), options)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_the_multi_tensor_step_equals_the_single_tensor_step_on_cuda(options):
    assert_paths_agree(torch.device("cuda"), options)


def test_the_multi_tensor_path_is_the_default_on_cuda_only():
    theta = torch.nn.Parameter(torch.zeros(3))
    assert not IVONWithPrior([theta], lr=0.1, ess=10.0).foreach
    assert IVONWithPrior([theta], lr=0.1, ess=10.0, foreach=True).foreach
    assert uses_multi_tensor(None, torch.device("cuda")) and not uses_multi_tensor(None, torch.device("cpu"))
    assert not uses_multi_tensor(False, torch.device("cuda")) and uses_multi_tensor(True, torch.device("cpu"))


@PATHS
def test_the_carried_state_is_a_copy_both_ways_that_later_steps_leave_alone(foreach):
    """The multi-tensor path updates IVON's momentum and Hessian in place: neither what a client stored from one
    optimizer nor what it handed to the next may move with their steps."""
    theta = torch.nn.Parameter(torch.zeros(3))
    optimizer = IVONWithPrior([theta], lr=0.1, ess=10.0, hess_init=1.0, foreach=foreach)
    torch.manual_seed(0)
    run_quadratic(optimizer, theta, torch.ones(3), torch.ones(3), steps=2)
    carried = optimizer.carried_state()
    kept = {name: value.clone() for name, value in carried.items()}
    run_quadratic(optimizer, theta, torch.ones(3), torch.ones(3), steps=2)
    assert all(torch.equal(carried[name], kept[name]) for name in kept)
    assert not torch.equal(optimizer.param_groups[0]["hess"], kept["hess"])
    following = IVONWithPrior([theta], lr=0.1, ess=10.0, hess_init=1.0, foreach=foreach)
    following.carry_on(carried)
    run_quadratic(following, theta, torch.ones(3), torch.ones(3), steps=2)
    assert all(torch.equal(carried[name], kept[name]) for name in kept)
    assert not torch.equal(following.param_groups[0]["momentum"], kept["momentum"])


@PATHS
def test_a_prior_set_between_steps_is_the_one_the_next_step_uses(foreach):
    """The multi-tensor path keeps views of the prior's vectors: a new prior must replace them. With δ huge the step
    pulls the mean onto the prior's mean almost at once (the loss is 0 here: no data gradient)."""
    ess = 10.0
    theta = torch.nn.Parameter(torch.zeros(2))
    optimizer = IVONWithPrior([theta], lr=0.5, ess=ess, hess_init=1.0, rescale_lr=False, foreach=foreach)
    run_quadratic(optimizer, theta, torch.zeros(2), torch.zeros(2), steps=1)
    optimizer.set_prior(torch.tensor([2.0, -3.0]), ess * torch.tensor([1e6, 1e6]))
    torch.manual_seed(0)
    run_quadratic(optimizer, theta, torch.zeros(2), torch.zeros(2), steps=20)
    torch.testing.assert_close(theta.detach(), torch.tensor([2.0, -3.0]), atol=1e-3, rtol=0)


def test_parameter_views_are_shaped_views_of_the_flat_vector_and_refuse_a_wrong_size():
    like = [torch.zeros(2, 3), torch.zeros(4), torch.zeros(1, 1, 2)]
    flat = torch.arange(12.0)
    views = parameter_views(flat, like)
    assert [v.shape for v in views] == [t.shape for t in like]
    torch.testing.assert_close(views[1], torch.tensor([6.0, 7.0, 8.0, 9.0]))
    views[2].add_(100.0)
    torch.testing.assert_close(flat[10:], torch.tensor([110.0, 111.0]))
    with pytest.raises(ValueError, match="flat vector has 11 values, the tensors need 12"):
        parameter_views(torch.zeros(11), like)


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
