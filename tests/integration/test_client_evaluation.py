"""Per-client evaluation through real processes: `fedbayes local --set client-eval-fraction=...` (a SuperLink, two
SuperNodes, real ClientApps) writes each client's held-out metrics into the rows, and `fedbayes report` shows them.
The numbers themselves, checked against an independent computation, and the refusals: tests/component and
tests/unit test_client_evaluation.py."""

import json

import pytest

from fedbayes.client.runtime import split_rows
from fedbayes.tasks.datasets import load_dataset
from tests.support import settings
from tests.support.processes import fedbayes


@pytest.mark.integration
def test_a_real_federation_reports_each_clients_held_out_metrics(tmp_path):
    workdir = tmp_path / "run"
    local = ["local", "--strategy", "bayesadmm", "--clients", "2", "--rounds", "1", "--fraction", "0.02"]
    options = ["--set", "model=logreg", "--set", "client-eval-fraction=0.2", "--set", "ensemble-samples=2"]
    result = fedbayes([*local, "--workdir", str(workdir), *options])
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()]
    labels = load_dataset("fmnist", train=True).labels.numpy()
    partitions = split_rows(settings(fraction=0.02).data, labels, 2)  # `fedbayes local`'s split: the run's seed, 0
    assert {client: entry["examples"] for client, entry in row["client_metrics"].items()} == {
        f"client-{index}": round(0.2 * len(rows)) for index, rows in enumerate(partitions)
    }
    for entry in row["client_metrics"].values():  # the global model before training, the client's q_k after
        assert {"accuracy", "nll", "ece", "accuracy_local", "nll_local", "ece_local"} <= set(entry)
    assert row["client_accuracy_worst"] == min(entry["accuracy"] for entry in row["client_metrics"].values())
    out = tmp_path / "report"
    assert fedbayes(["report", str(workdir), "--out", str(out)]).returncode == 0
    page = (out / "index.html").read_text()
    assert "<th>client-0</th>" in page and "<th>client-1</th>" in page
    assert f"<td>{row['client_accuracy_mean']:.4f} / " in page
