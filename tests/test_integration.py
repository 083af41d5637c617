"""Real processes over loopback gRPC: a SuperLink, SuperNodes, the ServerApp and ClientApps."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedbayes.deploy.launcher import LocalFederation
from fedbayes.deploy.processes import processes_with_env
from tests.helpers import run_loopback

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def with_pythonpath(folder: Path) -> str:
    """`folder` first on PYTHONPATH, keeping what the environment already had there."""
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def processes_of(flwr_home: Path) -> list[int]:
    """Live processes whose environment says they belong to this federation."""
    return processes_with_env("FLWR_HOME", str(flwr_home))


def run_config(workdir: Path, rounds: int, clients: int) -> dict:
    return {
        "strategy": "fedavg",
        "num-server-rounds": rounds,
        "fraction": 0.1,
        "local-epochs": 2,
        "results-path": str(workdir / "results.jsonl"),
        "federation": "itest",
        "wait-for-clients": clients,
        "round-timeout": 120.0,
    }


def run_federation(workdir: Path, rounds: int, node_env: dict[int, dict[str, str]], executor: str = "fork"):
    run = run_loopback(workdir, run_config(workdir, rounds, len(node_env)), rounds, len(node_env), executor, node_env)
    return run.rows, run.server_log, run.flwr_home


@pytest.mark.parametrize("executor", ["fork", "shared", "subprocess"])
def test_fedavg_two_supernodes_over_grpc(tmp_path, executor):
    """Every way of running ClientApps: forks of a warm superexec per SuperNode, forks of one shared by both,
    and Flower's stock subprocess."""
    rows, _, flwr_home = run_federation(tmp_path / "fed", rounds=2, node_env={0: {}, 1: {}}, executor=executor)
    assert [row["round"] for row in rows] == [1, 2]
    assert all(row["clients"] == 2 and row["clients_rejected"] == 0 for row in rows)
    assert rows[-1]["accuracy"] > 0.5, rows  # 10 classes: chance is 0.1
    assert 0 < rows[-1]["nll"] < 2.0 and 0 <= rows[-1]["ece"] <= 1
    assert processes_of(flwr_home) == []
    logs = {path.name for path in (tmp_path / "fed" / "logs").iterdir()}
    expected = {"fork": {"superexec-0.log", "superexec-1.log"}, "shared": {"superexec-shared.log"}, "subprocess": set()}
    assert {name for name in logs if name.startswith("superexec")} == expected[executor]
    if executor == "shared":  # both clients' ClientApps ran as forks of the one process
        shared_log = (tmp_path / "fed" / "logs" / "superexec-shared.log").read_text()
        assert "client-0: " in shared_log and "client-1: " in shared_log


def test_the_shared_executor_refuses_a_supernode_it_cannot_serve(tmp_path):
    with LocalFederation(tmp_path / "fed", "shared") as federation:
        with pytest.raises(ValueError, match="one environment"):
            federation.start_supernode(0, 2, extra_env={"PYTHONPATH": "/elsewhere"})
        federation.start_supernode(0, 2)
        federation.start_shared_superexec()
        with pytest.raises(ValueError, match="started before it"):
            federation.start_supernode(1, 2)


def test_malformed_reply_is_rejected_and_the_round_goes_on(tmp_path):
    poisoned = {"PYTHONPATH": with_pythonpath(ROOT / "tests" / "fault_injection")}
    rows, server_log, flwr_home = run_federation(tmp_path / "fed", rounds=2, node_env={0: {}, 1: poisoned})
    assert len(rows) == 2, "the server must keep running"
    for row in rows:
        assert (row["clients"], row["clients_rejected"], row["clients_sent"]) == (1, 1, 2)
    assert rows[-1]["accuracy"] > 0.5, "client-0's updates were used"
    assert "client 'client-1'" in server_log and "weights/" in server_log and "NaN or Inf" in server_log
    assert processes_of(flwr_home) == []


def test_launcher_ctrl_c_leaves_no_process_behind(tmp_path):
    workdir = tmp_path / "fed"
    results_path = tmp_path / "out.jsonl"  # left over from an earlier run: must not be read as this run's
    results_path.write_text("".join(json.dumps({"round": r, "stale": True}) + "\n" for r in range(1, 51)))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "fedbayes.deploy.cli", "local", "--strategy", "fedavg", "--clients", "2", "--rounds", "50",
         "--fraction", "0.05", "--workdir", str(workdir), "--results", str(results_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        lines.append(line)
        if line.strip().startswith("1 "):  # first table row: the run is in full swing
            break
    else:
        launcher.kill()
        pytest.fail("no round finished:\n" + "".join(lines))
    assert processes_of(workdir / "flwr-home"), "the federation should be running"
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=60) == 130
    assert processes_of(workdir / "flwr-home") == []
    results = [json.loads(line) for line in results_path.read_text().splitlines()]
    assert 1 <= len(results) < 50 and not any("stale" in row for row in results)


def test_a_dying_superlink_stops_the_run_and_everything_else(tmp_path):
    workdir = tmp_path / "fed"
    with pytest.raises(RuntimeError, match="superlink exited"):
        with LocalFederation(workdir) as federation:
            for index in range(2):
                federation.start_supernode(index, 2)
            submit = federation.submit(run_config(workdir, rounds=50, clients=2))

            def kill_superlink(row):
                federation.superlink.popen.kill()

            federation.follow(workdir / "results.jsonl", submit, 50, on_row=kill_superlink)
    assert processes_of(federation.flwr_home) == []


def test_the_warm_executor_wants_one_parent_pid_per_supernode():
    from fedbayes.deploy.cli import main

    with pytest.raises(SystemExit, match="one --parent-pid per --runtime-api-address"):
        main(["superexec", "--insecure", "--runtime-api-address", "127.0.0.1:1", "--runtime-api-address", "127.0.0.1:2",
              "--parent-pid", "1"])


def test_a_failing_poller_stops_the_shared_executor():
    """A poller that dies would leave its SuperNode without an executor: the shared process stops the rest and
    exits 1, which the launcher reports. Here every poller fails at start (a CA file that does not exist)."""
    served = ["--runtime-api-address", "127.0.0.1:1", "--parent-pid", str(os.getpid()),
              "--runtime-api-address", "127.0.0.1:2", "--parent-pid", str(os.getpid())]
    done = subprocess.run([sys.executable, "-m", "fedbayes.deploy.cli", "superexec", "--root-certificates",
                           "/nonexistent/ca.pem", *served], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "failed; stopping all" in done.stderr
