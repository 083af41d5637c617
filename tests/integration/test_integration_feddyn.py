"""FedDyn over real gRPC processes: a client restarted between rounds continues with its durable λ_k, and the
server's checkpointed Λ is the sum of the clients' stored λ_k."""

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedbayes.client.state import ClientStateStore
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.strategies.feddyn.client import LAMBDA_KEY
from tests.support import newest_state
from tests.support.processes import restart_client_1_after_round_1, run_loopback

pytestmark = pytest.mark.integration


def test_a_restarted_client_continues_with_its_lambda(tmp_path):
    workdir = tmp_path / "fed"
    results = workdir / "results.jsonl"
    config = {
        "strategy": "feddyn",
        "num-server-rounds": 3,
        "fraction": 0.05,
        "local-epochs": 1,
        # 0.01: with 2 clients α 0.1 overshoots (round 1 at chance, round 3 at 0.20 or 0.31 depending on whether
        # client-1 answered round 2 before its restart); α 0.01 gives 0.59-0.60 on both paths
        "feddyn-alpha": 0.01,
        "weight-decay": 1e-4,
        "max-grad-norm": 10.0,
        "results-path": str(results),
        "federation": "restart",
        "wait-for-clients": 2,
        "min-clients": 2,
        "round-timeout": 120.0,
    }
    stores = [ClientStateStore(workdir / "client-state", "restart", f"client-{index}") for index in range(2)]

    node_env, restart = restart_client_1_after_round_1(stores[1], tmp_path)
    run = run_loopback(workdir, config, 3, node_env=node_env, on_row=restart)
    rows = run.rows
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert rows[0]["clients"] == 2 and rows[-1]["clients"] == 2, rows  # round 2 may miss the stopped one
    assert rows[-1]["accuracy"] > 0.25  # chance is 0.1
    assert not any(row["fresh_starts"] for row in rows), rows  # the restarted client resumed from its own λ_k
    lambdas = [newest_state(store) for store in stores]
    assert [state.round for state in lambdas] == [3, 3]
    checkpoint = load_file(CheckpointStore(workdir / "server-state", "restart", {}).path)
    server_sum = sum(checkpoint[f"strategy/lambda/client-{index}/value"] for index in range(2))
    client_sum = sum(state.tensors[LAMBDA_KEY].numpy() for state in lambdas)
    assert np.abs(client_sum).sum() > 0
    np.testing.assert_allclose(server_sum, client_sum, rtol=0, atol=1e-12)
