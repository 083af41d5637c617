"""Multi-host system test: the SuperLink on one machine, each SuperNode on its own, TLS + node auth on.

Machines are network namespaces on a bridge (tests/netns.py), each with its own IP; SuperNodes dial
the SuperLink's IP over TLS with their own registered key; the operator's `flwr` runs on the server
machine against its loopback-only Control API. BayesADMM with small data so the whole module takes a
few minutes: membership changes (a late joiner, a client SIGKILLed mid-round and restarted) and a
server machine that dies mid-run and resumes to the same final posterior as an uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedbayes.client.state import ClientStateStore
from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import LocalFederation, console_script
from fedbayes.deploy.pki import init_pki, list_supernodes, make_supernode_key
from fedbayes.server.checkpoint import CheckpointStore
from tests.support.netns import NetnsLab
from tests.support.processes import BreakableFederation, stall_env, wait_for_file

pytestmark = pytest.mark.integration

# How long a round waits for a silent client. Above a normal round (4-6 s on an idle 2-core machine, 35 s
# seen under a load average of 20) plus the time round 3 is held open while a killed client comes back.
ROUND_TIMEOUT = 150.0
BAYESADMM = {
    "strategy": "bayesadmm",
    "fraction": 0.05,
    "local-epochs": 1,
    "lr": 5e-5,
    "input-scale": 255.0,
    "ensemble-samples": 0,
    "min-clients": 2,
    "wait-for-clients": 2,
    "wait-for-clients-timeout": 90.0,
}
TRUSTED = ("client-0", "client-1", "client-2")


@pytest.fixture(scope="module")
def lab():
    with NetnsLab(["server", "c0", "c1", "c2", "intruder"]) as machines:
        yield machines


@pytest.fixture(scope="module")
def credentials(lab, tmp_path_factory):
    """The server certificate is valid for the server machine's IP, the name clients dial here."""
    directory = tmp_path_factory.mktemp("pki")
    tls = init_pki(directory, ips=[lab["server"].address])
    keys = {client: make_supernode_key(directory / "supernodes", client) for client in (*TRUSTED, "intruder")}
    return tls, keys


def secured_federation(workdir: Path, lab: NetnsLab, credentials) -> tuple[BreakableFederation, dict[str, int]]:
    """A started federation on the server machine with the trusted clients' keys registered; their node ids."""
    tls, keys = credentials
    federation = BreakableFederation(workdir, server=lab["server"], tls=tls, node_auth=True)
    federation.__enter__()
    return federation, {client: federation.register(keys[client].public) for client in TRUSTED}


def start_client(federation: LocalFederation, lab: NetnsLab, credentials, index: int, extra_env=None):
    return federation.start_supernode(
        index, 3, host=lab[f"c{index}"], auth_key=credentials[1][f"client-{index}"].private, extra_env=extra_env
    )


def node_status(federation: LocalFederation) -> dict[int, str]:
    """Every node the SuperLink knows: node id -> registered | online | offline | unregistered."""
    nodes = list_supernodes("fedbayes-local", federation.processes.env, federation.server.command([]))
    return {int(node["node-id"]): node["status"] for node in nodes}


def test_an_unregistered_key_is_rejected(lab, credentials, tmp_path):
    tls, keys = credentials
    with LocalFederation(tmp_path / "fed", server=lab["server"], tls=tls, node_auth=True) as federation:
        registered = federation.register(keys["client-0"].public)
        intruder = federation.start_supernode(0, 3, host=lab["intruder"], auth_key=keys["intruder"].private)
        intruder.popen.wait(timeout=120)
        log = intruder.log_path.read_text()
        assert intruder.popen.returncode != 0 and "Failed to activate SuperNode" in log, log[-2000:]
        assert node_status(federation) == {registered: "registered"}  # never online, no node for the intruder


