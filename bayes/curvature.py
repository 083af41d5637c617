"""Diagonal generalised Gauss-Newton (GGN) curvature of a softmax classifier's summed cross-entropy.

  diag GGN = Σ_i diag(J_iᵀ (diag p_i − p_i p_iᵀ) J_i) = Σ_i Σ_c (J_iᵀ b_ic)²,   b_ic = √p_ic (e_c − p_i)
(B_i = [b_i1 … b_iC] has B_i B_iᵀ = diag p_i − p_i p_iᵀ because Σ_c p_ic = 1), J_i the Jacobian of the logits at
input i. Exact (no sampling), always ≥ 0. FedLap-Cov's H_k (docs/algorithms/fedlap.md):
summed over the client's data, in eval mode.

Per-example squares without per-example backward passes: at a layer y = W a + b, the gradient of b_icᵀ f is
g aᵀ (g = ∂/∂y). For nn.Linear Σ_i (g_i a_iᵀ)² = (g∘g)ᵀ(a∘a); for nn.Conv2d the per-example gradient is
G_i U_iᵀ (U_i the unfolded input patches, G_i the output gradient per position), formed for a slice of the batch
at a time (at most PER_EXAMPLE_VALUES values). So C ordinary batched backward passes to the layer outputs cover every
Linear and Conv2d parameter: measured, about 2·C epochs of training (benchmarks/model_cost.py). Parameters of any other
module (ResNet-20's FRN or GroupNorm scales and shifts, ~1% of its parameters) take C per-example (vmap) gradients
with respect to those parameters alone, which still run a per-example backward through the network.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

PER_EXAMPLE_VALUES = 2**25  # per-example gradient values held at once (128 MiB in float32)


def diag_ggn(model: torch.nn.Module, images: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    """The diagonal GGN of Σ_i CE(model(x_i), ·) at the model's current weights, flat in `model.parameters()`
    order, float64 on the CPU. The model is put in eval mode while it runs (no dropout) and restored after.

    Args:
        model: a classifier returning logits (N, C).
        images: the inputs x_i, batched along the first dimension.
        batch_size: the examples pushed through the model at once.

    Returns:
        The diagonal, shape (P,), P the model's parameter count.
    """
    was_training = model.training
    model.eval()
    try:
        return _diag_ggn(model, images, batch_size)
    finally:
        model.train(was_training)


def _directions(probs: torch.Tensor) -> Iterator[torch.Tensor]:
    """b_ic = √p_ic (e_c − p_i) for c = 1..C, one row per input."""
    eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
    for c in range(probs.shape[-1]):
        yield probs[:, c : c + 1].sqrt() * (eye[c] - probs)


def _has_layer_rule(module: torch.nn.Module) -> TypeGuard[torch.nn.Linear | torch.nn.Conv2d]:
    """Linear, and Conv2d without groups or non-zero padding modes: their per-example squares have a closed form."""
    if isinstance(module, torch.nn.Linear):
        return True
    return (
        isinstance(module, torch.nn.Conv2d)
        and module.groups == 1
        and module.padding_mode == "zeros"
        and not isinstance(module.padding, str)
    )


def _diag_ggn(model: torch.nn.Module, images: torch.Tensor, batch_size: int) -> torch.Tensor:
    layers = [m for m in model.modules() if _has_layer_rule(m) and any(True for _ in m.parameters(recurse=False))]
    covered = {id(p) for layer in layers for p in layer.parameters(recurse=False)}
    rest = {name: p.detach() for name, p in model.named_parameters() if id(p) not in covered}
    total: dict[torch.Tensor, torch.Tensor] = {p: torch.zeros_like(p, dtype=torch.float64) for p in model.parameters()}
    inputs: dict[torch.nn.Module, torch.Tensor] = {}
    outputs: dict[torch.nn.Module, torch.Tensor] = {}
    recording = [True]

    def record(layer: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        if recording[0]:
            inputs[layer], outputs[layer] = args[0].detach(), output

    hooks = [layer.register_forward_hook(record) for layer in layers]
    try:
        for batch in torch.split(images, batch_size):
            with torch.enable_grad():
                logits = model(batch)
            probs = torch.softmax(logits.detach(), dim=-1)
            for direction in _directions(probs):
                grads = torch.autograd.grad(logits, [outputs[layer] for layer in layers], direction, retain_graph=True)
                for layer, g in zip(layers, grads):
                    _add_layer_squares(layer, inputs[layer], g.detach(), total)
            del logits
            if rest:
                recording[0] = False
                _add_per_example_squares(model, rest, batch, probs, total)
                recording[0] = True
    finally:
        for hook in hooks:
            hook.remove()
    return torch.cat([total[p].reshape(-1).cpu() for p in model.parameters()])


def _add_layer_squares(
    layer: torch.nn.Linear | torch.nn.Conv2d, a: torch.Tensor, g: torch.Tensor, total: dict[torch.Tensor, torch.Tensor]
) -> None:
    """Σ_i (per-example gradient)² of `layer`'s weight and bias, from its inputs `a` and output gradients `g`."""
    if isinstance(layer, torch.nn.Linear):
        g2, a2 = g.double().square(), a.double().square()
        total[layer.weight] += g2.T @ a2
        if layer.bias is not None:
            total[layer.bias] += g2.sum(0)
        return
    assert not isinstance(layer.padding, str)  # _has_layer_rule leaves string paddings ("same") to vmap
    g = g.flatten(2)  # (B, out, positions)
    patch_values = layer.weight[0].numel() * g.shape[2]  # one example's unfolded input: in·k·k x positions
    step = max(1, PER_EXAMPLE_VALUES // (layer.weight.numel() + patch_values))
    for start in range(0, len(a), step):
        patches = F.unfold(a[start : start + step], layer.kernel_size, layer.dilation, layer.padding, layer.stride)
        per_example = torch.bmm(g[start : start + step], patches.transpose(1, 2))  # (b, out, in·k·k)
        total[layer.weight] += per_example.square().sum(0, dtype=torch.float64).view_as(layer.weight)
    if layer.bias is not None:
        total[layer.bias] += g.sum(2).double().square().sum(0)


def _add_per_example_squares(
    model: torch.nn.Module,
    rest: dict[str, torch.Tensor],
    batch: torch.Tensor,
    probs: torch.Tensor,
    total: dict[torch.Tensor, torch.Tensor],
) -> None:
    """Σ_i (per-example gradient)² of the parameters in `rest` (vmap over the batch, the others held fixed)."""
    fixed = {name: p.detach() for name, p in model.named_parameters() if name not in rest}
    parameters = dict(model.named_parameters())

    def projected_logits(weights: dict[str, torch.Tensor], image: torch.Tensor, direction: torch.Tensor) -> Any:
        return functional_call(model, {**fixed, **weights}, (image.unsqueeze(0),)).squeeze(0) @ direction

    per_example = vmap(grad(projected_logits), in_dims=(None, 0, 0))
    for direction in _directions(probs):
        for name, g in per_example(rest, batch, direction).items():
            total[parameters[name]] += g.double().square().sum(0)
