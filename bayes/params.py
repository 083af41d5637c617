"""Model parameters <-> named numpy arrays (what travels on the wire), in state_dict order."""

from __future__ import annotations

import numpy as np
import torch

from protos.codec import TensorLayout, Tensors


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


def check_layout(layout: TensorLayout, arrays: Tensors) -> None:
    if list(arrays) != list(layout) or any(arrays[n].shape != tuple(s) for n, s in layout.items()):
        raise ValueError(f"arrays {[(n, a.shape) for n, a in arrays.items()]} do not match layout {dict(layout)}")
