"""The extra terms of the local objectives (FedProx's, FedDyn's and FedLap's anchored penalty, federated ADMM's):
value and gradient against closed forms, FedProx's multi-tensor path against its single-tensor one, and the training
loop adding them at the weights the loss was taken at."""

import pytest
import torch

from fedbayes.client.training import anchored_penalty, make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies.bayesadmm.client import admm_terms
from fedbayes.strategies.fedavg.client import proximal_term
from fedbayes.tasks.datasets import Dataset
from tests.support import NO_GPU

CPU = torch.device("cpu")


def network(device: torch.device = CPU) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).to(device)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def flat_grads(parameters) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in parameters])


def with_data_gradient(parameters) -> torch.Tensor:
    """Gives every parameter a known gradient, as a loss's backward pass would; returns it, flat."""
    generator = torch.Generator().manual_seed(1)
    for p in parameters:
        p.grad = torch.randn(p.shape, generator=generator).to(p.device)
    return flat_grads(parameters).clone()


@pytest.mark.parametrize("weight", [0.3, "per-parameter"])
def test_the_anchored_penalty_adds_weight_times_the_distance_and_returns_half_the_weighted_square(weight):
    parameters = list(network().parameters())
    theta = flat(parameters)
    anchor = theta + torch.linspace(-1.0, 1.0, theta.numel())
    w = torch.linspace(0.0, 2.0, theta.numel()) if weight == "per-parameter" else weight
    data = with_data_gradient(parameters)
    value = anchored_penalty(anchor, w)(parameters)
    torch.testing.assert_close(value, 0.5 * (w * (theta - anchor).square()).sum())
    torch.testing.assert_close(flat_grads(parameters), data + w * (theta - anchor))


def test_a_term_gives_a_parameter_the_loss_never_reached_its_gradient():
    parameters = list(network().parameters())
    theta = flat(parameters)
    anchor = torch.zeros_like(theta)
    anchored_penalty(anchor, 2.0)(parameters)  # no .grad anywhere yet
    torch.testing.assert_close(flat_grads(parameters), 2.0 * theta)


@pytest.mark.parametrize("foreach", [False, True], ids=["single-tensor", "multi-tensor"])
def test_a_frozen_parameter_gets_no_gradient_from_a_term_as_from_autograd(foreach):
    model = network()
    model[0].bias.requires_grad_(False)
    parameters = list(model.parameters())
    anchor = [torch.zeros_like(p) for p in parameters]
    proximal_term(1.0, anchor, foreach=foreach)(parameters)
    anchored_penalty(torch.zeros_like(flat(parameters)), 1.0)(parameters)
    assert model[0].bias.grad is None
    torch.testing.assert_close(model[0].weight.grad, 2.0 * model[0].weight.detach())


def test_the_admm_terms_are_the_dual_and_the_proximal_term_over_the_examples():
    """(v·θ + ρ/2 ‖θ − m̄‖²)/N, gradient (v + ρ (θ − m̄))/N."""
    parameters = list(network().parameters())
    theta = flat(parameters)
    dual = torch.linspace(-2.0, 3.0, theta.numel())
    anchor = theta - torch.linspace(0.5, -0.5, theta.numel())
    rho, examples = 0.7, 40
    data = with_data_gradient(parameters)
    value = admm_terms(dual, anchor, rho, examples)(parameters)
    torch.testing.assert_close(value, (dual @ theta + 0.5 * rho * (theta - anchor).square().sum()) / examples)
    torch.testing.assert_close(flat_grads(parameters), data + (dual + rho * (theta - anchor)) / examples)


def proximal(foreach: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FedProx's term at μ = 0.5 on a network moved away from its anchor: (value, gradients, expected gradients)."""
    model = network(device)
    anchor = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(0.1 * (i + 1))
    parameters = list(model.parameters())
    data = with_data_gradient(parameters)
    value = proximal_term(0.5, anchor, foreach=foreach)(parameters)
    return value, flat_grads(parameters), data + 0.5 * (flat(parameters) - flat(anchor))


@pytest.mark.parametrize("foreach", [False, True], ids=["single-tensor", "multi-tensor"])
def test_the_proximal_term_is_half_mu_squared_distance_with_gradient_mu_times_the_distance(foreach):
    value, grads, expected = proximal(foreach, CPU)
    sizes = [12, 4, 8, 2]  # the tensors, moved by 0.1, 0.2, 0.3, 0.4
    squared = sum(n * (0.1 * (i + 1)) ** 2 for i, n in enumerate(sizes))
    assert value.item() == pytest.approx(0.5 * 0.5 * squared, rel=1e-6)
    torch.testing.assert_close(grads, expected)


@pytest.mark.parametrize(
    "device",
    [
        CPU,
        pytest.param(
            torch.device("cuda"), marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU), id="cuda"
        ),
    ],
    ids=str,
)
def test_the_proximal_terms_two_paths_agree(device):
    single, multi = proximal(False, device), proximal(True, device)
    for a, b in zip(single, multi):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_training_adds_the_terms_gradient_and_reports_the_loss_with_it():
    """SGD at lr 1 on a loss that is 0 at any weights (its gradient too) plus ½ μ ‖θ − 0‖²: each step multiplies the
    weights by 1 − μ, and the reported loss is the term's value, the mean over the epoch's steps."""
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    data = Dataset("fmnist", torch.zeros(4, 2), torch.zeros(4, dtype=torch.long), 2, pixel_scale=1.0)
    optimizer = make_optimizer(model, pb.LocalTraining(epochs=1, batch_size=2, learning_rate=1.0, optimizer="sgd"))
    zero_loss = lambda out, labels: 0.0 * out.sum()  # noqa: E731
    mu = 0.25
    anchor = [torch.zeros(2, 2)]
    term = proximal_term(mu, anchor)
    loss, _ = train_epochs(model, data, optimizer, 1, 2, CPU, seed=0, loss_fn=zero_loss, extra_term=term)
    torch.testing.assert_close(model.weight.detach(), torch.full((2, 2), (1.0 - mu) ** 2))
    values = [0.5 * mu * 4 * (1.0 - mu) ** (2 * step) for step in range(2)]
    assert loss == pytest.approx(sum(values) / 2, rel=1e-6)
