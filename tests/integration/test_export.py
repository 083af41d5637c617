"""`fedbayes export` / `fedbayes predict` end to end: a real `fedbayes local` federation exported and predicted as its
server evaluated it. Every strategy's export in process, and the refusals: tests/component/test_export.py."""

import json
import tomllib

import numpy as np
import pytest
import torch

from fedbayes.bayes.metrics import classification_metrics
from fedbayes.posterior import load
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.npzdata import write_npz
from tests.support.processes import fedbayes


@pytest.mark.integration
def test_a_real_bayesadmm_federation_exported_and_predicted_as_its_server_evaluated(tmp_path):
    """`fedbayes local` (logreg, 2 clients, 2 rounds, 4-sample ensemble), `fedbayes export` of round 2 and
    `fedbayes predict` on the FMNIST test set give round 2's row: at the mean and as the ensemble, bit for bit."""
    workdir = tmp_path / "run"
    result = fedbayes(
        [
            "local",
            "--strategy",
            "bayesadmm",
            "--clients",
            "2",
            "--rounds",
            "2",
            "--fraction",
            "0.02",
            "--workdir",
            str(workdir),
            "--set",
            "model=logreg",
            "--set",
            "ensemble-samples=4",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    row = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()][-1]
    assert row["round"] == 2
    test_npz = tmp_path / "test.npz"
    write_npz(test_npz, load_dataset("fmnist", train=False))
    exported = tmp_path / "posterior.safetensors"
    assert fedbayes(["export", str(workdir), "--round", "2", "--out", str(exported)]).returncode == 0
    for samples, suffix in (("0", ""), ("4", "_ensemble")):
        preds = tmp_path / f"preds-{samples}.npz"
        result = fedbayes(["predict", str(exported), str(test_npz), "--samples", samples, "--out", str(preds)])
        assert result.returncode == 0, result.stderr[-3000:]
        metrics = classification_metrics(
            torch.from_numpy(np.load(preds)["probs"]), load_dataset("fmnist", train=False).labels
        )
        for key in ("accuracy", "nll", "ece"):
            assert metrics[key] == row[f"{key}{suffix}"], (key, suffix, metrics, row)
    assert tomllib.loads((workdir / "run-config.toml").read_text())["federation"] == load(exported).header.federation
