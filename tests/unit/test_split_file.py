"""Published splits: run config `split-file` (JSON, per client its row indices into the training file) and
`fedbayes partitions --write F`, which writes ours in that format."""

import json

import numpy as np
import pytest

from fedbayes.client.runtime import NodeSettings, load_client_data, split_rows
from fedbayes.strategies import run_settings
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.partitions import partition_dataset, read_split_file, write_split_file
from tests.support import DEFAULTS


def write(tmp_path, clients):
    path = tmp_path / "split.json"
    path.write_text(json.dumps(clients))
    return path


def test_written_split_reads_back_equal(tmp_path):
    labels = np.random.default_rng(0).integers(0, 10, 1000)
    ours = partition_dataset(labels, 5, "dirichlet", seed=3, fraction=0.5)
    write_split_file(tmp_path / "split.json", ours)
    again = read_split_file(tmp_path / "split.json", 1000, 5)
    assert len(again) == 5 and all(np.array_equal(a, b) and a.dtype == np.int64 for a, b in zip(ours, again))


@pytest.mark.parametrize(
    "clients, message",
    [
        ([[0, 1], [2, 10]], r"client 1 has row index 10 outside \[0, 10\)"),
        ([[0, 1], [-1]], r"client 1 has row index -1"),
        ([[0, 1], []], "client 1 has no rows"),
        ([[0, 1], [1, 2]], "1 rows belong to more than one client"),
        ([[0, 0], [2]], "client 0 lists 1 rows twice"),
        ([[0, 1.5], [2]], "client 0 has a row index that is not an integer"),
        ([[0, 1]], "has 1 clients, the federation has 2"),
        ({"0": [1]}, "must be a JSON list"),
    ],
)
def test_bad_split_files_are_refused_by_name(tmp_path, clients, message):
    with pytest.raises(ValueError, match=message):
        read_split_file(write(tmp_path, clients), num_examples=10, num_clients=2)


def test_overlap_only_when_allowed(tmp_path):
    parts = read_split_file(write(tmp_path, [[3, 1], [1, 2]]), 10, 2, allow_overlap=True)
    assert [p.tolist() for p in parts] == [[3, 1], [1, 2]]  # each client's rows in the file's order


def test_not_json_is_refused(tmp_path):
    path = tmp_path / "split.json"
    path.write_text("[[1, 2],")
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        read_split_file(path, 10, 1)


def test_json_nested_too_deeply_is_refused_by_name(tmp_path):
    path = tmp_path / "split.json"
    path.write_text("[" * 100_000)  # within what a split of 10,000 rows may take
    with pytest.raises(ValueError, match=f"split file {path}: cannot read it as JSON"):
        read_split_file(path, 10_000, 1)


def test_a_file_over_what_its_split_can_take_is_refused_unread(tmp_path):
    path = tmp_path / "split.json"
    path.write_text("[[0, 1]]" + " " * 2000)  # JSON, but more than 10 row indices and their separators take
    with pytest.raises(ValueError, match=f"split file {path} is 2008 bytes, over the 1258 bytes a split of 10 rows"):
        read_split_file(path, 10, 1)


def test_a_client_loads_its_rows_of_the_file_in_the_files_order(tmp_path):
    # The order is the data order the client's minibatches permute: the BayesADMM authors' split files list each
    # client's rows class by class, which with shared noise gives every client the same classes at the same step.
    path = write(tmp_path, [[5, 7, 9], [59999, 0, 3]])
    settings = run_settings({**DEFAULTS, "split-file": str(path)})
    node = NodeSettings.from_node_config({"partition-id": 1, "num-partitions": 2}, default_device="cpu")
    data = load_client_data(settings.data, node)
    full = load_dataset("fmnist", train=True)
    assert data.labels.tolist() == full.labels[[59999, 0, 3]].tolist()
    assert np.array_equal(data.pixels.numpy(), full.pixels[[59999, 0, 3]].numpy())


def test_row_order_by_class_lists_a_clients_rows_class_by_class_keeping_their_order_within_a_class(tmp_path):
    full = load_dataset("fmnist", train=True)
    rows = [59999, 0, 3, 5, 7, 9, 11, 13]
    path = write(tmp_path, [rows])
    node = NodeSettings.from_node_config({"partition-id": 0, "num-partitions": 1}, default_device="cpu")
    as_split = load_client_data(run_settings({**DEFAULTS, "split-file": str(path)}).data, node)
    by_class = load_client_data(run_settings({**DEFAULTS, "split-file": str(path), "row-order": "by-class"}).data, node)
    labels = full.labels[rows].tolist()
    expected = sorted(range(len(rows)), key=lambda i: (labels[i], i))  # by class, then the file's order
    assert len(set(labels)) > 2 and expected != list(range(len(rows)))  # the rows are not already by class
    assert by_class.labels.tolist() == [labels[i] for i in expected]
    assert np.array_equal(by_class.pixels.numpy(), as_split.pixels[expected].numpy())
    with pytest.raises(ConfigError, match="row-order"):
        run_settings({**DEFAULTS, "row-order": "by-label"})


def test_split_file_with_a_fraction_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="'fraction' must be 1 with a split-file"):
        run_settings({**DEFAULTS, "split-file": "split.json", "fraction": 0.1})


def test_a_runs_split_written_to_a_file_gives_every_client_the_same_rows_under_another_seed(tmp_path):
    # benchmarks/forget.py's reseeded retraining: the run seed's split, written, fixes the rows; the seed then sets
    # only the training (another seed alone draws another split).
    labels = np.random.default_rng(0).integers(0, 10, 2000)
    settings = run_settings({**DEFAULTS, "split": "dirichlet", "seed": 4, "fraction": 0.1})
    rows = split_rows(settings.data, labels, 5)
    assert [p.tolist() for p in rows] == [p.tolist() for p in partition_dataset(labels, 5, "dirichlet", 4, 0.1)]
    write_split_file(tmp_path / "split.json", rows)
    reseeded = run_settings(
        {**DEFAULTS, "split": "dirichlet", "seed": 1004, "split-file": str(tmp_path / "split.json")}
    )
    assert [p.tolist() for p in split_rows(reseeded.data, labels, 5)] == [p.tolist() for p in rows]
    other = split_rows(run_settings({**DEFAULTS, "split": "dirichlet", "seed": 1004, "fraction": 0.1}).data, labels, 5)
    assert [p.tolist() for p in other] != [p.tolist() for p in rows]
