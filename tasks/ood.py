"""Out-of-distribution inputs for the server's evaluation (run config `ood-inputs`): inputs the federation never saw,
made offline from the test set, fixed by the run's seed, so that every round and every resume sees the same ones.

  noise     uniform noise, each input feature in its range over the test set: works for images and tabular data
  inverted  test inputs mirrored within each feature's range (an image's dark and light swapped, as 1 - x for pixels
            in [0, 1]): the same strokes, an intensity the model never met
  permuted  test inputs with their features shuffled by one fixed permutation: each keeps its values, none their
            layout
  none      no OOD inputs: the rows' OOD AUROCs are null

At most OOD_EXAMPLES of them, so an evaluation's OOD pass costs one forward pass per member over 1,000 inputs: a
tenth of a whole FMNIST test pass, as much as an `eval-fraction=0.1` round's test pass.
"""

from __future__ import annotations

import torch

from fedbayes.tasks.config import OOD_INPUTS
from fedbayes.tasks.datasets import Dataset

OOD_EXAMPLES = 1000
# Added to the run's seed (< 2^32): the OOD draws are a stream of their own, not the evaluation subset's
# (server/evaluation.py evaluation_subset draws from the run's seed itself).
OOD_SEED_OFFSET = 2**32


def ood_inputs(kind: str, test: Dataset, seed: int, count: int = OOD_EXAMPLES) -> torch.Tensor | None:
    """The OOD inputs of `kind` (one of OOD_INPUTS) for the test set `test`, as the model sees them.

    Args:
        kind: noise, inverted, permuted or none (the module's docstring says what each is).
        test: the test set, scaled as the model sees it (run config input-scale).
        seed: the run's seed: the same seed, the same inputs.
        count: how many, at most (no more than the test set holds).

    Returns:
        (min(count, len(test)), *test.input_shape) float32 inputs, or None for `none`.

    Raises:
        ValueError: an unknown `kind`.
    """
    if kind not in OOD_INPUTS:
        raise ValueError(f"ood-inputs must be one of {', '.join(OOD_INPUTS)}, got {kind!r}")
    if kind == "none":
        return None
    generator = torch.Generator().manual_seed(seed + OOD_SEED_OFFSET)
    images = test.images
    count = min(count, len(test))
    low, high = images.amin(dim=0), images.amax(dim=0)
    if kind == "noise":
        return low + (high - low) * torch.rand((count, *test.input_shape), generator=generator)
    chosen = images[torch.randperm(len(test), generator=generator)[:count]]
    if kind == "inverted":
        return low + high - chosen
    permutation = torch.randperm(chosen[0].numel(), generator=generator)
    return chosen.flatten(1)[:, permutation].reshape(chosen.shape).contiguous()
