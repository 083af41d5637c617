"""The server built from a run's settings: its model and the strategy's server half, by one recipe.

The ServerApp (server/app.py), `fedbayes forget` on a stopped federation (server/forget/stopped.py), `fedbayes
export` (posterior/export.py) and preflight (server/preflight.py) all build the server this way, so a checkpoint is
always read back into the server that wrote it. What differs is said by the arguments: the test data's shape (each
caller loads it, or knows it, as its errors need), a checkpoint's arrays the model must hold, or a plan alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from fedbayes.bayes.params import buffer_layout, parameter_layout
from fedbayes.server.evaluation import with_evaluation_defaults
from fedbayes.strategies import get_algorithm
from fedbayes.strategies.base import ServerStrategy
from fedbayes.tasks.config import RunSettings
from fedbayes.tasks.models import build_run_model, is_user_model, parse_hidden, planned_layouts

Shapes = dict[str, tuple[int, ...]]


class ModelMismatch(ValueError):
    """The model the settings describe cannot be built for the data (or for the arrays it must hold): `cause` is
    what its builder raised, and its message is this one's."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class ServerParts:
    """A built server: the settings (with the evaluation keys left to a built model set), the model (None when only
    planned), its parameter and buffer layouts, and the strategy's server half."""

    settings: RunSettings
    model: nn.Module | None
    layout: Shapes
    buffers: Shapes
    strategy: ServerStrategy[Any]


def assemble_server(
    settings: RunSettings,
    input_shape: tuple[int, ...],
    num_classes: int,
    held: Mapping[str, tuple[int, ...]] | None = None,
    planned: bool = False,
) -> ServerParts:
    """The model for data of `input_shape` and `num_classes`, and the strategy's server half built on its layouts.

    Args:
        settings: the run's settings; a built model sets the evaluation keys left to it (server/evaluation.py).
        input_shape: one example's shape.
        num_classes: the number of classes.
        held: the arrays (name -> shape) of a checkpoint the model must hold, checked before it is built
            (tasks/models.py build_model_holding), or None for a new model.
        planned: lay a built-in model out on the meta device only (no weights; the model is None): preflight's
            check of a model this machine may not hold. A user model is built all the same.

    Returns:
        The settings, model, layouts and strategy.

    Raises:
        ModelMismatch: the model does not build for this data or does not hold `held` (whatever its builder raised,
            chained). What the strategy raises of the model (e.g. a size it refuses) passes unchanged.
    """
    architecture = settings.architecture
    try:
        model: nn.Module | None = None
        if planned and not is_user_model(architecture.model):
            layout, buffers = planned_layouts(
                architecture.model,
                input_shape,
                num_classes,
                parse_hidden(architecture.hidden),
                architecture.activation,
                architecture.pool,
            )
        else:
            model = build_run_model(architecture, input_shape, num_classes, held)
            layout, buffers = parameter_layout(model), buffer_layout(model)
    except Exception as error:  # a user's model builder may raise anything
        raise ModelMismatch(error) from error
    if model is not None and not planned:
        settings = with_evaluation_defaults(settings, model, input_shape)  # ensemble-samples -1 and such, by its cost
    strategy = get_algorithm(settings.strategy).build_server(settings, layout, buffers)
    return ServerParts(settings, model, layout, buffers, strategy)
