"""FedLap-Func's math against closed forms ([P] §3.4, Eq. 17, App. E): the memory and its weights τ_i by hand, the
client's function-space terms as the paper's two soft cross-entropies, zero gradients at a stationary point, and the
server objective's gradient, by hand for a softmax regression, against autograd."""

import pytest
import torch

from fedbayes.bayes.params import parameter_layout
from fedbayes.strategies.fedlap_func.math import (
    fit_global,
    function_space_terms,
    model_logits,
    pick_memory,
    point_weights,
    probability_rows_error,
    represented_examples,
    server_objective,
    soft_cross_entropy,
    soft_predictions,
)
from fedbayes.tasks.models import build_model

DTYPE = torch.float64


def softmax_regression(features: int = 4, classes: int = 3, seed: int = 0):
    """A logistic regression (one Linear layer) in float64, its layout and random flat weights."""
    torch.manual_seed(seed)
    model = build_model("logreg", (1, 1, features), classes).to(DTYPE).eval()
    layout = parameter_layout(model)
    weights = torch.randn(sum(w.numel() for w in model.parameters()), dtype=DTYPE, generator=torch.Generator())
    return model, layout, weights


def test_the_memory_is_per_class_points_of_each_class_the_client_holds_drawn_from_its_seed():
    labels = torch.tensor([2, 0, 2, 2, 1, 0, 2, 0, 0, 2])  # class 0: 4, class 1: 1, class 2: 5 examples
    memory = pick_memory(labels, 2, torch.Generator().manual_seed(3))
    assert labels[memory].tolist() == [0, 0, 1, 2, 2]  # two per class, one where the class has one
    assert len(set(memory.tolist())) == 5
    again = pick_memory(labels, 2, torch.Generator().manual_seed(3))
    assert torch.equal(memory, again)
    others = {tuple(pick_memory(labels, 2, torch.Generator().manual_seed(s)).tolist()) for s in range(20)}
    assert len(others) > 1  # drawn, not the first of each class
    assert pick_memory(labels, 0, torch.Generator().manual_seed(3)).tolist() == []
    assert sorted(pick_memory(labels, 10, torch.Generator().manual_seed(3)).tolist()) == list(range(10))


def test_each_point_weighs_tau_f_times_the_examples_of_its_class_it_stands_for():
    """[P] App. E: τ_i = τ_f · N_{k,c} / M_{k,c}, by hand for a client with 4, 1 and 5 examples of classes 0-2 and
    memory points 2, 1, 2 of them: 4/2, 1/1, 5/2; τ_f = 0.1."""
    labels = torch.tensor([2, 0, 2, 2, 1, 0, 2, 0, 0, 2])
    memory = torch.tensor([1, 5, 4, 0, 2])  # classes 0, 0, 1, 2, 2
    represented = represented_examples(labels, memory)
    torch.testing.assert_close(represented, torch.tensor([2.0, 2.0, 1.0, 2.5, 2.5], dtype=DTYPE), rtol=0, atol=0)
    taus = point_weights(represented, 0.1)
    torch.testing.assert_close(taus, torch.tensor([0.2, 0.2, 0.1, 0.25, 0.25], dtype=DTYPE), rtol=1e-15, atol=0)
    assert taus.sum().item() == pytest.approx(0.1 * len(labels))  # Σ τ_i = τ_f N_k


def test_the_soft_cross_entropy_is_summed_over_the_points_and_weighted_by_tau():
    logits = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=DTYPE)
    targets = torch.tensor([[0.25, 0.75], [1.0, 0.0]], dtype=DTYPE)
    taus = torch.tensor([2.0, 3.0], dtype=DTYPE)
    log_p = torch.log_softmax(logits, 1)
    by_hand = -(2.0 * (0.25 * log_p[0, 0] + 0.75 * log_p[0, 1]) + 3.0 * log_p[1, 0])
    torch.testing.assert_close(soft_cross_entropy(targets, logits, taus), by_hand, rtol=1e-15, atol=0)


def test_the_clients_terms_are_the_papers_two_soft_cross_entropies_and_linear_in_the_logits():
    """Σ τ_i [ℓ(ŷ_{i,g}, w) − ℓ(ŷ_i, w)] ([P] Eq. 17 on the client's own points) = Σ τ_i (ŷ_i − ŷ_{i,g})·f(x_i; w):
    the same value and the same gradient for any weights."""
    model, layout, weights = softmax_regression()
    inputs = torch.randn(6, 1, 1, 4, dtype=DTYPE)
    logits_of = model_logits(model, layout, inputs)
    global_predictions = torch.softmax(torch.randn(6, 3, dtype=DTYPE), 1)
    previous_predictions = torch.softmax(torch.randn(6, 3, dtype=DTYPE), 1)
    taus = torch.rand(6, dtype=DTYPE) * 5
    for _ in range(3):
        w = (weights + torch.randn_like(weights)).requires_grad_(True)
        ours = function_space_terms(logits_of(w), global_predictions, previous_predictions, taus)
        papers = soft_cross_entropy(global_predictions, logits_of(w), taus) - soft_cross_entropy(
            previous_predictions, logits_of(w), taus
        )
        torch.testing.assert_close(ours, papers, rtol=1e-12, atol=1e-12)
        (ours_gradient,) = torch.autograd.grad(ours, w)
        (papers_gradient,) = torch.autograd.grad(papers, w)
        torch.testing.assert_close(ours_gradient, papers_gradient, rtol=1e-12, atol=1e-12)


