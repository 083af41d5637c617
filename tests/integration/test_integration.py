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
from tests.support import ROOT
from tests.support.processes import fault_env, processes_of, run_loopback, wait_for_log_lines, with_pythonpath

pytestmark = pytest.mark.integration


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


def run_federation(workdir: Path, rounds: int, node_env: dict[int, dict[str, str]], executor: str = "shared"):
    run = run_loopback(workdir, run_config(workdir, rounds, len(node_env)), rounds, len(node_env), executor, node_env)
    return run.rows, run.server_log, run.flwr_home


@pytest.mark.parametrize("executor", ["shared", "fork", "subprocess"])
def test_fedavg_two_supernodes_over_grpc(tmp_path, executor):
    """Every way of running ClientApps: forks of one warm superexec serving both SuperNodes, forks of a warm
    superexec per SuperNode, and Flower's stock subprocess (for the ServerApp too; with the others, the ServerApp
    is a fork of a warm superexec beside the SuperLink). The stock path's every ClientApp is a new process that
    imports torch (~11 CPU-s each here), so it runs one round: a second would add two such processes, nothing new."""
    rounds = 1 if executor == "subprocess" else 2
    rows, _, flwr_home = run_federation(tmp_path / "fed", rounds=rounds, node_env={0: {}, 1: {}}, executor=executor)
    assert [row["round"] for row in rows] == list(range(1, rounds + 1))
    assert all(row["clients"] == 2 and row["clients_rejected"] == 0 for row in rows)
    assert rows[-1]["accuracy"] > 0.5, rows  # 10 classes: chance is 0.1
    assert 0 < rows[-1]["nll"] < 2.0 and 0 <= rows[-1]["ece"] <= 1
    assert processes_of(flwr_home) == []
    logs = {path.name for path in (tmp_path / "fed" / "logs").iterdir()}
    expected = {
        "fork": {"superexec-0.log", "superexec-1.log", "superexec-serverapp.log"},
        "shared": {"superexec-shared.log"},
        "subprocess": set(),
    }
    assert {name for name in logs if name.startswith("superexec")} == expected[executor]
    if executor != "subprocess":  # the ServerApp ran as a fork of the warm process beside the SuperLink
        serverapp_executor = {"fork": "superexec-serverapp.log", "shared": "superexec-shared.log"}[executor]
        serverapp_log = (tmp_path / "fed" / "logs" / serverapp_executor).read_text()
        assert "fedbayes: federation itest, strategy fedavg" in serverapp_log, serverapp_log[-3000:]
    if executor == "shared":  # both clients' ClientApps ran as forks of that same process
        assert "client-0: " in serverapp_log and "client-1: " in serverapp_log


def test_a_supernode_the_shared_executor_cannot_serve_gets_a_warm_executor_of_its_own(tmp_path):
    with LocalFederation(tmp_path / "fed") as federation:
        federation.start_supernode(0, 3, extra_env={"PYTHONPATH": with_pythonpath(ROOT / "tests" / "plugins")})
        federation.start_supernode(1, 3)
        federation.start_shared_superexec()
        federation.start_supernode(2, 3)  # e.g. a restarted client: named to the shared executor as it starts
        assert sorted(federation.superexecs) == [0]
        # the shared executor is the SuperLink's ServerApp executor, told its SuperNodes on its stdin
        assert federation.shared_superexec is federation.serverapp_superexec
        served = wait_for_log_lines(federation.shared_superexec, "fedbayes superexec: serving ", count=2)
        assert served == [
            f"fedbayes superexec: serving the SuperNode at 127.0.0.1:{federation.runtime_ports[index]} "
            f"(process {federation.supernodes[index].popen.pid})"
            for index in (1, 2)
        ], served
    with LocalFederation(tmp_path / "late") as federation:
        federation.start_shared_superexec()  # as a submit does before any SuperNode has started
        node = federation.start_supernode(0, 1)
        assert federation.shared_superexec is federation.serverapp_superexec and federation.superexecs == {}
        assert wait_for_log_lines(federation.shared_superexec, "fedbayes superexec: serving ") == [
            f"fedbayes superexec: serving the SuperNode at 127.0.0.1:{federation.runtime_ports[0]} "
            f"(process {node.popen.pid})"
        ]


