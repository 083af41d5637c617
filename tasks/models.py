"""Classifiers for the image tasks: multiclass logistic regression and a fully connected MLP.

Models are plain `nn.Sequential`s, so their state_dict keys are the layer positions
("1.weight", "1.bias", "3.weight", ...; position 0 is the Flatten). Those keys name the tensors
on the wire, so they must not depend on anything but the architecture arguments.
Initial weights come from torch's global RNG: seed it (torch.manual_seed) before building.
"""

from __future__ import annotations

import math

from torch import nn

MODELS = ("logreg", "mlp")
ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] = (200, 100),
    activation: str = "sigmoid",
) -> nn.Module:
    """A model mapping a batch of shape (B, *input_shape) to logits of shape (B, num_classes).

    "logreg" ignores `hidden` and `activation`; "mlp" puts `activation` after each hidden layer
    (the paper's FMNIST model is 784-200-100-10 with sigmoid).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    num_inputs = math.prod(input_shape)
    if name == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(num_inputs, num_classes))
    layers: list[nn.Module] = [nn.Flatten()]
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
