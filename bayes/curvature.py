"""Diagonal generalised Gauss-Newton (GGN) curvature of a softmax classifier's summed cross-entropy.

  diag GGN = Σ_i diag(J_iᵀ (diag p_i − p_i p_iᵀ) J_i) = Σ_i Σ_c (J_iᵀ b_ic)²,   b_ic = √p_ic (e_c − p_i)
(B_i = [b_i1 … b_iC] has B_i B_iᵀ = diag p_i − p_i p_iᵀ because Σ_c p_ic = 1), J_i the Jacobian of the logits at
input i. Exact (no sampling), always ≥ 0, C per-example vector-Jacobian products per input. FedLap-Cov's H_k
(../shared/specs/feddyn-fedlap-splits.md §3.2, §9 P7): summed over the client's data, in eval mode.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad, vmap


def diag_ggn(model: torch.nn.Module, images: torch.Tensor, batch_size: int = 128) -> torch.Tensor:
    """The diagonal GGN of Σ_i CE(model(x_i), ·) at the model's current weights, flat in `model.parameters()`
    order, float64 on the CPU. The model is put in eval mode while it runs (no dropout) and restored after."""
    was_training = model.training
    model.eval()
    params = {name: p.detach() for name, p in model.named_parameters()}

    def projected_logits(weights, image, direction):
        return functional_call(model, weights, (image.unsqueeze(0),)).squeeze(0) @ direction

    per_example = vmap(grad(projected_logits), in_dims=(None, 0, 0))
    total = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in params.items()}
    try:
        for batch in images.split(batch_size):
            with torch.no_grad():
                probs = torch.softmax(model(batch), dim=-1)
            eye = torch.eye(probs.shape[-1], dtype=probs.dtype, device=probs.device)
            for c in range(probs.shape[-1]):
                direction = probs[:, c : c + 1].sqrt() * (eye[c] - probs)  # b_ic, one row per input
                for name, g in per_example(params, batch, direction).items():
                    total[name] += g.double().square().sum(0)
    finally:
        model.train(was_training)
    return torch.cat([total[name].reshape(-1).cpu() for name, _ in model.named_parameters()])
