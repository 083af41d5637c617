"""Bring your own data: `dataset = "npz:DIR"` (tasks/npzdata.py). A folder of .npz files is checked (each problem
named with its file), split among clients or used as pre-partitioned client files, exported and read back
identical, and a real data set nobody tuned on (scikit-learn's 8x8 digits) trains over loopback."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fedbayes.client.runtime import NodeSettings, load_client_data
from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import check_run_config
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.npzdata import load_data_path
from fedbayes.tasks.partitions import partition_dataset
from tests.support import ROOT, settings, write_digits
from tests.support import write_npz as write
from tests.support.processes import LOCAL, run_loopback
from tests.support.processes import fedbayes as fedbayes_command


def images(rows: int, value: float = 0.5, shape=(1, 4, 4)) -> np.ndarray:
    return np.full((rows, *shape), value, dtype=np.float32)


def labels(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


GOOD = {"x": images(4), "y": labels(0, 1, 1, 0)}


def test_fedbayes_local_refuses_a_bad_folder_before_any_process_starts(tmp_path):
    """A relative npz:DIR is made absolute (the federation's processes run elsewhere), then checked."""
    write(tmp_path / "data" / "train.npz", **GOOD)
    relative = os.path.relpath(tmp_path / "data", ROOT)
    result = fedbayes_command([*LOCAL, "--workdir", str(tmp_path / "run"), "--dataset", f"npz:{relative}"])
    assert result.returncode == 1
    assert (
        result.last_error_line
        == f"fedbayes: error: run config 'dataset': {tmp_path / 'data' / 'test.npz'}: no such file"
    )
    assert not (tmp_path / "run").exists()


def test_exported_partitions_read_back_identical(tmp_path):
    """`fedbayes export-partitions` of Fashion-MNIST: each client's file, loaded as npz:DIR partition i or as its
    data-path, is the run's partition i of the training set, bit for bit; test.npz is the test set."""
    out = tmp_path / "exported"
    assert (
        fedbayes(
            [
                "export-partitions",
                "--clients",
                "3",
                "--fraction",
                "0.02",
                "--split",
                "dirichlet",
                "--seed",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    train, test = load_dataset("fmnist", train=True), load_dataset("fmnist", train=False)
    expected = partition_dataset(train.labels.numpy(), 3, "dirichlet", 4, fraction=0.02)
    for index, rows in enumerate(expected):
        node = NodeSettings(f"client-{index}", index, 3, "", str(tmp_path / "state"), "cpu")
        for loaded in (
            load_client_data(settings(dataset=f"npz:{out}").data, node),
            load_data_path(out / f"client-{index}.npz", "fmnist"),
        ):
            assert loaded.pixels.dtype == train.pixels.dtype and loaded.num_classes == 10
            assert np.array_equal(loaded.pixels.numpy(), train.pixels[rows].numpy())
            assert np.array_equal(loaded.labels.numpy(), train.labels[rows].numpy())
            assert np.array_equal(loaded.images.numpy(), train.images[rows].numpy())
    exported_test = load_dataset(f"npz:{out}", train=False)
    assert np.array_equal(exported_test.pixels.numpy(), test.pixels.numpy())
    assert np.array_equal(exported_test.labels.numpy(), test.labels.numpy())


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["fedavg", "bayesadmm"])
def test_digits_train_over_loopback_to_90_percent_on_held_out_digits(tmp_path, strategy):
    """A data set nobody tuned on: train.npz split among 3 SuperNodes, the ServerApp evaluates on test.npz."""
    digits = write_digits(tmp_path / "digits")
    workdir = tmp_path / "fed"
    config = {
        "strategy": strategy,
        "num-server-rounds": 3,
        "federation": "digits",
        "dataset": f"npz:{digits}",
        "input-scale": 1 / 16,
        "activation": "relu",
        "local-epochs": 5,
        "wait-for-clients": 3,
        "results-path": str(workdir / "results.jsonl"),
    }
    check_run_config(config, 3)
    run = run_loopback(workdir, config, rounds=3, clients=3)
    assert [row["clients"] for row in run.rows] == [3, 3, 3]
    print(
        f"{strategy} on the held-out digits, per round: accuracy {[row['accuracy'] for row in run.rows]}, "
        f"wall seconds {[row['wall_seconds'] for row in run.rows]}"
    )
    assert run.rows[-1]["accuracy"] > 0.90
    held_out = len(np.load(digits / "test.npz")["y"])  # evaluated on test.npz: accuracy is k / 539 for some k
    assert run.rows[-1]["accuracy"] * held_out == pytest.approx(round(run.rows[-1]["accuracy"] * held_out), abs=1e-6)
