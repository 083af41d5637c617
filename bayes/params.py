"""Model parameters <-> named numpy arrays (what travels on the wire), in state_dict order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from numpy.typing import DTypeLike

# What a receiver expects in one tensor group: ordered name -> shape (float32 unless stated).
TensorLayout = Mapping[str, tuple[int, ...]]
Tensors = dict[str, np.ndarray]  # ordered name -> array
TensorList = list[torch.Tensor] | tuple[torch.Tensor, ...]  # what torch's multi-tensor (torch._foreach_*) ops take


def parameter_layout(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The model's parameters, in `model.parameters()` order: what every algorithm's math works on.

    Args:
        model: the network.

    Returns:
        Each parameter's name and shape, in order.
    """
    return {name: tuple(tensor.shape) for name, tensor in model.named_parameters()}


def buffer_layout(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """The rest of the model's state (BatchNorm's running statistics, ...): averaged by the round core.

    Args:
        model: the network.

    Returns:
        Each state entry's name and shape that is no parameter, in state_dict order.
    """
    parameters = dict(model.named_parameters())
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items() if name not in parameters}


def get_parameters(model: torch.nn.Module, layout: TensorLayout | None = None) -> Tensors:
    """The model's state as float32 arrays: all of it, or the entries of `layout`.

    Args:
        model: the network.
        layout: the entries wanted, or None for all of the state.

    Returns:
        Copies of the state's tensors as float32 arrays on the CPU, by name, in state_dict order.
    """
    return {
        name: tensor.detach().cpu().numpy().astype(np.float32, copy=True)
        for name, tensor in model.state_dict().items()
        if layout is None or name in layout
    }


def set_parameters(model: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    """Load arrays already validated by the codec: all of the model's state, or a part (its parameters, its
    buffers); an unknown name is an error.

    Args:
        model: the network; its state is changed in place.
        arrays: the state's entries by name, all or some.

    Raises:
        ValueError: a name is not in the model's state.
    """
    state = {name: torch.from_numpy(np.asarray(value)) for name, value in arrays.items()}
    unexpected = model.load_state_dict(state, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"the model has no {unexpected}")


def flatten(arrays: Mapping[str, np.ndarray], layout: TensorLayout, dtype: DTypeLike = np.float64) -> np.ndarray:
    """Concatenate named arrays in layout order into one flat vector.

    Args:
        arrays: the arrays by name; every name of `layout` among them.
        layout: the names, in order.
        dtype: the result's dtype.

    Returns:
        The flat vector, (P,).
    """
    return np.concatenate([np.asarray(arrays[name], dtype=dtype).ravel() for name in layout])


def unflatten(flat: np.ndarray, layout: TensorLayout, dtype: DTypeLike = np.float32) -> Tensors:
    """Split a flat vector back into named arrays shaped like `layout`.

    Args:
        flat: the flat vector, (P,) in `layout` order.
        layout: the names and shapes, in order.
        dtype: the arrays' dtype.

    Returns:
        The arrays by name, shaped as `layout`.

    Raises:
        ValueError: `flat` holds more or fewer values than `layout` needs.
    """
    arrays: Tensors = {}
    offset = 0
    for name, shape in layout.items():
        size = int(np.prod(shape))
        arrays[name] = flat[offset : offset + size].reshape(shape).astype(dtype)
        offset += size
    if offset != flat.size:
        raise ValueError(f"flat vector has {flat.size} values, layout needs {offset}")
    return arrays


def weighted_mean(vectors: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """Σ_k w_k x_k / Σ_k w_k in float64 (weights such as example counts can be large integers).

    Args:
        vectors: x_k, arrays of one shape; not empty.
        weights: w_k, one per vector.

    Returns:
        The weighted mean, float64, shape of a vector.
    """
    weight = np.asarray(weights, dtype=np.float64)
    return np.tensordot(weight / weight.sum(), np.stack(vectors).astype(np.float64, copy=False), axes=1)


def uses_multi_tensor(foreach: bool | None, device: torch.device) -> bool:
    """Whether an update runs as torch's multi-tensor (`torch._foreach_*`) kernels: `foreach` where given, else on
    CUDA only, as torch.optim's default. Why: on a GPU every elementwise op is a kernel launch and the step is bound by
    them, so one launch per list (and fused updates) replaces several per tensor. On the CPU the single-tensor path
    stays the default because it gives the earlier results' numbers bit for bit (benchmarks/determinism.py); the
    multi-tensor one agrees to float32 round-off and is what docs/results/cnns.md measures against it there.

    Args:
        foreach: the caller's choice, or None for the default.
        device: where the update runs.

    Returns:
        Whether to take the multi-tensor path.
    """
    return device.type == "cuda" if foreach is None else foreach


def parameter_views(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` (one vector in parameter order) as views shaped like the tensors of `like`: an in-place op on a view
    changes `flat`. Raises ValueError if the sizes do not add up.

    Args:
        flat: one vector in parameter order.
        like: the tensors whose shapes the views take.

    Returns:
        One view of `flat` per tensor of `like`.

    Raises:
        ValueError: `flat`'s size is not the sum of `like`'s.
    """
    sizes = [tensor.numel() for tensor in like]
    if sum(sizes) != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values, the tensors need {sum(sizes)}")
    return [piece.view_as(tensor) for piece, tensor in zip(flat.split_with_sizes(sizes), like)]
