"""Classifiers for the image tasks: logistic regression, a fully connected MLP, and the BayesADMM paper's
convolutional models (App. G; the authors' code, team-approx-bayes/bayes-admm `models.py`).

  logreg      one Linear layer on the flattened image
  mlp         Linear layers of widths `hidden`, `activation` after each (the paper's FMNIST MLP: 200-100, sigmoid)
  cnn-zenke   CifarNet (Zenke et al. 2017): Conv(C→32,3,pad 1)-ReLU-Conv(32→32,3)-ReLU-MaxPool2-Dropout .25-
              Conv(32→64,3,pad 1)-ReLU-Conv(64→64,3)-ReLU-MaxPool2-Dropout .25-Linear(→512)-ReLU-Dropout .5-Linear
              (1,250,858 parameters on CIFAR-10)
  cnn-acar    the FedDyn paper's CNN (Acar et al. 2021): Conv(C→64,5)-ReLU-MaxPool2-Conv(64→64,5)-ReLU-MaxPool2-
              Linear(→384)-ReLU-Linear(384→192)-ReLU-Linear; no dropout (797,962 parameters on CIFAR-10)
  resnet20    ResNet-20 (He et al. 2016, option-A shortcuts) with filter response normalisation (FRN, Singh &
              Krishnan 2020) in place of batch norm, the authors' option: no running statistics to federate
  resnet20-gn the same with GroupNorm(2 groups), the authors' default normalisation
  <module>:<callable>  a user's own model (docs/extending/model.md): callable(input_shape, num_classes)

`build_run_model` builds the model a run's keys name (`RunSettings.architecture`: model, hidden, activation, pool).
A built-in model's layout (its tensors' names and shapes) is known without memory for its weights: `planned_layouts`
builds it on the meta device. `build_model_holding` builds a model for a file's tensors only once its layout is the
file's, so that sizes a file claims (hidden widths, an input shape) cost no more memory than the file itself holds.

Shape-generic: the convolutional models take the channel count from the input and size their first Linear layer
by a dry run, so FMNIST (1x28x28, unpadded) works as well as CIFAR (3x32x32): on 28x28 cnn-zenke's first Linear
is 1600→512 (2304→512 on 32x32) and cnn-acar's 1024→384 (1600→384); ResNet-20 ends in global average pooling.

Every model's state is exactly its parameters (no buffers: FRN's ε is a constant, GroupNorm keeps no statistics),
so every strategy can put the whole state on the wire. Dropout follows the module's mode: the local training
loop sets train mode, evaluation, the GGN curvature and other sampling-free passes set eval mode.

The Sequential models' state_dict keys are the layer positions ("1.weight", "1.bias", ...; for the MLPs position 0
is the Flatten, and with `pool` > 1 an average pooling comes first and every position moves up by one); the
ResNets' keys are their module names ("conv1.weight", "layer1.0.bn1.gamma", ...). Those keys name the tensors on
the wire, so they depend on nothing but the architecture arguments.
Initial weights come from torch's global RNG: seed it (torch.manual_seed) before building.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from fedbayes.bayes.params import buffer_layout, parameter_layout

if TYPE_CHECKING:
    from fedbayes.tasks.config import ModelSettings

ModelBuilder = Callable[[tuple[int, ...], int], nn.Module]  # a user model: callable(input_shape, num_classes)
Shapes = dict[str, tuple[int, ...]]
ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}
DENSE_MODELS = ("logreg", "mlp")
CONV_MODELS = ("cnn-zenke", "cnn-acar", "resnet20", "resnet20-gn")
MODELS = DENSE_MODELS + CONV_MODELS


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] = (200, 100),
    activation: str = "sigmoid",
    pool: int = 1,
) -> nn.Module:
    """A model mapping a batch of shape (B, *input_shape) to logits of shape (B, num_classes), its initial weights drawn
    from torch's global RNG.

    Args:
        name: one of MODELS, or a user's "<module>:<callable>" (build_user_model: importing it runs it).
        input_shape: one example's shape, (C, H, W) for the convolutional models.
        num_classes: the logits' width.
        hidden: the mlp's hidden widths, in order (the paper's FMNIST model: 200, 100 with sigmoid); ignored by every
            other model.
        activation: the mlp's activation after each hidden layer, one of ACTIVATIONS ("sigmoid", "relu", "tanh");
            ignored by every other built-in model, but checked.
        pool: > 1 first averages the image over pool x pool blocks (28x28 -> 7x7 for pool 4), for logreg and mlp
            only: a logistic regression small enough for a full-covariance posterior. 1: no pooling.

    Returns:
        The model; the Sequential models' state_dict keys are their layer positions (module docstring).

    Raises:
        ValueError: an unknown model or activation, `pool` below 1 or above 1 for a model other than logreg and mlp,
            an input too small for the model, or a user model that cannot be loaded or built.
    """
    if is_user_model(name):
        if pool > 1:
            raise ValueError(f"pool applies to logreg and mlp only; model {name!r} needs pool=1, got {pool}")
        return build_user_model(name, input_shape, num_classes)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}, or '<module>:<callable>'")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(ACTIVATIONS)}")
    if pool < 1:
        raise ValueError(f"pool must be >= 1, got {pool}")
    if name in CONV_MODELS:
        if pool > 1:
            raise ValueError(f"pool applies to logreg and mlp only; model {name!r} needs pool=1, got {pool}")
        return _CONV_BUILDERS[name](input_shape, num_classes)
    layers: list[nn.Module] = [nn.AvgPool2d(pool)] if pool > 1 else []
    layers.append(nn.Flatten())
    num_inputs = _flat_size(nn.Sequential(*layers), input_shape)
    if name == "logreg":
        return nn.Sequential(*layers, nn.Linear(num_inputs, num_classes))
    for width_in, width_out in zip((num_inputs, *hidden), hidden):
        layers += [nn.Linear(width_in, width_out), ACTIVATIONS[activation]()]
    layers.append(nn.Linear(hidden[-1] if hidden else num_inputs, num_classes))
    return nn.Sequential(*layers)


def is_user_model(name: str) -> bool:
    """Whether model `name` is a user's "<module>:<callable>": building it imports and runs that code.

    Args:
        name: a run config's model.

    Returns:
        True when `name` holds a colon.
    """
    return ":" in name


def load_model_builder(reference: str) -> ModelBuilder:
    """The callable a user model names; importing its module runs it.

    Args:
        reference: "<module>:<callable>", the module importable here (e.g. on PYTHONPATH).

    Returns:
        The callable(input_shape, num_classes) -> torch.nn.Module.

    Raises:
        ValueError: `reference` is not "<module>:<callable>", importing the module or getting the attribute raised
            (the message names what), or the attribute is not callable.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{reference!r} is not '<module>:<callable>'")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except Exception as error:  # whatever importing the user's module raised (ImportError, SyntaxError, ...)
        raise ValueError(
            f"cannot load {reference!r}: {type(error).__name__}: {error} (the module must be "
            "importable on the server and on every client, e.g. on PYTHONPATH)"
        ) from None
    if not callable(found):
        raise ValueError(f"{reference!r} is {found!r}, not a callable(input_shape, num_classes) -> torch.nn.Module")
    return found