def test_joins_and_a_killed_client_over_tls(lab, credentials, tmp_path):
    """Rounds 1-4. client-2 starts while round 1 runs (with `fedbayes client`, the documented one-command
    path) and takes part from round 2 on (K: 2 -> 3). client-1 is SIGKILLed inside round 3 (its ClientApp
    hangs there); round 3 goes on with the other two updates, bounded by Flower's verdict on the dead
    node (no heartbeat for 2 x 30 s) and the round timeout. Restarted, client-1 is in round 4 under the
    same node id and goes on from its durable state of round 2 (the server's replay of its duals agrees).

    client-0 holds rounds 1 and 3 open until the test says so, which makes "the next round" exact
    however slow the machine: Flower refuses a key whose node still counts as online, so a SIGKILLed
    client can only come back once the SuperLink has seen it go offline."""
    workdir = tmp_path / "fed"
    results = workdir / "results.jsonl"
    data = tmp_path / "data"  # partition 2 of the run's split, as client-2's own data file
    assert (
        fedbayes(["export-partitions", "--clients", "3", "--fraction", str(BAYESADMM["fraction"]), "--out", str(data)])
        == 0
    )
    held, release, hung = tmp_path / "client-0-in", tmp_path / "client-0-go", tmp_path / "client-1-in"
    config = {
        **BAYESADMM,
        "num-server-rounds": 4,
        "federation": "members",
        "results-path": str(results),
        "round-timeout": ROUND_TIMEOUT,
        "straggler-wait": 0.0,  # the held and hung clients are waited for up to round-timeout
    }
    federation, node_ids = secured_federation(workdir, lab, credentials)

    def wait_for_status(client: str, status: str, poll: float = 1.0) -> None:
        deadline = time.monotonic() + 150
        while node_status(federation).get(node_ids[client]) != status:
            assert time.monotonic() < deadline, f"{client} never became {status}"
            time.sleep(poll)

    try:
        start_client(federation, lab, credentials, 0, extra_env=stall_env("1,3", held, release))
        start_client(federation, lab, credentials, 1, extra_env=stall_env("3", hung))
        submit = federation.submit(config)
        wait_for_file(Path(f"{held}-r1"), "client-0 never started round 1")
        federation.processes.start(
            "fedbayes-client-2",
            lab["c2"].command(
                [
                    console_script("fedbayes"),
                    "client",
                    "--superlink",
                    federation.fleet_address,
                    "--ca",
                    str(credentials[0].ca_cert),
                    "--key",
                    str(credentials[1]["client-2"].private),
                    "--client-id",
                    "client-2",
                    "--data",
                    str(data / "client-2.npz"),
                    "--state-dir",
                    str(workdir / "client-state"),
                ]
            ),
        )
        wait_for_status("client-2", "online")
        Path(f"{release}-r1").touch()

        def kill_and_restart_client_one(row):
            if row["round"] == 2:
                wait_for_file(Path(f"{hung}-r3"), "client-1 never started round 3")
                wait_for_file(Path(f"{held}-r3"), "client-0 never started round 3")
                federation.kill_supernode(1)
                # Offline only once two 30 s heartbeats lapse (36-60 s); each ask is a `flwr` process, ~2 CPU-s
                wait_for_status("client-1", "offline", poll=5.0)
                start_client(federation, lab, credentials, 1)
                wait_for_status("client-1", "online")
                Path(f"{release}-r3").touch()

        rows = federation.follow(results, submit, 4, on_row=kill_and_restart_client_one)
        nodes_at_the_end = node_status(federation)
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    finally:
        federation.__exit__(None, None, None)
    assert [row["round"] for row in rows] == [1, 2, 3, 4], server_log[-3000:]
    assert [(row["clients"], row["clients_sent"]) for row in rows] == [(2, 2), (3, 3), (2, 3), (3, 3)], server_log[
        -3000:
    ]
    assert [row["known_clients"] for row in rows] == [2, 3, 3, 3]  # BayesADMM's K: clients that ever replied
    assert rows[2]["round_seconds"] < ROUND_TIMEOUT + 30, rows[2]
    # The restarted client-1 is online under the node id its key was registered with; no other node appeared.
    assert nodes_at_the_end == {node_ids[client]: "online" for client in TRUSTED}, (node_ids, nodes_at_the_end)
    assert not any(row["fresh_starts"] for row in rows) and not any(
        "replay" in reason for row in rows for reason in row["rejected"].values()
    ), rows
    store = ClientStateStore(workdir / "client-state", "members", "client-1")
    assert store.saved_rounds() == [2, 4]  # round 3 never finished on client-1