def test_at_a_stationary_point_every_function_space_term_has_zero_gradient():
    """w_g = w_k = w* and ŷ_i = ŷ_{i,g} = softmax f(x_i; w*) ([P] §3.4): the client's terms, the term over other
    clients' points this implementation leaves out, and the server's fit term all have zero gradient at w*, so
    the server's fit keeps w_lap = w* and the fixed point is FedLap's. Away from it they do not vanish."""
    model, layout, stationary = softmax_regression(seed=1)
    own, others = torch.randn(5, 1, 1, 4, dtype=DTYPE), torch.randn(7, 1, 1, 4, dtype=DTYPE)
    own_logits, other_logits = model_logits(model, layout, own), model_logits(model, layout, others)
    taus_own, taus_others = torch.rand(5, dtype=DTYPE) + 1, torch.rand(7, dtype=DTYPE) + 1
    predictions = soft_predictions(own_logits, stationary).double()
    exact = torch.softmax(own_logits(stationary), 1).detach()  # float64: the test's own stationary soft labels
    other_predictions = torch.softmax(other_logits(stationary), 1).detach()
    w = stationary.clone().requires_grad_(True)
    terms = {
        "client": function_space_terms(own_logits(w), exact, exact, taus_own),
        "left out": soft_cross_entropy(other_predictions, other_logits(w), taus_others),
        "server": server_objective(w, own_logits, stationary, exact, taus_own, prior_precision=0.3),
    }
    for name, value in terms.items():
        (gradient,) = torch.autograd.grad(value, w)
        assert gradient.abs().max() < 1e-12, name
    torch.testing.assert_close(predictions, exact, rtol=0, atol=1e-6)  # what a client sends: float32 of the same
    moved = stationary + 0.5 * torch.randn_like(stationary)
    (away,) = torch.autograd.grad(
        soft_cross_entropy(other_predictions, other_logits(moved.requires_grad_()), taus_others), moved
    )
    assert away.abs().max() > 1e-3


def test_the_server_objective_gradient_is_the_softmax_regressions_closed_form():
    """[P] Eq. 17 server for f(x; W, b) = W x + b: ∇_W = Σ_i τ_i (p_i − ŷ_i) x_iᵀ + δ (W − W_lap),
    ∇_b = Σ_i τ_i (p_i − ŷ_i) + δ (b − b_lap), p_i = softmax(W x_i + b): autograd of `server_objective` equals it."""
    model, layout, weights = softmax_regression(features=4, classes=3, seed=2)
    inputs = torch.randn(8, 1, 1, 4, dtype=DTYPE)
    targets = torch.softmax(torch.randn(8, 3, dtype=DTYPE), 1)
    taus, delta = torch.rand(8, dtype=DTYPE) * 10, 0.7
    anchor = torch.randn_like(weights)
    w = weights.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(
        server_objective(w, model_logits(model, layout, inputs), anchor, targets, taus, delta), w
    )
    assert list(layout.values()) == [(3, 4), (3,)]
    W, b = weights[:12].view(3, 4), weights[12:]
    x = inputs.view(8, 4)
    residual = taus.unsqueeze(1) * (torch.softmax(x @ W.T + b, 1) - targets)
    closed_form = torch.cat([(residual.T @ x).ravel(), residual.sum(0)]) + delta * (weights - anchor)
    torch.testing.assert_close(gradient, closed_form, rtol=1e-12, atol=1e-12)


def test_the_fit_takes_adams_steps_on_the_server_objective_from_w_lap():
    """fit_global (the model's own parameters, the quadratic's gradient in closed form) takes the steps Adam takes on
    `server_objective` by autograd over the flat weights, from w_lap; its value is the objective there."""
    model, layout, anchor = softmax_regression(seed=3)
    model = model.float()
    anchor = anchor.float().double()  # as a server holds w_lap: float32-representable
    inputs = torch.randn(6, 1, 1, 4)
    targets = torch.softmax(3 * torch.randn(6, 3), 1)
    taus = torch.full((6,), 4.0)
    fitted, value = fit_global(model, anchor, inputs, targets, taus, 0.5, steps=25, lr=1e-2)
    logits_of = model_logits(model, layout, inputs)
    flat = anchor.float().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([flat], lr=1e-2)
    for _ in range(25):
        optimizer.zero_grad()
        server_objective(flat, logits_of, anchor.float(), targets, taus, 0.5).backward()
        optimizer.step()
    torch.testing.assert_close(fitted, flat.detach().double(), rtol=1e-5, atol=1e-6)
    start = server_objective(anchor.float(), logits_of, anchor.float(), targets, taus, 0.5).item()
    at_fit = server_objective(fitted.float(), logits_of, anchor.float(), targets, taus, 0.5).item()
    assert value == pytest.approx(at_fit, rel=1e-6) and value < start - 1.0 and fitted.dtype == torch.float64


def test_without_memory_points_or_steps_the_fit_is_w_lap_itself():
    model, _, anchor = softmax_regression(seed=4)
    model = model.float()
    inputs, targets, taus = torch.randn(6, 1, 1, 4), torch.full((6, 3), 1 / 3), torch.ones(6)
    unchanged, value = fit_global(model, anchor, inputs[:0], targets[:0], taus[:0], 0.5, steps=300, lr=1e-2)
    assert unchanged is anchor and value != value  # nan: no fit ran
    assert fit_global(model, anchor, inputs, targets, taus, 0.5, steps=0, lr=1e-2)[0] is anchor


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([[0.5, 0.5], [0.2, 0.8]], ""),
        ([[0.5, 0.5], [1.2, -0.2]], "row 1 has negative values"),
        ([[0.5, 0.6], [0.2, 0.8]], "row 0 sums to 1.1, not 1"),
    ],
)
def test_predictions_that_are_no_probability_vectors_are_named(rows, words):
    error = probability_rows_error(torch.tensor(rows), 1e-4)
    assert (words in error) if words else error == ""
