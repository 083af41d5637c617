"""Diagonal generalised Gauss-Newton (GGN) curvature of a softmax classifier's summed cross-entropy.

  diag GGN = Σ_i diag(J_iᵀ (diag p_i − p_i p_iᵀ) J_i) = Σ_i Σ_c (J_iᵀ b_ic)²,   b_ic = √p_ic (e_c − p_i)
(B_i = [b_i1 … b_iC] has B_i B_iᵀ = diag p_i − p_i p_iᵀ because Σ_c p_ic = 1), J_i the Jacobian of the logits at
input i. Exact (no sampling), always ≥ 0. FedLap-Cov's H_k (../shared/specs/feddyn-fedlap-splits.md §3.2, §9 P7):
summed over the client's data, in eval mode.

For models whose only parameters are in nn.Linear layers (logistic regression, the MLPs) the per-example
gradient of b_icᵀ f at a layer y = W a + b is g aᵀ (g = ∂/∂y), so Σ_i (g_i a_iᵀ)² = (g∘g)ᵀ(a∘a): C ordinary
batched backward passes to the layer outputs suffice. Other models (the CNNs, ResNet-20) take C per-example (vmap)
gradients: C backward passes per example, each materialising a (batch, P) gradient, so the batch is capped at
PER_EXAMPLE_VALUES / P examples (cnn-zenke's 1.25M parameters: 26 at a time). Cost, measured in
benchmarks/model_cost.py: a multiple of C x (one epoch of training) — for CIFAR-100 (C = 100) on ResNet-20 this is
what the BayesADMM paper (App. G.4) calls prohibitively slow.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap

PER_EXAMPLE_VALUES = 2**25  # per-example gradient values held at once (128 MiB in float32)


def diag_ggn(model: torch.nn.Module, images: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    """The diagonal GGN of Σ_i CE(model(x_i), ·) at the model's current weights, flat in `model.parameters()`
    order, float64 on the CPU. The model is put in eval mode while it runs (no dropout) and restored after."""
    was_training = model.training
    model.eval()
    try:
        if all(isinstance(m, torch.nn.Linear) for m in model.modules() if any(True for _ in m.parameters(recurse=False))):
            return _linear_layers_diag_ggn(model, images, batch_size)
        return _per_example_diag_ggn(model, images, batch_size)
    finally:
        model.train(was_training)


def _directions(probs: torch.Tensor):
    """b_ic = √p_ic (e_c − p_i) for c = 1..C, one row per input."""
    eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
    for c in range(probs.shape[-1]):
        yield probs[:, c : c + 1].sqrt() * (eye[c] - probs)


def _linear_layers_diag_ggn(model: torch.nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs, outputs = {}, {}

    def record(layer, args, output):
        inputs[layer], outputs[layer] = args[0].detach(), output

    hooks = [layer.register_forward_hook(record) for layer in layers]
    total = {p: torch.zeros_like(p, dtype=torch.float64) for p in model.parameters()}
    try:
        for batch in images.split(batch_size):
            with torch.enable_grad():
                logits = model(batch)
                probs = torch.softmax(logits.detach(), dim=-1)
                for direction in _directions(probs):
                    grads = torch.autograd.grad(logits, [outputs[layer] for layer in layers], direction,
                                                retain_graph=True)
                    for layer, g in zip(layers, grads):
                        g2, a2 = g.double().square(), inputs[layer].double().square()
                        total[layer.weight] += g2.T @ a2
                        if layer.bias is not None:
                            total[layer.bias] += g2.sum(0)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([total[p].reshape(-1).cpu() for p in model.parameters()])


def _per_example_diag_ggn(model: torch.nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    params = {name: p.detach() for name, p in model.named_parameters()}

    def projected_logits(weights, image, direction):
        return functional_call(model, weights, (image.unsqueeze(0),)).squeeze(0) @ direction

    per_example = vmap(grad(projected_logits), in_dims=(None, 0, 0))
    total = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in params.items()}
    size = sum(p.numel() for p in params.values())
    for batch in images.split(max(1, min(batch_size, PER_EXAMPLE_VALUES // size))):
        with torch.no_grad():
            probs = torch.softmax(model(batch), dim=-1)
        for direction in _directions(probs):
            for name, g in per_example(params, batch, direction).items():
                total[name] += g.double().square().sum(0)
    return torch.cat([total[name].reshape(-1).cpu() for name, _ in model.named_parameters()])