def test_a_dead_server_machine_resumes_and_loses_nothing(lab, credentials, tmp_path):
    """BayesADMM for 3 rounds twice on the same two clients: straight through, and with the whole server
    machine (SuperLink, its executor, the ServerApp) SIGKILLed after round 2 and started again. The
    SuperNodes reconnect by themselves; the run submitted again resumes from the checkpoint and ends
    with the same global posterior and client duals as the uninterrupted run."""
    workdir = tmp_path / "fed"
    straight = {
        **BAYESADMM,
        "num-server-rounds": 3,
        "federation": "straight",
        "round-timeout": 120.0,
        "straggler-wait": 0.0,  # round 3 waits for the held client until the server machine dies
        "results-path": str(workdir / "straight.jsonl"),
    }
    resumed = {**straight, "federation": "resumed", "results-path": str(workdir / "resumed.jsonl")}
    # client-0 holds round 3 of the run to be killed open until the kill: round 2's row is written while round 3
    # trains, and a fast round 3 could otherwise finish before the kill.
    release = tmp_path / "client-0-go"
    Path(f"{release}-r3").touch()  # the straight run goes through
    federation, _ = secured_federation(workdir, lab, credentials)
    try:
        start_client(federation, lab, credentials, 0, extra_env=stall_env("3", tmp_path / "client-0-in", release))
        start_client(federation, lab, credentials, 1)
        federation.follow(workdir / "straight.jsonl", federation.submit(straight), 3, on_row=lambda row: None)
        Path(f"{release}-r3").unlink()
        first = federation.submit(resumed)
        first_run = federation.run_id(first)

        def kill_server_after_round_two(row):
            if row["round"] == 2:
                federation.kill_superlink()
                federation.processes.stop(first)  # the operator's CLI lost its SuperLink
                first.popen.wait(timeout=30)
                Path(f"{release}-r3").touch()

        federation.follow(workdir / "resumed.jsonl", first, 3, on_row=kill_server_after_round_two)
        federation.start_superlink()
        try:
            federation.stop_run(first_run)  # the database may still have it as running
        except subprocess.CalledProcessError as error:
            assert b"already finished" in error.stdout + error.stderr, error.stdout + error.stderr
        second = federation.submit(resumed)
        federation.follow(workdir / "resumed.jsonl", second, 3, on_row=lambda row: None)
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    finally:
        federation.__exit__(None, None, None)
    assert "resuming after round" in server_log, server_log[-3000:]
    rows = [json.loads(line) for line in (workdir / "resumed.jsonl").read_text().splitlines()]
    summary = [
        {key: row[key] for key in ("round", "clients", "clients_sent", "rejected", "round_seconds")} for row in rows
    ]
    assert [row["round"] for row in rows] == [1, 2, 3] and all(row["clients"] == 2 for row in rows), (
        summary,
        server_log[-3000:],
    )
    final = {
        name: load_file(CheckpointStore(workdir / "server-state", name, {}).path) for name in ("straight", "resumed")
    }
    assert final["straight"].keys() == final["resumed"].keys()
    max_abs_diff = max(float(np.max(np.abs(final["resumed"][k] - v))) for k, v in final["straight"].items())
    print(f"resume equivalence: max |resumed - straight| over {len(final['straight'])} tensors = {max_abs_diff:.3e}")
    for name, value in final["straight"].items():
        np.testing.assert_allclose(final["resumed"][name], value, rtol=1e-6, atol=1e-9, err_msg=name)
