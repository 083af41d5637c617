"""The diagonal GGN against closed forms: softmax regression (p_c(1 − p_c)·x_d² per weight) and, for an MLP,
the diagonal of Jᵀ(diag p − ppᵀ)J built from full Jacobians."""

import torch

from bayes.curvature import _per_example_diag_ggn, diag_ggn
from tasks.models import build_model


def test_softmax_regression_diag_ggn_is_p_one_minus_p_times_x_squared():
    torch.manual_seed(0)
    images = torch.randn(50, 1, 1, 6)
    model = build_model("logreg", (1, 1, 6), 4)
    with torch.no_grad():
        probs = torch.softmax(model(images), -1).double()
    x = images.reshape(50, 6).double()
    variance = probs * (1 - probs)  # (N, C)
    expected_weight = variance.T @ x.square()  # (C, D)
    expected_bias = variance.sum(0)
    torch.testing.assert_close(diag_ggn(model, images, batch_size=16),
                               torch.cat([expected_weight.reshape(-1), expected_bias]), rtol=1e-5, atol=1e-8)


def test_mlp_diag_ggn_matches_the_full_jacobian_product_and_restores_train_mode():
    torch.manual_seed(1)
    images = torch.randn(7, 1, 1, 3)
    model = build_model("mlp", (1, 1, 3), 3, hidden=(4,)).double()
    model.train()
    params = dict(model.named_parameters())
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    expected = torch.zeros_like(flat)
    for image in images.double():
        def logits(theta):
            return torch.func.functional_call(model, {n: t for n, t in zip(params, _split(theta, params))},
                                              (image.unsqueeze(0),)).squeeze(0)
        jacobian = torch.autograd.functional.jacobian(logits, flat)  # (C, P)
        p = torch.softmax(logits(flat), -1)
        expected += torch.diagonal(jacobian.T @ (torch.diag(p) - torch.outer(p, p)) @ jacobian)
    torch.testing.assert_close(diag_ggn(model, images.double(), batch_size=3), expected, rtol=1e-8, atol=1e-12)
    assert model.training
    # the generic per-example path (any model) against the same closed form
    torch.testing.assert_close(_per_example_diag_ggn(model, images.double(), 3), expected, rtol=1e-8, atol=1e-12)


def _split(theta, params):
    out, offset = [], 0
    for p in params.values():
        out.append(theta[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return out
