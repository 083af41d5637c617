"""A model defined outside fedbayes, written as a user would write one (docs/extending/model.md): a small
CNN for any (C, H, W) input. Not part of fedbayes: the tests put this folder on PYTHONPATH and name it as
`model = "user_model:small_cnn"`."""

from __future__ import annotations

import torch
from torch import nn


def small_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Conv(C->8, 3, pad 1)-ReLU-MaxPool2-Flatten-Linear: parameters only (no BatchNorm buffers)."""
    channels, height, width = input_shape
    return nn.Sequential(
        nn.Conv2d(channels, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * (height // 2) * (width // 2), num_classes),
    )


NOT_A_MODEL = 42  # for the tests: a name that is not callable


def returns_a_tensor(input_shape: tuple[int, ...], num_classes: int) -> torch.Tensor:
    """For the tests: a callable that does not return a torch.nn.Module."""
    return torch.zeros(num_classes)
