"""`fedbayes compare` as a real process, and its engine: the in-process federation (deploy/inprocess.py) gives a
`fedbayes local` run's rows round for round, and the command, killed mid-run and started again, runs only what had
not finished and writes every output; runs in parallel subprocesses write what runs one at a time do."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from fedbayes.deploy.compare import (
    PLOT_FILES,
    SUMMARY_FILE,
    TABLE_FILE,
    CompareSpec,
    ProgressLine,
    job_config,
    run_jobs,
    tuning_jobs,
    validation_dataset,
)
from fedbayes.deploy.inprocess import run_inprocess
from fedbayes.deploy.launcher import LocalRun, run_local
from tests.support import write_digits
from tests.support.processes import fedbayes, start_fedbayes

METRICS = ("accuracy", "nll", "ece", "accuracy_ensemble", "nll_ensemble", "ece_ensemble")
TINY = ["--set", "model=logreg", "--set", "batch-size=64", "--set", "input-scale=0.0625"]


@pytest.mark.parametrize("strategy", ["fedavg", "bayesadmm"])
def test_the_inprocess_engine_gives_the_rows_of_fedbayes_local(tmp_path, strategy):
    """2 clients, 2 rounds of a logistic regression on scikit-learn's digits: every round's test metrics (and the
    ensemble's, for BayesADMM) are the same numbers through the network and in one process."""
    spec = LocalRun(
        strategy=strategy,
        clients=2,
        rounds=2,
        dataset=f"npz:{write_digits(tmp_path / 'digits')}",
        workdir=tmp_path / "local",
        overrides={"model": "logreg", "batch-size": 64, "lr": 0.01},
        quiet=True,
    )
    network = run_local(spec)
    root = tmp_path / "inprocess"
    root.mkdir()
    inprocess = run_inprocess(spec.run_config(root, root / "results.jsonl"), 2, root)
    assert [row["round"] for row in network] == [row["round"] for row in inprocess] == [1, 2]
    for ours, theirs in zip(inprocess, network):
        assert {key: ours.get(key) for key in METRICS} == {key: theirs.get(key) for key in METRICS}
    assert network[-1]["accuracy"] is not None and (strategy == "fedavg") == (network[-1].get("nll_ensemble") is None)


def test_compare_killed_mid_run_resumes_without_running_a_finished_run_again(tmp_path):
    """2 strategies, the 2-point small grid, 1 seed, 2 rounds: 6 federations. Killed (SIGKILL) once the first has
    written its rows, then started again: what had finished is not run again, and every output is written."""
    out = tmp_path / "out"
    args = [
        "compare",
        "--dataset",
        f"npz:{write_digits(tmp_path / 'digits')}",
        "--clients",
        "2",
        "--strategies",
        "fedavg,bayesadmm",
        "--rounds",
        "2",
        "--seeds",
        "1",
        "--grid",
        "small",
        "--out",
        str(out),
        *TINY,
    ]
    process = start_fedbayes(args)
    runs = out / "runs"
    while not (runs.is_dir() and any(runs.glob("*.jsonl"))):  # a finished run's rows, not a write's temp file
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before = {path.name: path.stat().st_mtime_ns for path in runs.glob("*.jsonl")}
    assert 1 <= len(done_before) < 6 and not (out / SUMMARY_FILE).exists()

    finished = fedbayes(args)
    assert finished.returncode == 0, finished.stderr
    assert {path.name: path.stat().st_mtime_ns for path in runs.iterdir() if path.name in done_before} == done_before
    names = {path.name for path in runs.iterdir()}
    assert names == {f"tune-{s}-p{p}.jsonl" for s in ("fedavg", "bayesadmm") for p in (0, 1)} | {
        "final-fedavg-s0.jsonl",
        "final-bayesadmm-s0.jsonl",
    }
    for name in names:
        assert [json.loads(line)["round"] for line in (runs / name).read_text().splitlines()] == [1, 2]
    for name in (SUMMARY_FILE, TABLE_FILE, *PLOT_FILES):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert list(summary["strategies"]) == ["fedavg", "bayesadmm"]
    assert all(entry["seeds"] == 1 and len(entry["grid"]) == 2 for entry in summary["strategies"].values())
    assert "| fedavg |" in (out / TABLE_FILE).read_text()
    assert "client acc. worst" in (out / TABLE_FILE).read_text()  # the final runs' clients evaluate held-out examples
    assert all("client_accuracy_worst" in entry["test"] for entry in summary["strategies"].values())
    assert "compare: final 2/2 runs" in finished.stderr and "fedavg" in finished.stdout
    assert not (out / "work").exists()  # the killed run's state is gone


def test_parallel_runs_in_subprocesses_give_the_rows_of_runs_one_at_a_time(tmp_path):
    """--parallel 2: two tuning runs at once, each in a subprocess, write the rows the same runs write one after
    the other in this process."""
    dataset = f"npz:{write_digits(tmp_path / 'digits')}"
    grid = {"fedavg": [{"lr": 0.01}, {"lr": 0.03}]}
    metrics = {}
    for parallel in (2, 1):
        tiny = {"model": "logreg", "batch-size": 64, "input-scale": 0.0625}
        spec = CompareSpec(
            dataset, 2, ("fedavg",), 2, 1, tmp_path / f"out-{parallel}", overrides=tiny, parallel=parallel
        )
        validation = validation_dataset(spec, job_config(spec, "fedavg", {}, 0, dataset))
        rows = run_jobs(tuning_jobs(spec, grid, validation), spec, "tune", ProgressLine())
        metrics[parallel] = {name: [[row[key] for key in METRICS[:3]] for row in run] for name, run in rows.items()}
    assert metrics[2] == metrics[1] and set(metrics[1]) == {"tune-fedavg-p0", "tune-fedavg-p1"}
