"""Bring your own data: `dataset = "npz:DIR"` (tasks/npzdata.py). A folder of .npz files is checked (each problem
named with its file), split among clients or used as pre-partitioned client files, exported and read back
identical, and a real data set nobody tuned on (scikit-learn's 8x8 digits) trains over loopback."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fedbayes.client.runtime import NodeSettings, load_client_data
from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import check_run_config
from fedbayes.tasks.config import ConfigError, RunSettings
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.npzdata import NpzDataError, load_data_path
from fedbayes.tasks.partitions import partition_dataset
from tests.clihelpers import ROOT
from tests.clihelpers import fedbayes as fedbayes_command
from tests.helpers import run_loopback
from tests.test_cli import LOCAL
from tests.test_config import DEFAULTS

DIGITS_TEST_FRACTION = 0.3


def write_digits(folder: Path, seed: int = 0) -> Path:
    """scikit-learn's 8x8 digits (1,797 images, pixels 0..16) as train.npz and a held-out test.npz (30%)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    cut = round((1 - DIGITS_TEST_FRACTION) * len(order))
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", order[:cut]), ("test", order[cut:])):
        np.savez(folder / f"{name}.npz", x=digits.images[rows].astype(np.float32), y=digits.target[rows])
    return folder


def write(path: Path, **arrays) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def images(rows: int, value: float = 0.5, shape=(1, 4, 4)) -> np.ndarray:
    return np.full((rows, *shape), value, dtype=np.float32)


def labels(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def settings(folder: Path, **overrides) -> RunSettings:
    return RunSettings.from_run_config({**DEFAULTS, "dataset": f"npz:{folder}", **overrides})


def test_train_and_test_files_load_with_shape_and_classes_from_the_data(tmp_path):
    write(tmp_path / "train.npz", x=np.arange(3 * 16, dtype=np.uint8).reshape(3, 4, 4), y=labels(0, 1, 2))
    write(tmp_path / "test.npz", x=np.zeros((2, 4, 4), dtype=np.uint8), y=labels(4, 0))
    train = load_dataset(f"npz:{tmp_path}", train=True)
    test = load_dataset(f"npz:{tmp_path}", train=False)
    assert train.input_shape == test.input_shape == (1, 4, 4)  # (N, H, W) images get a channel
    assert train.num_classes == test.num_classes == 5  # 1 + the largest label of any file
    assert train.images.max().item() == pytest.approx(47 / 255)  # uint8 is scaled like the built-in images
    assert train.labels.tolist() == [0, 1, 2]


def test_flat_features_and_a_declared_class_count(tmp_path):
    features = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float64)
    write(tmp_path / "train.npz", x=features, y=labels(0, 1, 0, 1, 0, 1), num_classes=np.int64(7))
    write(tmp_path / "test.npz", x=features[:2], y=labels(1, 1), num_classes=np.int64(7))
    train = load_dataset(f"npz:{tmp_path}", train=True)
    assert train.input_shape == (3,) and train.num_classes == 7
    assert np.array_equal(train.images.numpy(), features.astype(np.float32))  # floats are used as stored


GOOD = {"x": images(4), "y": labels(0, 1, 1, 0)}


@pytest.mark.parametrize("files, clients, problem", [
    ({"train.npz": GOOD}, 2, "test.npz: no such file"),
    ({"train.npz": {"x": images(4)}, "test.npz": GOOD}, 2, "train.npz: has arrays ['x']; it needs 'x' (examples) and 'y'"),
    ({"train.npz": {**GOOD, "images": images(4), "labels": labels(0, 1, 1, 0)}, "test.npz": GOOD}, 2,
     "train.npz: has both x/y and images/labels"),
    ({"train.npz": {**GOOD, "x": np.where(np.arange(4)[:, None, None, None] == 2, np.nan, images(4))},
      "test.npz": GOOD}, 2, "train.npz: 'x' holds NaN or Inf (first in row 2)"),
    ({"train.npz": {**GOOD, "x": images(4).astype(np.int32)}, "test.npz": GOOD}, 2,
     "train.npz: 'x' has dtype int32; it must be uint8 (0-255) or float"),
    ({"train.npz": {**GOOD, "y": np.array([0.0, 1.0, 1.0, 0.0])}, "test.npz": GOOD}, 2,
     "train.npz: 'y' has dtype float64; labels must be integers"),
    ({"train.npz": {**GOOD, "y": labels(0, -1, 1, 0)}, "test.npz": GOOD}, 2, "train.npz: 'y' has a negative label"),
    ({"train.npz": {**GOOD, "y": labels(0, 1, 1)}, "test.npz": GOOD}, 2, "train.npz: 'y' has shape (3,), the examples need (4,)"),
    ({"train.npz": {**GOOD, "num_classes": np.int64(1)}, "test.npz": GOOD}, 2,
     "train.npz: label 1 is out of range for its num_classes=1"),
    ({"train.npz": {**GOOD, "num_classes": np.int64(3)}, "test.npz": {**GOOD, "num_classes": np.int64(4)}}, 2,
     "the files declare different num_classes [3, 4]"),
    ({"train.npz": GOOD, "test.npz": {**GOOD, "x": images(4, shape=(1, 5, 5))}}, 2,
     "examples have shape (1, 4, 4), but those of"),
    ({"client-0.npz": GOOD, "client-1.npz": GOOD, "test.npz": GOOD}, 3,
     "has 2 client files (client-<i>.npz) for a federation of 3 clients"),
    ({"client-0.npz": GOOD, "client-2.npz": GOOD, "test.npz": GOOD}, 2, "lacks client-1.npz"),
    ({"client-0.npz": GOOD, "train.npz": GOOD, "test.npz": GOOD}, 1, "holds both train.npz and client-<i>.npz"),
    ({"test.npz": GOOD}, 2, "has no training data: add train.npz or client-0.npz ... client-1.npz"),
])
def test_a_bad_folder_is_refused_before_any_process_starts_naming_file_and_problem(tmp_path, files, clients, problem):
    for name, arrays in files.items():
        write(tmp_path / "data" / name, **arrays)
    with pytest.raises(ConfigError, match="run config 'dataset'") as error:
        check_run_config({"dataset": f"npz:{tmp_path / 'data'}"}, clients)  # what `fedbayes local` runs first
    assert problem in str(error.value)


