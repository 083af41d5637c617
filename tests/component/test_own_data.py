"""Bring your own data: `dataset = "npz:DIR"` (tasks/npzdata.py). A folder of .npz files is checked (each problem
named with its file), split among clients or used as pre-partitioned client files, exported and read back
identical, and a real data set nobody tuned on (scikit-learn's 8x8 digits) trains over loopback."""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes.deploy.launcher import check_run_config
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.npzdata import NpzDataError, load_data_path, read_header
from tests.support import settings
from tests.support import write_npz as write


def images(rows: int, value: float = 0.5, shape=(1, 4, 4)) -> np.ndarray:
    return np.full((rows, *shape), value, dtype=np.float32)


def labels(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


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


@pytest.mark.parametrize(
    "files, clients, problem",
    [
        ({"train.npz": GOOD}, 2, "test.npz: no such file"),
        (
            {"train.npz": {"x": images(4)}, "test.npz": GOOD},
            2,
            "train.npz: has arrays ['x']; it needs 'x' (examples) and 'y'",
        ),
        (
            {"train.npz": {**GOOD, "images": images(4), "labels": labels(0, 1, 1, 0)}, "test.npz": GOOD},
            2,
            "train.npz: has both x/y and images/labels",
        ),
        (
            {
                "train.npz": {**GOOD, "x": np.where(np.arange(4)[:, None, None, None] == 2, np.nan, images(4))},
                "test.npz": GOOD,
            },
            2,
            "train.npz: 'x' holds NaN or Inf (first in row 2)",
        ),
        (
            {"train.npz": {**GOOD, "x": images(4).astype(np.int32)}, "test.npz": GOOD},
            2,
            "train.npz: 'x' has dtype int32; it must be uint8 (0-255) or float",
        ),
        (
            {"train.npz": {**GOOD, "y": np.array([0.0, 1.0, 1.0, 0.0])}, "test.npz": GOOD},
            2,
            "train.npz: 'y' has dtype float64; labels must be integers",
        ),
        ({"train.npz": {**GOOD, "y": labels(0, -1, 1, 0)}, "test.npz": GOOD}, 2, "train.npz: 'y' has a negative label"),
        (
            {"train.npz": {**GOOD, "y": labels(0, 1, 1)}, "test.npz": GOOD},
            2,
            "train.npz: 'y' has shape (3,), the examples need (4,)",
        ),
        (
            {"train.npz": {**GOOD, "num_classes": np.int64(1)}, "test.npz": GOOD},
            2,
            "train.npz: label 1 is out of range for its num_classes=1",
        ),
        (
            {"train.npz": {**GOOD, "num_classes": np.int64(3)}, "test.npz": {**GOOD, "num_classes": np.int64(4)}},
            2,
            "the files declare different num_classes [3, 4]",
        ),
        (
            {"train.npz": GOOD, "test.npz": {**GOOD, "x": images(4, shape=(1, 5, 5))}},
            2,
            "examples have shape (1, 4, 4), but those of",
        ),
        (
            {"client-0.npz": GOOD, "client-1.npz": GOOD, "test.npz": GOOD},
            3,
            "has 2 client files (client-<i>.npz) for a federation of 3 clients",
        ),
        ({"client-0.npz": GOOD, "client-2.npz": GOOD, "test.npz": GOOD}, 2, "lacks client-1.npz"),
        ({"client-0.npz": GOOD, "train.npz": GOOD, "test.npz": GOOD}, 1, "holds both train.npz and client-<i>.npz"),
        ({"test.npz": GOOD}, 2, "has no training data: add train.npz or client-0.npz ... client-1.npz"),
    ],
)
def test_a_bad_folder_is_refused_before_any_process_starts_naming_file_and_problem(tmp_path, files, clients, problem):
    for name, arrays in files.items():
        write(tmp_path / "data" / name, **arrays)
    with pytest.raises(ConfigError, match="run config 'dataset'") as error:
        check_run_config({"dataset": f"npz:{tmp_path / 'data'}"}, clients)  # what `fedbayes local` runs first
    assert problem in str(error.value)


def test_a_file_that_is_no_npz_archive_is_refused_by_name(tmp_path):
    path = tmp_path / "data" / "test.npz"
    path.parent.mkdir()
    np.save(path.with_suffix(".npy"), images(2))
    path.with_suffix(".npy").rename(path)  # one .npy array, named as an archive
    with pytest.raises(NpzDataError, match=f"{path}: holds one .npy array, not an .npz archive of 'x' and 'y'"):
        read_header(path)


def test_a_missing_folder_and_a_bare_prefix_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path / 'nope'}: no such directory"):
        check_run_config({"dataset": f"npz:{tmp_path / 'nope'}"}, 2)
    with pytest.raises(ConfigError, match="run config 'dataset' must be one of fmnist.*or npz:DIR"):
        settings(dataset="npz:")


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
    assert (
        load_data_path(write(tmp_path / "declared.npz", **GOOD, num_classes=np.int64(3)), "npz:/srv").num_classes == 3
    )
    assert load_data_path(path, "fmnist").num_classes == 10  # a built-in dataset's classes, as before
