"""The diagonal GGN against closed forms: softmax regression (p_c(1 − p_c)·x_d² per weight) and, for an MLP,
the diagonal of Jᵀ(diag p − ppᵀ)J built from full Jacobians."""

import torch

from fedbayes.bayes import curvature
from fedbayes.bayes.curvature import diag_ggn
from fedbayes.tasks.models import FilterResponseNorm2d, build_model


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
    torch.testing.assert_close(
        diag_ggn(model, images, batch_size=16),
        torch.cat([expected_weight.reshape(-1), expected_bias]),
        rtol=1e-5,
        atol=1e-8,
    )


def jacobian_diag_ggn(model, images):
    """Σ_i diag(J_iᵀ (diag p_i − p_i p_iᵀ) J_i) from full Jacobians, one example at a time."""
    params = dict(model.named_parameters())
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    expected = torch.zeros_like(flat)
    for image in images:

        def logits(theta, image=image):
            return torch.func.functional_call(
                model, {n: t for n, t in zip(params, _split(theta, params))}, (image.unsqueeze(0),)
            ).squeeze(0)

        jacobian = torch.autograd.functional.jacobian(logits, flat)  # (C, P)
        p = torch.softmax(logits(flat), -1)
        expected += torch.diagonal(jacobian.T @ (torch.diag(p) - torch.outer(p, p)) @ jacobian)
    return expected


def test_mlp_diag_ggn_matches_the_full_jacobian_product_and_restores_train_mode():
    torch.manual_seed(1)
    images = torch.randn(7, 1, 1, 3).double()
    model = build_model("mlp", (1, 1, 3), 3, hidden=(4,)).double()
    model.train()
    expected = jacobian_diag_ggn(model.eval(), images)
    model.train()
    torch.testing.assert_close(diag_ggn(model, images, batch_size=3), expected, rtol=1e-8, atol=1e-12)
    assert model.training


def test_conv_and_frn_diag_ggn_matches_the_full_jacobian_product(monkeypatch):
    """Conv2d (padding, stride, bias; the unfold rule), FRN (per-example vmap over its parameters only) and Linear,
    against full Jacobians; a tiny PER_EXAMPLE_VALUES makes the conv rule work through the batch in slices."""
    torch.manual_seed(2)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3, padding=1, stride=2),
        FilterResponseNorm2d(3),
        torch.nn.Conv2d(3, 4, 2, bias=False),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 2 * 2, 5),
    ).double()
    with torch.no_grad():  # move FRN off its initial values so every one of its terms matters
        for p in model[1].parameters():
            p.add_(0.3 * torch.randn_like(p))
    images = torch.randn(6, 2, 6, 6).double()
    monkeypatch.setattr(curvature, "PER_EXAMPLE_VALUES", 200)
    torch.testing.assert_close(
        diag_ggn(model, images, batch_size=4), jacobian_diag_ggn(model, images), rtol=1e-8, atol=1e-12
    )


def _split(theta, params):
    out, offset = [], 0
    for p in params.values():
        out.append(theta[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    return out
