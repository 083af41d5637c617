"""benchmarks/dsvgd_calibration.py, the calibration-against-width experiment (DSVGD paper, Fig. 8): the reliability
bins and their MCE/ECE, the preset's run config with the width set, and a tiny end-to-end run through the in-process
engine: one JSONL line per run whose metrics are the server's own last-round evaluation, the run's working directory
removed, a rerun skipped, other settings refused, the figure written."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from benchmarks import dsvgd_calibration as calibration


def test_reliability_bins_mce_and_ece():
    confidence = torch.tensor([0.05, 0.15, 0.15, 0.95, 1.0])
    correct = torch.tensor([False, True, False, True, True])
    diagram = calibration.reliability(confidence, correct, bins=10)
    assert diagram["count"] == [1, 2, 0, 0, 0, 0, 0, 0, 0, 2]
    assert diagram["accuracy"][1] == pytest.approx(0.5)
    assert diagram["confidence"][9] == pytest.approx(0.975)
    # gaps: bin 1 |0 - 0.05|, bin 2 |0.5 - 0.15|, bin 10 |1 - 0.975|; the empty bins count for nothing
    assert diagram["mce"] == pytest.approx(0.35)
    assert diagram["ece"] == pytest.approx((0.05 + 2 * 0.35 + 2 * 0.025) / 5)


def test_run_config_is_the_preset_with_the_width_and_the_overrides():
    dsvgd = calibration.run_config("dsvgd", 400, 10, 0, 20, {"local-steps": 5})
    assert dsvgd["hidden"] == "400"
    assert (dsvgd["particles"], dsvgd["distill-steps"], dsvgd["local-steps"]) == (20, 200, 5)
    assert (dsvgd["dataset"], dsvgd["fraction"], dsvgd["split"], dsvgd["wait-for-clients"]) == (
        "fmnist",
        1.0,
        "iid",
        20,
    )
    fedavg = calibration.run_config("fedavg", 10, 10, 0, 20, {})
    assert (fedavg["fraction-train"], fedavg["local-epochs"], fedavg["hidden"]) == (1 / 20, 7, "10")


def run_main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["dsvgd_calibration.py", *argv])
    calibration.main()


def test_a_tiny_run_records_one_line_per_run_then_skips_it(tmp_path, monkeypatch, capsys):
    runs, results = tmp_path / "runs", tmp_path / "results"
    monkeypatch.setattr(calibration, "RUNS", runs)
    tiny = ["--widths", "8", "--rounds", "1", "--clients", "4", "--results-dir", str(results)]
    tiny += ["--set", "fraction=0.02", "--set", "particles=2", "--set", "local-steps=2", "--set", "distill-steps=2"]
    run_main(monkeypatch, *tiny)
    jsonl = results / "calibration-width.jsonl"
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(line["strategy"], line["width"], line["seed"]) for line in lines] == [("fedavg", 8, 0), ("dsvgd", 8, 0)]
    for line in lines:
        row = line["server_rows"][-1]
        suffix = "_ensemble" if line["strategy"] == "dsvgd" else ""  # DSVGD: the particle predictive
        assert line["metrics"]["accuracy"] == row[f"accuracy{suffix}"]
        assert line["metrics"]["nll"] == pytest.approx(row[f"nll{suffix}"])
        assert sum(line["reliability"]["count"]) == line["test_examples"] == 10_000
        assert line["run_config"]["hidden"] == "8" and "federation" not in line["run_config"]
    assert list(runs.iterdir()) == []  # each run's working directory is gone once its line is written
    assert (results / "calibration-width.png").is_file()

    run_main(monkeypatch, *tiny)  # the same runs again: skipped
    assert len(jsonl.read_text().splitlines()) == 2
    assert "skipped" in capsys.readouterr().out

    with pytest.raises(SystemExit):  # the same runs with other settings: refused, naming the keys
        run_main(monkeypatch, *tiny, "--set", "svgd-lr=0.01")
    assert "svgd-lr" in capsys.readouterr().err

    run_main(monkeypatch, "--report", "--results-dir", str(results))
    assert "FedAvg" in capsys.readouterr().out
