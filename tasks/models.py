"""Classifiers for the image tasks: multiclass logistic regression and a fully connected MLP.

Models are plain `nn.Sequential`s, so their state_dict keys are the layer positions
("1.weight", "1.bias", "3.weight", ...; position 0 is the Flatten; with `pool` > 1 an average pooling
comes first and every position moves up by one). Those keys name the tensors
on the wire, so they must not depend on anything but the architecture arguments.
Initial weights come from torch's global RNG: seed it (torch.manual_seed) before building.
"""

from __future__ import annotations

import math

import torch
from torch import nn

MODELS = ("logreg", "mlp")
ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] = (200, 100),
    activation: str = "sigmoid",
    pool: int = 1,
) -> nn.Module:
    """A model mapping a batch of shape (B, *input_shape) to logits of shape (B, num_classes).

    "logreg" ignores `hidden` and `activation`; "mlp" puts `activation` after each hidden layer
    (the paper's FMNIST model is 784-200-100-10 with sigmoid). `pool` > 1 first averages the image
    over pool x pool blocks (28x28 -> 7x7 for pool 4): a logistic regression small enough for a
    full-covariance posterior.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    if pool < 1:
        raise ValueError(f"pool must be >= 1, got {pool}")
    layers: list[nn.Module] = [nn.AvgPool2d(pool)] if pool > 1 else []
    layers.append(nn.Flatten())
    num_inputs = math.prod(nn.Sequential(*layers)(torch.zeros(1, *input_shape)).shape[1:])
    if name == "logreg":
        return nn.Sequential(*layers, nn.Linear(num_inputs, num_classes))
    for width_in, width_out in zip((num_inputs, *hidden), hidden):
        layers += [nn.Linear(width_in, width_out), ACTIVATIONS[activation]()]
    layers.append(nn.Linear(hidden[-1] if hidden else num_inputs, num_classes))
    return nn.Sequential(*layers)


def parse_hidden(text: str) -> tuple[int, ...]:
    """Hidden layer widths from a config string: "200,100" -> (200, 100); "" -> ()."""
    if not text.strip():
        return ()
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"hidden must be comma-separated positive integers like '200,100', got {text!r}") from None
    if any(width < 1 for width in widths):
        raise ValueError(f"hidden layer widths must be >= 1, got {text!r}")
    return widths
