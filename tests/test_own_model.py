"""Bring your own model: `model = "<module>:<callable>"` (tests/plugins/user_model.py) builds like a built-in
model, a bad one is refused naming `model` before any process starts, and it trains over loopback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import check_run_config
from fedbayes.tasks.config import ConfigError, RunSettings
from fedbayes.tasks.models import MODELS, build_model
from fedbayes.tasks.preflight import check_model_and_strategy
from tests.clihelpers import cli_env
from tests.clihelpers import fedbayes as fedbayes_command
from tests.helpers import run_loopback
from tests.test_cli import LOCAL
from tests.test_integration import with_pythonpath
from tests.test_config import DEFAULTS
from tests.test_own_data import write, write_digits
from tests.test_own_strategy import PLUGINS, plugin_path  # noqa: F401  (the fixture: tests/plugins on the path)

REFERENCE = "user_model:small_cnn"


@pytest.mark.parametrize("name", MODELS)
def test_built_in_models_keep_their_names(name):
    assert RunSettings.from_run_config({**DEFAULTS, "model": name}).model == name


def test_a_user_model_builds_for_the_data_it_is_given(plugin_path):
    model = build_model(REFERENCE, (3, 8, 8), 5)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 5)
    assert model[0].in_channels == 3 and model[-1].out_features == 5
    check_model_and_strategy(RunSettings.from_run_config({**DEFAULTS, "model": REFERENCE}))  # on 1x28x28 FMNIST


@pytest.mark.parametrize("reference, words", [
    ("no_such_module:small_cnn", "cannot load 'no_such_module:small_cnn': ModuleNotFoundError"),
    ("user_model:no_such_callable", "cannot load 'user_model:no_such_callable': AttributeError"),
    ("user_model:NOT_A_MODEL", "'user_model:NOT_A_MODEL' is 42, not a callable(input_shape, num_classes)"),
    (":small_cnn", "':small_cnn' is not '<module>:<callable>'"),
])
def test_a_model_that_cannot_be_had_is_refused_by_the_run_config(plugin_path, reference, words):
    with pytest.raises(ConfigError, match="run config 'model'") as error:
        RunSettings.from_run_config({**DEFAULTS, "model": reference})  # the server and every client parse this
    assert words in str(error.value)


@pytest.mark.parametrize("reference, dataset_shape, words", [
    ("user_model:returns_a_tensor", (1, 4, 4), "'user_model:returns_a_tensor' returned Tensor, not a torch.nn.Module"),
    (REFERENCE, (4,), "'user_model:small_cnn' raised ValueError: not enough values to unpack"),  # flat features
])
def test_a_model_that_does_not_build_is_refused_before_any_process_starts(plugin_path, tmp_path, reference,
                                                                          dataset_shape, words):
    for name in ("train.npz", "test.npz"):
        write(tmp_path / name, x=np.zeros((2, *dataset_shape), dtype=np.float32), y=np.array([0, 1]))
    with pytest.raises(ConfigError, match="run config 'model'") as error:
        check_run_config({"model": reference, "dataset": f"npz:{tmp_path}"}, 2)  # what `fedbayes local` runs first
    assert words in str(error.value)


def test_fedbayes_local_refuses_a_model_that_does_not_build(tmp_path):
    result = fedbayes_command([*LOCAL, "--workdir", str(tmp_path / "run"), "--set", "model=user_model:returns_a_tensor"],
                              env=cli_env(PYTHONPATH=with_pythonpath(PLUGINS)))
    assert result.returncode == 1
    assert result.last_error_line.startswith("fedbayes: error: run config 'model' ('user_model:returns_a_tensor') does "
                                             "not fit the 28x28 images of 'fmnist': 'user_model:returns_a_tensor' "
                                             "returned Tensor, not a torch.nn.Module")
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_user_model_trains_over_loopback_on_pre_partitioned_files(plugin_path, tmp_path):
    """The user CNN on digits exported as client-<i>.npz + test.npz: the server's global model is the user's."""
    digits = write_digits(tmp_path / "digits")
    exported = tmp_path / "exported"
    assert fedbayes(["export-partitions", "--dataset", f"npz:{digits}", "--clients", "2", "--out", str(exported)]) == 0
    workdir = tmp_path / "fed"
    config = {"strategy": "fedavg", "num-server-rounds": 2, "federation": "own-model", "model": REFERENCE,
              "dataset": f"npz:{exported}", "input-scale": 1 / 16, "local-epochs": 3, "wait-for-clients": 2,
              "results-path": str(workdir / "results.jsonl")}
    check_run_config(config, 2)
    run = run_loopback(workdir, config, rounds=2, clients=2)
    assert [row["clients"] for row in run.rows] == [2, 2]
    assert run.rows[-1]["accuracy"] > 0.5  # 10 classes: chance is 0.1
    checkpoint = load_file(workdir / "server-state" / "own-model" / "checkpoint.safetensors")
    assert checkpoint["global/0.weight"].shape == (8, 1, 3, 3)  # small_cnn's first convolution, on 1x8x8 digits
