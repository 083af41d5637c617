"""DSVGD over real gRPC processes: a client restarted after its round continues from its local particles."""

import time
from pathlib import Path

import pytest
import torch

from fedbayes.client.state import ClientStateStore
from fedbayes.deploy.control import list_nodes
from fedbayes.deploy.launcher import CONNECTION
from tests.support import newest_state
from tests.support.processes import processes_with_env, run_loopback, stall_env

pytestmark = pytest.mark.integration


def online_nodes() -> set[int]:
    return {node.node_id for node in list_nodes(CONNECTION) if node.status == "online"}


def wait_for_a_new_node(known: set[int], timeout: float = 120.0) -> None:
    """Until the SuperLink (FLWR_HOME's) lists an online node that is not in `known`."""
    deadline = time.monotonic() + timeout
    while not online_nodes() - known:
        assert time.monotonic() < deadline, f"no new node online after {timeout:.0f} s"
        time.sleep(0.5)


def test_restarted_client_continues_from_its_local_particles(tmp_path, monkeypatch):
    """Two clients, three rounds, one client per round. The client of round 1 is restarted (a new node); the
    server schedules it again (a node it has not heard from goes first) and it must start from the local particles
    it stored in round 1. Round 2 (the other client's) is held open until the restarted node is online: rounds this
    small take about a second, and a round 3 configured before the new node registers would go to the stopped one."""
    workdir = tmp_path / "fed"
    results = workdir / "results.jsonl"
    config = {
        "strategy": "dsvgd",
        "model": "logreg",
        "pool": 4,
        "num-server-rounds": 3,
        "fraction": 0.05,
        "particles": 5,
        "local-steps": 30,
        "distill-steps": 30,
        "svgd-lr": 0.01,
        "distill-lr": 0.01,
        "batch-size": 50,
        "results-path": str(results),
        "federation": "dsvgd-restart",
        "wait-for-clients": 2,
        "min-clients": 2,
        "round-timeout": 60.0,
    }
    stores = {index: ClientStateStore(workdir / "client-state", "dsvgd-restart", f"client-{index}") for index in (0, 1)}
    restarted = []
    release = tmp_path / "round-2-go"
    held = {index: stall_env("2", tmp_path / f"client-{index}-in", release) for index in (0, 1)}

    def restart_the_round_one_client(federation, row):
        if row["round"] == 1:
            (index,) = [i for i, store in stores.items() if store.saved_rounds() == [1]]
            monkeypatch.setenv("FLWR_HOME", str(federation.flwr_home))
            known = online_nodes()
            federation.stop_supernode(index)
            federation.start_supernode(index, 2)
            wait_for_a_new_node(known)
            restarted.append(index)
            Path(f"{release}-r2").touch()

    run = run_loopback(workdir, config, 3, node_env=held, on_row=restart_the_round_one_client)
    rows, server_log = run.rows, run.server_log
    assert [row["clients"] for row in rows] == [1, 1, 1], server_log[-3000:]
    (index,) = restarted
    assert Path(f"{tmp_path}/client-{1 - index}-in-r2").exists()  # round 2 went to the other client, held open
    rounds = stores[index].saved_rounds()
    assert rounds[0] == 1 and len(rounds) == 2, rounds  # scheduled again after its restart
    assert not any(row["fresh_starts"] for row in rows), rows  # none started again from the initial particles
    assert "scheduled" in server_log
    other = newest_state(stores[1 - index])
    assert other is not None and torch.isfinite(other.tensors["local_particles"]).all()
    assert rows[-1]["accuracy_ensemble"] > 0.3, rows  # 5 particles of a pooled logistic regression; chance 0.1
    assert processes_with_env("FLWR_HOME", str(run.flwr_home)) == []
