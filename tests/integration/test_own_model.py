"""Bring your own model: `model = "<module>:<callable>"` (tests/plugins/user_model.py) builds like a built-in
model, a bad one is refused naming `model` before any process starts, and it trains over loopback."""

from __future__ import annotations

import pytest
from safetensors.numpy import load_file

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import check_run_config
from tests.support import PLUGINS, write_digits
from tests.support.processes import LOCAL, cli_env, run_loopback, with_pythonpath
from tests.support.processes import fedbayes as fedbayes_command

REFERENCE = "user_model:small_cnn"


def test_fedbayes_local_refuses_a_model_that_does_not_build(tmp_path):
    result = fedbayes_command(
        [*LOCAL, "--workdir", str(tmp_path / "run"), "--set", "model=user_model:returns_a_tensor"],
        env=cli_env(PYTHONPATH=with_pythonpath(PLUGINS)),
    )
    assert result.returncode == 1
    assert result.last_error_line.startswith(
        "fedbayes: error: run config 'model' ('user_model:returns_a_tensor') does "
        "not fit the 28x28 images of 'fmnist': 'user_model:returns_a_tensor' "
        "returned Tensor, not a torch.nn.Module"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_user_model_trains_over_loopback_on_pre_partitioned_files(plugin_path, tmp_path, capsys):
    """The user CNN on digits exported as client-<i>.npz + test.npz: the server's global model is the user's; its
    posterior is exported and predicted with, the model named each time (a file's model is never imported)."""
    digits = write_digits(tmp_path / "digits")
    exported = tmp_path / "exported"
    assert fedbayes(["export-partitions", "--dataset", f"npz:{digits}", "--clients", "2", "--out", str(exported)]) == 0
    workdir = tmp_path / "fed"
    config = {
        "strategy": "fedavg",
        "num-server-rounds": 2,
        "federation": "own-model",
        "model": REFERENCE,
        "dataset": f"npz:{exported}",
        "input-scale": 1 / 16,
        "local-epochs": 3,
        "wait-for-clients": 2,
        "results-path": str(workdir / "results.jsonl"),
    }
    check_run_config(config, 2)
    run = run_loopback(workdir, config, rounds=2, clients=2)
    assert [row["clients"] for row in run.rows] == [2, 2]
    assert run.rows[-1]["accuracy"] > 0.5  # 10 classes: chance is 0.1
    checkpoint = load_file(workdir / "server-state" / "own-model" / "checkpoint.safetensors")
    assert checkpoint["global/0.weight"].shape == (8, 1, 3, 3)  # small_cnn's first convolution, on 1x8x8 digits
    posterior = tmp_path / "posterior.safetensors"
    export = ["export", str(workdir / "server-state"), "--federation", "own-model", "--out", str(posterior)]
    assert fedbayes(export) == 1 and not posterior.exists()
    assert f"names model '{REFERENCE}'" in capsys.readouterr().err
    assert fedbayes([*export, "--model", REFERENCE]) == 0
    predict = ["predict", str(posterior), str(exported / "test.npz"), "--samples", "0"]
    assert fedbayes(predict) == 1
    assert f"--model {REFERENCE}" in capsys.readouterr().err
    assert fedbayes([*predict, "--model", REFERENCE]) == 0
    # the server's own evaluation of round 2, as predict prints it
    assert f"accuracy {run.rows[-1]['accuracy']:.4f}" in capsys.readouterr().out
