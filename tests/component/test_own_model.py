"""Bring your own model: `model = "<module>:<callable>"` (tests/plugins/user_model.py) builds like a built-in
model, a bad one is refused naming `model` before any process starts, and it trains over loopback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbayes.deploy.launcher import check_run_config
from fedbayes.server.preflight import check_model_and_strategy
from fedbayes.strategies import run_settings
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.models import MODELS, build_model
from tests.support import DEFAULTS
from tests.support import write_npz as write

REFERENCE = "user_model:small_cnn"


@pytest.mark.parametrize("name", MODELS)
def test_built_in_models_keep_their_names(name):
    assert run_settings({**DEFAULTS, "model": name}).model == name


def test_a_user_model_builds_for_the_data_it_is_given(plugin_path):
    model = build_model(REFERENCE, (3, 8, 8), 5)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 5)
    assert model[0].in_channels == 3 and model[-1].out_features == 5
    check_model_and_strategy(run_settings({**DEFAULTS, "model": REFERENCE}))  # on 1x28x28 FMNIST


@pytest.mark.parametrize(
    "reference, words",
    [
        ("no_such_module:small_cnn", "cannot load 'no_such_module:small_cnn': ModuleNotFoundError"),
        ("user_model:no_such_callable", "cannot load 'user_model:no_such_callable': AttributeError"),
        ("user_model:NOT_A_MODEL", "'user_model:NOT_A_MODEL' is 42, not a callable(input_shape, num_classes)"),
        (":small_cnn", "':small_cnn' is not '<module>:<callable>'"),
    ],
)
def test_a_model_that_cannot_be_had_is_refused_by_the_run_config(plugin_path, reference, words):
    with pytest.raises(ConfigError, match="run config 'model'") as error:
        run_settings({**DEFAULTS, "model": reference})  # the server and every client parse this
    assert words in str(error.value)


@pytest.mark.parametrize(
    "reference, dataset_shape, words",
    [
        (
            "user_model:returns_a_tensor",
            (1, 4, 4),
            "'user_model:returns_a_tensor' returned Tensor, not a torch.nn.Module",
        ),
        (REFERENCE, (4,), "'user_model:small_cnn' raised ValueError: not enough values to unpack"),  # flat features
    ],
)
def test_a_model_that_does_not_build_is_refused_before_any_process_starts(
    plugin_path, tmp_path, reference, dataset_shape, words
):
    for name in ("train.npz", "test.npz"):
        write(tmp_path / name, x=np.zeros((2, *dataset_shape), dtype=np.float32), y=np.array([0, 1]))
    with pytest.raises(ConfigError, match="run config 'model'") as error:
        check_run_config({"model": reference, "dataset": f"npz:{tmp_path}"}, 2)  # what `fedbayes local` runs first
    assert words in str(error.value)
