"""The README's simulation command on a two-host Ray cluster: `ray start --head` on one machine, a worker node on
another (network namespaces, tests/support/netns.py), and `fedbayes run --ray-address` on the head's machine, as
docs/running/simulation.md#on-a-ray-cluster tells a user. ClientApps run on both hosts and the rows are those of a
one-host run with the same seed; a worker host that dies mid-run is survived or fails the command with a reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.netns import NetnsLab
from tests.support.processes import cli_env, read_until
from tests.support.ray_cluster import RayCluster

pytestmark = pytest.mark.integration

RUN_CONFIG = 'model="logreg" fraction=0.05 seed=7'
COMPARED = ("round", "accuracy", "nll", "ece", "train_loss", "clients", "clients_sent")


def simulation(runs: Path, rounds: int, ray_address: str | None) -> list[str]:
    """The README's simulation command with 4 virtual clients of one CPU each, results in `runs`."""
    config = f'num-server-rounds={rounds} {RUN_CONFIG} results-path="{runs / "sim.jsonl"}" results-exists="replace"'
    return [
        sys.executable,
        "-m",
        "fedbayes.deploy.cli",
        "run",
        str(ROOT),
        "local",
        "--stream",
        *(["--ray-address", ray_address] if ray_address else []),
        "--federation-config",
        "num-supernodes=4 client-resources-num-cpus=1",
        "-c",
        config,
    ]


def simulation_env(runs: Path) -> dict[str, str]:
    return cli_env(FLWR_HOME=str(runs / "sim-home"), FEDBAYES_SERVER_STATE_DIR=str(runs / "server-state"))


def rows(runs: Path) -> list[dict]:
    lines = (runs / "sim.jsonl").read_text().splitlines()
    return [{key: json.loads(line)[key] for key in COMPARED} for line in lines]


def raw_rows(runs: Path) -> list[dict]:
    return [json.loads(line) for line in (runs / "sim.jsonl").read_text().splitlines()]


@pytest.fixture
def lab():
    with NetnsLab(["head", "worker"]) as machines:
        yield machines


@pytest.mark.timeout(1500)  # two simulations and a cluster's start; on a loaded 2-core machine each takes minutes
def test_clientapps_run_on_both_hosts_and_the_rows_are_a_one_host_runs(lab, tmp_path):
    alone = tmp_path / "one-host"
    done = subprocess.run(
        simulation(alone, 2, None), cwd=ROOT, env=simulation_env(alone), capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cluster_runs = tmp_path / "cluster"
    with RayCluster(lab["head"], {"worker": lab["worker"]}, tmp_path) as cluster:
        done = subprocess.run(
            lab["head"].command(simulation(cluster_runs, 2, cluster.address)),
            cwd=ROOT,
            env=simulation_env(cluster_runs),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        tasks = cluster.tasks_by_node()
    hosts = {lab["head"].address, lab["worker"].address}
    assert set(tasks["alive"]) == hosts
    assert set(tasks["runs"]) == hosts and sum(tasks["runs"].values()) >= 8, tasks  # 4 ClientApps a round, 2 rounds
    assert rows(cluster_runs) == pytest.approx(rows(alone)), (rows(cluster_runs), rows(alone))


@pytest.mark.timeout(1200)
def test_a_worker_host_killed_mid_run(lab, tmp_path):
    """The worker host's Ray processes are SIGKILLed once round 1 is done, with rounds left to run (a round of 4
    logreg clients takes under a second once Ray is up). Flower 1.39's actor pool keeps the dead host's actor: the
    ClientApps it is handed fail with Ray's ActorUnavailableError, which the ServerApp counts as client errors (and
    quarantines clients for); the head's actor trains the rest, and the run ends. A run that fails instead must say
    why on its last line."""
    runs, rounds = tmp_path / "cluster", 30
    with RayCluster(lab["head"], {"worker": lab["worker"]}, tmp_path) as cluster:
        process = subprocess.Popen(
            lab["head"].command(simulation(runs, rounds, cluster.address)),
            cwd=ROOT,
            env=simulation_env(runs),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output = "".join(read_until(process, lambda line: f"round   1/{rounds} |" in line))
            assert cluster.kill("worker"), "the worker host had no Ray process to kill"
            output += process.communicate(timeout=900)[0]
        finally:
            process.kill()
        (tmp_path / "fedbayes-run.log").write_text(output)
    done = rows(runs)
    if process.returncode == 0:
        assert [row["round"] for row in done] == list(range(1, rounds + 1)), output[-3000:]
        reasons = [reason for row in raw_rows(runs) for reason in row["rejected"].values()]
        assert any("ActorUnavailableError" in reason for reason in reasons), reasons
    else:
        assert process.returncode == 1 and "fedbayes run failed: " in output.splitlines()[-1], output[-3000:]
