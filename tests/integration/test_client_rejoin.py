"""A client paused with Ctrl-C and started again takes part in the first round the server starts once it is back
(docs/running/remote-client.md, "Pause"): `fedbayes client` over TLS with node authentication on loopback, two
clients, BayesADMM. Nothing on the server's side holds it back (the node id is the same, its absence was no refusal, it
is not quarantined); what it misses is the round in progress when it comes back, and the rounds that start while
its own start-up runs. Round 2 is held open by the other client until the paused one is online again, which makes
"the next round" exact however slow the machine."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import LocalFederation, console_script
from fedbayes.deploy.pki import init_pki, list_supernodes, make_supernode_key
from tests.support.processes import stall_env, wait_for_file

pytestmark = pytest.mark.integration

CLIENTS = ("steady", "pausing")


def join_command(federation: LocalFederation, directory: Path, client: str, index: int) -> list[str]:
    return [
        console_script("fedbayes"),
        "client",
        "--superlink",
        federation.fleet_address,
        "--ca",
        str(directory / "pki" / "ca.crt"),
        "--key",
        str(directory / "pki" / "supernodes" / client),
        "--client-id",
        client,
        "--data",
        str(directory / "data" / f"client-{index}.npz"),
        "--state-dir",
        str(directory / "state"),
    ]


def test_a_client_paused_with_ctrl_c_takes_part_in_the_first_round_after_it_is_back(tmp_path):
    tls = init_pki(tmp_path / "pki")
    keys = {client: make_supernode_key(tmp_path / "pki" / "supernodes", client) for client in CLIENTS}
    assert fedbayes(["export-partitions", "--clients", "2", "--fraction", "0.02", "--out", str(tmp_path / "data")]) == 0
    held, release = tmp_path / "steady-in", tmp_path / "steady-go"
    results = tmp_path / "results.jsonl"
    with LocalFederation(tmp_path / "fed", tls=tls, node_auth=True) as federation:
        node_ids = {client: federation.register(keys[client].public) for client in CLIENTS}

        def online(client: str) -> bool:
            nodes = list_supernodes("fedbayes-local", federation.processes.env)
            return {int(node["node-id"]): node["status"] for node in nodes}.get(node_ids[client]) == "online"

        def start(client: str, name: str, extra_env=None):
            command = join_command(federation, tmp_path, client, CLIENTS.index(client))
            return federation.processes.start(name, command, extra_env=extra_env)

        start("steady", "steady", extra_env=stall_env("2", held, release))
        pausing = start("pausing", "pausing-1")
        submit = federation.submit(
            {
                "strategy": "bayesadmm",  # a client that keeps state: the stall holds its state's load
                "num-server-rounds": 3,
                "fraction": 0.02,
                "wait-for-clients": 2,
                "federation": "paused",
                "results-path": str(results),
                "round-timeout": 300.0,
                # the held round waits for the steady client: under load the restarted client can reply to it first
                # (the round-2 message its first process had not pulled), and a straggler cut would end it early
                "straggler-wait": 0.0,
                "lr": 5e-5,
                "input-scale": 255.0,
                "ensemble-samples": 0,
            }
        )

        def pause_and_come_back(row):
            if row["round"] == 1:
                wait_for_file(Path(f"{held}-r2"), "steady never started round 2")
                federation.processes.stop(pausing, signal.SIGINT)  # Ctrl-C
                assert pausing.popen.wait(timeout=60) == 130
                start("pausing", "pausing-2")
                deadline = time.monotonic() + 300
                while not online("pausing"):
                    assert time.monotonic() < deadline, "the paused client never came back online"
                    time.sleep(1)
                Path(f"{release}-r2").touch()  # round 2 ends; round 3 is the first to start with the client back

        rows = federation.follow(results, submit, 3, on_row=pause_and_come_back)
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    assert [row["round"] for row in rows] == [1, 2, 3], server_log[-3000:]
    assert (rows[0]["clients"], rows[0]["clients_sent"]) == (2, 2)
    assert (rows[2]["clients"], rows[2]["clients_sent"], rows[2]["rejected"]) == (2, 2, {}), rows[2]
