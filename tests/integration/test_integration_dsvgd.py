"""DSVGD over real gRPC processes: a client restarted after its round continues from its local particles."""

import pytest
import torch

from fedbayes.client.state import ClientStateStore
from tests.support import newest_state
from tests.support.processes import processes_with_env, run_loopback

pytestmark = pytest.mark.integration


def test_restarted_client_continues_from_its_local_particles(tmp_path):
    """Two clients, three rounds, one client per round. The client of round 1 is restarted (a new node); the
    server schedules it again (a node it has not heard from goes first, then the other client or the reverse)
    and it must start from the local particles it stored in round 1."""
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

    def restart_the_round_one_client(federation, row):
        if row["round"] == 1:
            (index,) = [i for i, store in stores.items() if store.saved_rounds() == [1]]
            federation.stop_supernode(index)
            federation.start_supernode(index, 2)
            restarted.append(index)

    run = run_loopback(workdir, config, 3, on_row=restart_the_round_one_client)
    rows, server_log = run.rows, run.server_log
    assert [row["clients"] for row in rows] == [1, 1, 1], server_log[-3000:]
    (index,) = restarted
    rounds = stores[index].saved_rounds()
    assert rounds[0] == 1 and len(rounds) == 2, rounds  # scheduled again after its restart
    assert not any(row["fresh_starts"] for row in rows) and "counts twice" not in server_log, rows
    assert "scheduled" in server_log
    other = newest_state(stores[1 - index])
    assert other is not None and torch.isfinite(other.tensors["local_particles"]).all()
    assert rows[-1]["accuracy_ensemble"] > 0.3, rows  # 5 particles of a pooled logistic regression; chance 0.1
    assert processes_with_env("FLWR_HOME", str(run.flwr_home)) == []
