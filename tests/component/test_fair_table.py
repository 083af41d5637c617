"""benchmarks/fair_table.py, the fair comparison (issue 30, item 3): the validation split is carved from the training
clients and never touches the test set, the tuning picks the best validation point, the report reads each method at
its own predictive, and one tiny tuning run goes end to end through the in-process engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import fair_table as fair
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.partitions import partition_dataset


def rows(accuracies: list[float], ensemble: list[float] | None = None, seconds: float = 10.0) -> list[dict]:
    made = []
    for index, accuracy in enumerate(accuracies):
        row = {"round": index + 1, "accuracy": accuracy, "nll": 1.0 - accuracy, "ece": 0.1}
        if ensemble is not None:
            row.update(accuracy_ensemble=ensemble[index], nll_ensemble=0.5, ece_ensemble=0.05)
        row.update(run_seconds=seconds, load_at_start=1.5, settings={})
        made.append(row)
    return made


def write(path, run_rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in run_rows))


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(fair, "RESULTS", tmp_path)
    monkeypatch.setattr(fair, "ROUNDS", 4)
    monkeypatch.setattr(fair, "GRIDS", {"fedavg": [{"lr": 1e-3}, {"lr": 3e-3}, {"lr": 1e-2}], "bayesadmm": [{}]})
    return tmp_path


def test_the_best_grid_point_is_the_best_validation_accuracy_of_the_last_three_rounds(results):
    tune = results / "tune"
    write(tune / "fedavg-grid0-seed0.jsonl", rows([0.9, 0.5, 0.5, 0.5]))  # best first round, worst last three
    write(tune / "fedavg-grid1-seed0.jsonl", rows([0.1, 0.7, 0.7, 0.7]))
    assert fair.best_point("fedavg") is None  # point 2 has not run
    write(tune / "fedavg-grid2-seed0.jsonl", rows([0.1, 0.7, 0.7]))  # a run cut short is not finished
    assert fair.best_point("fedavg") is None
    write(tune / "fedavg-grid2-seed0.jsonl", rows([0.2, 0.7, 0.7, 0.7]))  # a tie goes to the earlier point
    assert fair.best_point("fedavg") == 1


def test_the_report_reads_each_method_at_its_own_predictive(results, capsys):
    write(results / "tune" / "bayesadmm-grid0-seed0.jsonl", rows([0.5] * 4))
    for seed, (mean_accuracy, ensemble_accuracy) in enumerate([(0.70, 0.80), (0.72, 0.84), (0.74, 0.78)]):
        ensemble = [0.5, ensemble_accuracy - 0.01 if seed != 2 else 0.5, ensemble_accuracy, ensemble_accuracy]
        write(
            results / "final" / f"bayesadmm-final-seed{seed}.jsonl",
            rows([mean_accuracy] * 4, ensemble=ensemble, seconds=20.0),
        )
    fair.report(["bayesadmm", "fedavg"])
    summary = json.loads((results / "summary.json").read_text())
    entry = summary["bayesadmm"]
    assert entry["seeds"] == 3 and entry["grid_point"] == 0
    # the ensemble's accuracy, not the mean's: rounds 2-4 of each seed
    assert entry["accuracy"] == pytest.approx([(0.79 + 0.8 + 0.8) / 3, (0.83 + 0.84 + 0.84) / 3, (0.5 + 1.56) / 3])
    assert entry["nll"] == pytest.approx([0.5, 0.5, 0.5])
    assert entry["rounds_to_80"] == [3, 2, None]
    assert entry["seconds_per_round"] == pytest.approx([5.0, 5.0, 5.0])
    assert summary["fedavg"]["seeds"] == 0 and summary["fedavg"]["grid_point"] is None
    assert (results / "fair.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "3/2/-" in printed and "not run" in printed


def test_the_validation_split_is_carved_from_the_training_clients(results, monkeypatch):
    monkeypatch.setattr(fair, "CLIENTS", 3)
    folder = fair.validation_folder(results)
    train = load_dataset("fmnist", train=True)
    parts = partition_dataset(train.labels.numpy(), 3, fair.SPLIT, fair.TUNING_SEED, fraction=fair.FRACTION)
    validation = np.load(folder / "test.npz")
    held_out = 0
    for index, part in enumerate(parts):
        kept = np.load(folder / f"client-{index}.npz")
        assert len(kept["y"]) == len(part) - round(fair.VALIDATION_SHARE * len(part))
        held_out += len(part) - len(kept["y"])
        # every kept example is one of the client's own, and none of them is in the validation set
        own = {train.pixels[i].numpy().tobytes() for i in part}
        kept_images = {image.tobytes() for image in kept["x"]}
        assert kept_images <= own
        assert not kept_images & {image.tobytes() for image in validation["x"]}
    assert len(validation["y"]) == held_out
    test_images = {image.numpy().tobytes() for image in load_dataset("fmnist", train=False).pixels}
    assert not test_images & {image.tobytes() for image in validation["x"]}
    assert fair.validation_folder(results) == folder  # made once, then reused


def test_one_tuning_run_end_to_end_writes_its_rows_once(results, monkeypatch):
    monkeypatch.setattr(fair, "CLIENTS", 2)
    monkeypatch.setattr(fair, "ROUNDS", 2)
    monkeypatch.setattr(fair, "COMMON", {**fair.COMMON, "hidden": "16", "local-epochs": 1, "batch-size": 128})
    dataset = f"npz:{fair.validation_folder(results)}"
    path = results / "tune" / "fedavg-grid0-seed0.jsonl"
    written = fair.run("fedavg", {"optimizer": "adam", "lr": 1e-3}, dataset, fair.TUNING_SEED, path)
    assert [row["round"] for row in written] == [1, 2]
    assert all(0.0 <= row["accuracy"] <= 1.0 and row["settings"]["lr"] == 1e-3 for row in written)
    assert fair.rows_of(path) == written
    stamp = path.stat().st_mtime_ns
    assert fair.run("fedavg", {"optimizer": "adam", "lr": 1e-3}, dataset, fair.TUNING_SEED, path) == written
    assert path.stat().st_mtime_ns == stamp  # a finished run is not run again
