"""BayesADMM over real gRPC processes: a client restarted mid-run continues with its durable duals."""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from fedbayes.client.state import ClientStateStore
from fedbayes.deploy.processes import is_serverapp
from fedbayes.server.checkpoint import CheckpointStore
from tests.support import newest_state
from tests.support.processes import (
    BreakableFederation,
    processes_with_env,
    restart_client_1_after_round_1,
    run_loopback,
    stall_env,
)

pytestmark = pytest.mark.integration


def test_client_restart_keeps_its_duals(tmp_path):
    workdir = tmp_path / "fed"
    results = workdir / "results.jsonl"
    config = {
        "strategy": "bayesadmm",
        "num-server-rounds": 3,
        "fraction": 0.05,
        "local-epochs": 1,
        "lr": 5e-5,
        "input-scale": 255.0,
        "ensemble-samples": 4,
        "results-path": str(results),
        "federation": "restart",
        "wait-for-clients": 2,
        "min-clients": 2,
        "round-timeout": 120.0,
    }
    # Rounds take seconds: round 2 may be on its way to the old client-1, or done, when it stops. With
    # min-clients=2, round 3 waits for the restarted one, which must then go on from its stored duals.
    store = ClientStateStore(workdir / "client-state", "restart", "client-1")
    node_env, restart = restart_client_1_after_round_1(store, tmp_path)
    run = run_loopback(workdir, config, 3, node_env=node_env, on_row=restart)
    rows = run.rows
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert rows[0]["clients"] == 2 and rows[-1]["clients"] == 2, rows
    assert rows[-1]["accuracy"] > 0.25 and "accuracy_ensemble" in rows[-1]  # chance is 0.1
    # The restarted client resumed from its own state: no fresh start, no reply refused by the server's replay.
    assert not any(row["fresh_starts"] for row in rows) and not any(
        "replay" in reason for row in rows for reason in row["rejected"].values()
    ), rows
    state = newest_state(store)
    assert state.round == 3
    assert torch.isfinite(state.tensors["dual_mean"]).all() and state.tensors["dual_mean"].abs().sum() > 0
    assert processes_with_env("FLWR_HOME", str(run.flwr_home)) == []


def test_full_covariance_bayesadmm_over_grpc(tmp_path):
    """bayesadmm-full end to end: 500 x 500 precisions and duals cross the wire both ways; the server
    evaluates its full-covariance posterior at the mean and as an ensemble."""
    workdir = tmp_path / "fed"
    results = workdir / "results.jsonl"
    config = {
        "strategy": "bayesadmm-full",
        "model": "logreg",
        "pool": 4,
        "num-server-rounds": 2,
        "fraction": 0.05,
        "local-epochs": 4,
        "lr": 1.0,
        "temperature": 1.0,
        "rho": 0.5,
        "dual-damping": 0.2,
        "ensemble-samples": 4,
        "results-path": str(results),
        "federation": "full",
        "wait-for-clients": 2,
        "round-timeout": 120.0,
    }
    run = run_loopback(workdir, config, 2)
    rows, server_log = run.rows, run.server_log
    assert [row["clients"] for row in rows] == [2, 2], server_log[-3000:]
    assert rows[-1]["accuracy"] > 0.5 and rows[-1]["accuracy_ensemble"] > 0.5, rows  # chance is 0.1
    assert not any("replay" in reason for row in rows for reason in row["rejected"].values()), rows


def serverapp_pids(flwr_home) -> list[int]:
    return [pid for pid in processes_with_env("FLWR_HOME", str(flwr_home)) if is_serverapp(pid)]


def test_a_killed_server_resumes_from_its_checkpoint_and_loses_nothing(tmp_path):
    """BayesADMM for 3 rounds twice on the same SuperNodes: once straight through, once with the ServerApp
    SIGKILLed after round 2's results appear and the run submitted again. The resumed federation continues
    from its checkpoint (round 2, or round 1 if the kill beat the checkpoint, in which case round 2 runs
    again and the clients start it from their state before it) and ends with the same global posterior."""
    workdir = tmp_path / "fed"
    base = {
        "strategy": "bayesadmm",
        "num-server-rounds": 3,
        "fraction": 0.05,
        "local-epochs": 1,
        "lr": 5e-5,
        "input-scale": 255.0,
        "ensemble-samples": 2,
        "wait-for-clients": 2,
        "min-clients": 2,
        "round-timeout": 120.0,
        "straggler-wait": 0.0,  # round 3 waits for the held client until the kill
    }
    straight = {**base, "federation": "straight", "results-path": str(workdir / "straight.jsonl")}
    resumed = {**base, "federation": "resumed", "results-path": str(workdir / "resumed.jsonl")}
    # client-0 holds round 3 of the run to be killed open until the kill: round 2's row is written while round 3
    # trains, and a fast round 3 could otherwise finish before the kill.
    release = tmp_path / "client-0-go"
    Path(f"{release}-r3").touch()  # the straight run goes through
    with BreakableFederation(workdir) as federation:
        federation.start_supernode(0, 2, extra_env=stall_env("3", tmp_path / "client-0-in", release))
        federation.start_supernode(1, 2)
        federation.follow(workdir / "straight.jsonl", federation.submit(straight), 3, on_row=lambda row: None)

        Path(f"{release}-r3").unlink()
        first = federation.submit(resumed)

        def kill_server_after_round_two(row):
            if row["round"] == 2:
                serverapps = serverapp_pids(federation.flwr_home)
                assert len(serverapps) == 1, serverapps
                os.kill(serverapps[0], signal.SIGKILL)
                federation.stop_run(federation.run_id(first))  # else Flower notices after its 60 s heartbeat
                federation.processes.stop(first)  # the CLI streaming the dead run's logs
                Path(f"{release}-r3").touch()

        rows = federation.follow(workdir / "resumed.jsonl", first, 3, on_row=kill_server_after_round_two)
        assert [row["round"] for row in rows] == [1, 2], "the kill should have stopped the run"
        second = federation.submit(resumed)
        federation.follow(workdir / "resumed.jsonl", second, 3, on_row=lambda row: None)
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    assert "resuming after round" in server_log
    rows = [json.loads(line) for line in (workdir / "resumed.jsonl").read_text().splitlines()]
    assert not any(row["fresh_starts"] for row in rows) and not any(
        "replay" in reason for row in rows for reason in row["rejected"].values()
    ), rows
    assert [row["round"] for row in rows] == [1, 2, 3] and all(row["clients"] == 2 for row in rows)
    final = {name: CheckpointStore(workdir / "server-state", name, {}).path for name in ("straight", "resumed")}
    straight_state, resumed_state = (load_file(path) for path in final.values())
    assert straight_state.keys() == resumed_state.keys()
    for name, value in straight_state.items():
        np.testing.assert_allclose(resumed_state[name], value, rtol=1e-6, atol=1e-9, err_msg=name)