def test_malformed_reply_is_rejected_and_the_round_goes_on(tmp_path):
    poisoned = fault_env("nan")
    rows, server_log, flwr_home = run_federation(tmp_path / "fed", rounds=2, node_env={0: {}, 1: poisoned})
    assert len(rows) == 2, "the server must keep running"
    for row in rows:
        assert (row["clients"], row["clients_rejected"], row["clients_sent"]) == (1, 1, 2)
    assert rows[-1]["accuracy"] > 0.5, "client-0's updates were used"
    assert "client 'client-1'" in server_log and "weights/" in server_log and "NaN or Inf" in server_log
    assert processes_of(flwr_home) == []


def test_a_replayed_reply_is_refused_over_grpc_and_the_others_rounds_commit(tmp_path):
    """Client-2 sends its honest round-1 reply again in rounds 2 and 3, its round edited to theirs: the same client
    id, node and tensors as a reply the server accepted. The server refuses it as the answer to no instruction of
    those rounds (its nonce is round 1's) and commits each round from the other two."""
    rogue = fault_env("rogue", FEDBAYES_ROGUE_ATTACK="replay", FEDBAYES_ROGUE_RECORD=str(tmp_path / "recorded.npz"))
    rows, server_log, flwr_home = run_federation(tmp_path / "fed", rounds=3, node_env={0: {}, 1: {}, 2: rogue})
    assert [row["round"] for row in rows] == [1, 2, 3], "the server must keep running"
    assert (rows[0]["clients"], rows[0]["clients_rejected"]) == (3, 0), rows[0]["rejected"]
    for row in rows[1:]:
        assert (row["clients"], row["clients_rejected"], row["clients_sent"]) == (2, 1, 3), row["rejected"]
        (reason,) = row["rejected"].values()
        assert "field 'header.nonce': not the nonce of the server's last message to node" in reason, reason
        assert list(row["rejected"])[0].startswith("client 'client-2' (node ")
    assert (tmp_path / "recorded.npz").exists(), "client-2 recorded its round-1 reply"
    assert rows[-1]["accuracy"] > 0.5, "the honest clients' updates were used"
    assert processes_of(flwr_home) == []


def test_launcher_ctrl_c_leaves_no_process_behind(tmp_path):
    workdir = tmp_path / "fed"
    results_path = tmp_path / "out.jsonl"  # an earlier run's, appended to: must not be read as this run's
    results_path.write_text("".join(json.dumps({"round": r, "stale": True}) + "\n" for r in range(1, 51)))
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedbayes.deploy.cli",
            "local",
            "--strategy",
            "fedavg",
            "--clients",
            "2",
            "--rounds",
            "50",
            "--fraction",
            "0.05",
            "--workdir",
            str(workdir),
            "--results",
            str(results_path),
            "--set",
            "results-exists=append",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
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
    earlier, this_run = results[:50], results[50:]  # results-exists=append: the earlier rows are kept, untouched
    assert all(row["stale"] for row in earlier) and 1 <= len(this_run) < 50
    assert not any("stale" in row for row in this_run)


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
        main(
            [
                "superexec",
                "--insecure",
                "--runtime-api-address",
                "127.0.0.1:1",
                "--runtime-api-address",
                "127.0.0.1:2",
                "--parent-pid",
                "1",
            ]
        )


def test_the_warm_executor_refuses_a_bad_setting_before_it_preloads():
    """A CA file that does not exist, a poll interval that is no number: named at once, exit code 1."""
    served = ["--runtime-api-address", "127.0.0.1:1", "--parent-pid", str(os.getpid())]
    command = [sys.executable, "-m", "fedbayes.deploy.cli", "superexec", *served]
    missing_ca = subprocess.run(
        [*command, "--root-certificates", "/nonexistent/ca.pem"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert missing_ca.returncode == 1 and "`--root-certificates` does not point to a file" in missing_ca.stderr, (
        missing_ca.stderr[-2000:]
    )
    bad_poll = subprocess.run(
        [*command, "--insecure"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "soon"},
    )
    assert bad_poll.returncode == 1 and "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" in bad_poll.stderr, bad_poll.stderr[-2000:]
