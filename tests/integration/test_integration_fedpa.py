"""FedPA over real gRPC processes: a burn-in round, then a sampling round."""

import re

import pytest

from tests.support.processes import run_loopback

pytestmark = pytest.mark.integration


def test_fedpa_burn_in_then_sampling_over_grpc(tmp_path):
    workdir = tmp_path / "fed"
    results = workdir / "results.jsonl"
    config = {
        "strategy": "fedpa",
        "model": "logreg",
        "num-server-rounds": 2,
        "fraction": 0.05,
        "local-epochs": 2,
        "lr": 0.01,
        "burn-in-rounds": 1,
        "samples": 2,
        "local-burnin-epochs": 1,
        "shrinkage": 0.1,
        "server-optimizer": "sgd",
        "server-lr": 1.0,
        "server-momentum": 0.5,
        "results-path": str(results),
        "federation": "fedpa",
        "wait-for-clients": 2,
        "round-timeout": 120.0,
    }
    run = run_loopback(workdir, config, 2)
    rows, server_log = run.rows, run.server_log
    assert [row["clients"] for row in rows] == [2, 2], server_log[-3000:]
    assert rows[-1]["accuracy"] > 0.5, rows  # chance is 0.1
    assert re.search(r"round 1 \(burn-in\): .* mean samples 0\.0", server_log)
    assert re.search(r"round 2 \(sampling\): .* mean samples 2\.0", server_log), server_log[-3000:]