def build_user_model(builder: str | ModelBuilder, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A user model: `builder(input_shape, num_classes)`.

    Args:
        builder: the callable, or a "<module>:<callable>" reference to import (load_model_builder).
        input_shape: one example's shape, passed as a tuple.
        num_classes: the classes the model's logits cover.

    Returns:
        The torch.nn.Module the builder returned.

    Raises:
        ValueError: the reference cannot be loaded, the builder raised (the message names it and what it raised), or
            it returned something that is not a torch.nn.Module.
    """
    name = builder if isinstance(builder, str) else getattr(builder, "__qualname__", repr(builder))
    build = load_model_builder(builder) if isinstance(builder, str) else builder
    try:
        model = build(tuple(input_shape), num_classes)
    except Exception as error:  # the user's code, whatever it raised
        raise ValueError(
            f"{name!r} raised {type(error).__name__}: {error} when built for input shape "
            f"{tuple(input_shape)} and {num_classes} classes"
        ) from error
    if not isinstance(model, nn.Module):
        raise ValueError(f"{name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def planned_layouts(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] = (200, 100),
    activation: str = "sigmoid",
    pool: int = 1,
    max_tensors: int | None = None,
) -> tuple[Shapes, Shapes]:
    """The parameter and buffer layouts of built-in model `name` as build_model builds it, laid out on the meta
    device: no memory for its weights or its dry runs, whatever sizes it is given.

    Args:
        name: a built-in model, one of MODELS.
        input_shape: one example's shape.
        num_classes: the logits' width.
        hidden: the mlp's hidden widths (build_model).
        activation: the mlp's activation (build_model).
        pool: the image pooling of logreg and mlp (build_model).
        max_tensors: the most parameter tensors an mlp may have (e.g. the count a file holds), refused before a single
            module is made: the Python objects of even a meta build grow with its depth. None: no bound.

    Returns:
        Parameter name -> shape and buffer name -> shape, in the model's order.

    Raises:
        ValueError: a user model (only running its code lays it out), what build_model refuses, sizes torch cannot
            represent, an mlp deeper than `max_tensors` allows.
    """
    if is_user_model(name):
        raise ValueError(f"model {name!r} is a user's: only its own code can lay it out")
    if name == "mlp" and max_tensors is not None and 2 * (len(hidden) + 1) > max_tensors:
        raise ValueError(
            f"mlp with {len(hidden)} hidden layers has {2 * (len(hidden) + 1)} parameter tensors, "
            f"more than the {max_tensors} there are"
        )
    try:
        with torch.device("meta"):
            model = build_model(name, input_shape, num_classes, hidden, activation, pool)
    except (RuntimeError, TypeError, OverflowError) as error:  # torch's refusals of sizes it cannot represent
        raise ValueError(f"model {name!r} does not build for these sizes: {type(error).__name__}: {error}") from None
    return parameter_layout(model), buffer_layout(model)


def build_model_holding(
    name: str | ModelBuilder,
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...],
    activation: str,
    pool: int,
    held: Mapping[str, tuple[int, ...]],
) -> nn.Module:
    """The model build_model builds, built only once it is known to hold exactly the tensors `held`. A built-in model
    is laid out on the meta device first (`planned_layouts`, its depth bounded by len(held)), so sizes a file claims
    cost no more memory than the file's own tensors; a user model, which only its code can lay out, is built and then
    compared.

    Args:
        name: a built-in model, or a user model as a "<module>:<callable>" reference or the callable itself.
        input_shape: one example's shape.
        num_classes: the logits' width.
        hidden: the mlp's hidden widths (build_model).
        activation: the mlp's activation (build_model).
        pool: the image pooling of logreg and mlp (build_model).
        held: name -> shape of the tensors the model must hold, parameters and buffers in any order: what a file holds.

    Returns:
        The model, its initial weights drawn from torch's global RNG (the caller loads the held tensors into it).

    Raises:
        ValueError: the model does not build, or the first tensor it would hold that differs from `held`.
    """
    if isinstance(name, str) and not is_user_model(name):
        parameters, buffers = planned_layouts(name, input_shape, num_classes, hidden, activation, pool, len(held))
        _refuse_other_tensors(parameters | buffers, held)
        return build_model(name, input_shape, num_classes, hidden, activation, pool)
    model = build_user_model(name, input_shape, num_classes)
    _refuse_other_tensors(parameter_layout(model) | buffer_layout(model), held)
    return model


def build_run_model(
    architecture: ModelSettings,
    input_shape: tuple[int, ...],
    num_classes: int,
    held: Mapping[str, tuple[int, ...]] | None = None,
) -> nn.Module:
    """The model a run's keys name (`RunSettings.architecture`), for data of `input_shape` and `num_classes`.

    Args:
        architecture: the run's model keys: model, hidden, activation and pool.
        input_shape: one example's shape.
        num_classes: the number of classes.
        held: the tensors (name -> shape) of a checkpoint the model must hold, checked before it is built
            (`build_model_holding`), or None for a new model.

    Returns:
        The model, its initial weights drawn from torch's global RNG.

    Raises:
        ValueError: `hidden` does not parse, what `build_model` refuses, or the model does not hold `held`. A user
            model's builder may raise anything.
    """
    hidden = parse_hidden(architecture.hidden)
    model, activation, pool = architecture.model, architecture.activation, architecture.pool
    if held is None:
        return build_model(model, input_shape, num_classes, hidden, activation, pool)
    return build_model_holding(model, input_shape, num_classes, hidden, activation, pool, held)


def _refuse_other_tensors(built: Shapes, held: Mapping[str, tuple[int, ...]]) -> None:
    if problem := shapes_difference(built, held):
        raise ValueError(f"the model's tensors are not those held: {problem}")


def shapes_difference(built: Mapping[str, tuple[int, ...]], held: Mapping[str, tuple[int, ...]]) -> str | None:
    """The first tensor (by name) that `built` and `held` disagree on, in words.

    Args:
        built: name -> shape of a model's tensors.
        held: name -> shape of the tensors held (a file's, a checkpoint's).

    Returns:
        A tensor `built` has and `held` lacks, the other way round, or one of two shapes; None when they agree.
    """
    for name in sorted(built.keys() | held.keys()):
        if name not in held:
            return f"the model has {name} {built[name]}, which is not held"
        if name not in built:
            return f"{name} {held[name]} is held, the model has no such tensor"
        if tuple(built[name]) != tuple(held[name]):
            return f"the model's {name} is {built[name]}, the one held {tuple(held[name])}"
    return None


def _flat_size(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    """How many values `features` makes of one input (a dry run on zeros); an error if the image is too small."""
    try:
        with torch.no_grad():
            shape = features(torch.zeros(1, *input_shape)).shape[1:]
    except RuntimeError as error:
        raise ValueError(f"input shape {tuple(input_shape)} is too small for this model: {error}") from None
    return math.prod(shape)


def cnn_zenke(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """CifarNet (Zenke et al. 2017), its first Linear layer sized by a dry run (module docstring).

    Args:
        input_shape: one image's shape (C, H, W); H and W at least 10.
        num_classes: the logits' width.

    Returns:
        The Sequential model, with dropout.

    Raises:
        ValueError: the image is too small for its convolutions and pooling.
    """
    features = [
        nn.Conv2d(input_shape[0], 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
    ]
    flat = _flat_size(nn.Sequential(*features), input_shape)
    return nn.Sequential(*features, nn.Linear(flat, 512), nn.ReLU(), nn.Dropout(0.5), nn.Linear(512, num_classes))


def cnn_acar(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """The FedDyn paper's CNN (Acar et al. 2021), its first Linear layer sized by a dry run (module docstring).

    Args:
        input_shape: one image's shape (C, H, W); H and W at least 16.
        num_classes: the logits' width.

    Returns:
        The Sequential model, without dropout.

    Raises:
        ValueError: the image is too small for its convolutions and pooling.
    """
    features = [
        nn.Conv2d(input_shape[0], 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    ]
    flat = _flat_size(nn.Sequential(*features), input_shape)
    return nn.Sequential(
        *features, nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(), nn.Linear(192, num_classes)
    )


class FilterResponseNorm2d(nn.Module):
    """FRN + TLU (Singh & Krishnan 2020): y = max(γ·x/√(mean_hw(x²) + ε) + β, τ), per channel and example, so
    it needs no batch statistics. ε is a constant (the authors' code keeps it as a frozen parameter)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.beta = nn.Parameter(torch.zeros(1, channels, 1, 1))
        self.tau = nn.Parameter(torch.zeros(1, channels, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each channel of each example by its mean square, then scale, shift and threshold.

        Args:
            x: feature maps (B, C, H, W), C the module's channels.

        Returns:
            max(γ·x/√(mean_hw(x²) + ε) + β, τ), shape of `x`.
        """
        x = x * torch.rsqrt(x.square().mean(dim=(2, 3), keepdim=True) + self.eps)
        return torch.maximum(self.gamma * x + self.beta, self.tau)


NORMALISATIONS: dict[str, Callable[[int], nn.Module]] = {
    "frn": FilterResponseNorm2d,
    "groupnorm": lambda channels: nn.GroupNorm(2, channels),
}


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with normalisation; the option-A shortcut subsamples and zero-pads channels."""

    def __init__(self, in_planes: int, planes: int, stride: int, norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.downsample = stride != 1 or in_planes != planes
        self.pad = (planes - in_planes) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's two convolutions plus its shortcut, then ReLU.

        Args:
            x: feature maps (B, in_planes, H, W).

        Returns:
            Feature maps (B, planes, H', W'), H' = ceil(H / stride).
        """
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        shortcut = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad)) if self.downsample else x
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    """ResNet-20 for 32x32 images (3 stages of 3 blocks, 16/32/64 channels), any input size and channel count."""

    def __init__(self, in_channels: int, num_classes: int, normalisation: str) -> None:
        super().__init__()
        norm = NORMALISATIONS[normalisation]
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = norm(16)
        stages, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = [BasicBlock(in_planes, planes, stride, norm)] + [
                BasicBlock(planes, planes, 1, norm) for _ in range(2)
            ]
            stages.append(nn.Sequential(*blocks))
            in_planes = planes
        self.layer1, self.layer2, self.layer3 = stages
        self.linear = nn.Linear(64, num_classes)
        for module in self.modules():  # the authors' initialisation (akamaster's pytorch_resnet_cifar10)
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_normal_(module.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of images.

        Args:
            x: images (B, in_channels, H, W), of any height and width.

        Returns:
            Logits (B, num_classes), after global average pooling.
        """
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.linear(out.mean(dim=(2, 3)))


_CONV_BUILDERS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "cnn-zenke": cnn_zenke,
    "cnn-acar": cnn_acar,
    "resnet20": lambda shape, classes: ResNet20(shape[0], classes, "frn"),
    "resnet20-gn": lambda shape, classes: ResNet20(shape[0], classes, "groupnorm"),
}


def parse_hidden(text: str) -> tuple[int, ...]:
    """Hidden layer widths from a config string: "200,100" -> (200, 100); "" -> ().

    Args:
        text: comma-separated positive integers, or blank for none.

    Returns:
        The widths, in order.

    Raises:
        ValueError: a part is not an integer, or a width is below 1.
    """
    if not text.strip():
        return ()
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"hidden must be comma-separated positive integers like '200,100', got {text!r}") from None
    if any(width < 1 for width in widths):
        raise ValueError(f"hidden layer widths must be >= 1, got {text!r}")
    return widths