def test_fedbayes_local_refuses_a_bad_folder_before_any_process_starts(tmp_path):
    """A relative npz:DIR is made absolute (the federation's processes run elsewhere), then checked."""
    write(tmp_path / "data" / "train.npz", **GOOD)
    relative = os.path.relpath(tmp_path / "data", ROOT)
    result = fedbayes_command([*LOCAL, "--workdir", str(tmp_path / "run"), "--dataset", f"npz:{relative}"])
    assert result.returncode == 1
    assert result.last_error_line == f"fedbayes: error: run config 'dataset': {tmp_path / 'data' / 'test.npz'}: no such file"
    assert not (tmp_path / "run").exists()


def test_a_missing_folder_and_a_bare_prefix_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nope'}: no such directory"):
        check_run_config({"dataset": f"npz:{tmp_path / 'nope'}"}, 2)
    with pytest.raises(ConfigError, match="run config 'dataset' must be one of fmnist.*or npz:DIR"):
        settings(Path(""), dataset="npz:")


def test_pre_partitioned_files_need_the_whole_file_per_client(tmp_path):
    for index in range(2):
        write(tmp_path / f"client-{index}.npz", **GOOD)
    write(tmp_path / "test.npz", **GOOD)
    with pytest.raises(ConfigError, match="pre-partitioned client files.*fraction must be 1"):
        check_run_config({"dataset": f"npz:{tmp_path}", "fraction": 0.5}, 2)


def test_a_data_path_file_with_an_npz_dataset_must_declare_its_classes(tmp_path):
    path = write(tmp_path / "mine.npz", **GOOD)
    with pytest.raises(NpzDataError, match="mine.npz: with dataset 'npz:/srv' .* must hold 'num_classes'"):
        load_data_path(path, "npz:/srv")
    assert load_data_path(write(tmp_path / "declared.npz", **GOOD, num_classes=np.int64(3)), "npz:/srv").num_classes == 3
    assert load_data_path(path, "fmnist").num_classes == 10  # a built-in dataset's classes, as before


def test_exported_partitions_read_back_identical(tmp_path):
    """`fedbayes export-partitions` of Fashion-MNIST: each client's file, loaded as npz:DIR partition i or as its
    data-path, is the run's partition i of the training set, bit for bit; test.npz is the test set."""
    out = tmp_path / "exported"
    assert fedbayes(["export-partitions", "--clients", "3", "--fraction", "0.02", "--split", "dirichlet",
                     "--seed", "4", "--out", str(out)]) == 0
    train, test = load_dataset("fmnist", train=True), load_dataset("fmnist", train=False)
    expected = partition_dataset(train.labels.numpy(), 3, "dirichlet", 4, fraction=0.02)
    for index, rows in enumerate(expected):
        node = NodeSettings(f"client-{index}", index, 3, "", str(tmp_path / "state"), "cpu")
        for loaded in (load_client_data(settings(out), node), load_data_path(out / f"client-{index}.npz", "fmnist")):
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
    config = {"strategy": strategy, "num-server-rounds": 3, "federation": "digits", "dataset": f"npz:{digits}",
              "input-scale": 1 / 16, "activation": "relu", "local-epochs": 5, "wait-for-clients": 3,
              "results-path": str(workdir / "results.jsonl")}
    check_run_config(config, 3)
    run = run_loopback(workdir, config, rounds=3, clients=3)
    assert [row["clients"] for row in run.rows] == [3, 3, 3]
    print(f"{strategy} on the held-out digits, per round: accuracy {[row['accuracy'] for row in run.rows]}, "
          f"wall seconds {[row['wall_seconds'] for row in run.rows]}")
    assert run.rows[-1]["accuracy"] > 0.90
    held_out = len(np.load(digits / "test.npz")["y"])  # evaluated on test.npz: accuracy is k / 539 for some k
    assert run.rows[-1]["accuracy"] * held_out == pytest.approx(round(run.rows[-1]["accuracy"] * held_out), abs=1e-6)
