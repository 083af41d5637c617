"""Model parameters <-> named numpy arrays (what travels on the wire), in state_dict order."""

from __future__ import annotations

import numpy as np
import torch

from fedbayes.protos.codec import TensorLayout, Tensors


def parameter_layout(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def get_parameters(model: torch.nn.Module) -> Tensors:
    return {
        name: tensor.detach().cpu().numpy().astype(np.float32, copy=True)
        for name, tensor in model.state_dict().items()
    }


def set_parameters(model: torch.nn.Module, arrays: Tensors) -> None:
    """Load arrays already validated against `parameter_layout(model)` by the codec."""
    state = {name: torch.from_numpy(np.asarray(value)) for name, value in arrays.items()}
    model.load_state_dict(state, strict=True)


def flatten(arrays: Tensors, layout: TensorLayout, dtype=np.float64) -> np.ndarray:
    """Concatenate named arrays in layout order into one flat vector."""
    return np.concatenate([np.asarray(arrays[name], dtype=dtype).ravel() for name in layout])


def unflatten(flat: np.ndarray, layout: TensorLayout, dtype=np.float32) -> Tensors:
    """Split a flat vector back into named arrays shaped like `layout`."""
    arrays, offset = {}, 0
    for name, shape in layout.items():
        size = int(np.prod(shape))
        arrays[name] = flat[offset : offset + size].reshape(shape).astype(dtype)
        offset += size
    if offset != flat.size:
        raise ValueError(f"flat vector has {flat.size} values, layout needs {offset}")
    return arrays


def weighted_mean(vectors: list[np.ndarray], weights: list[int | float]) -> np.ndarray:
    """Σ_k w_k x_k / Σ_k w_k in float64 (weights such as example counts can be large integers)."""
    weights = np.asarray(weights, dtype=np.float64)
    return np.tensordot(weights / weights.sum(), np.stack(vectors).astype(np.float64, copy=False), axes=1)
