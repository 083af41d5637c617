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
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from deploy.launcher import LocalFederation
from deploy.pki import init_pki, list_supernodes, make_supernode_key
from server.checkpoint import CheckpointStore
from tests.netns import NetnsLab

pytestmark = pytest.mark.integration

APP_ROOT = Path(__file__).resolve().parents[1]
BAYESADMM = {
    "strategy": "bayesadmm", "fraction": 0.05, "local-epochs": 1, "lr": 5e-5, "input-scale": 255.0,
    "ensemble-samples": 0, "min-clients": 2, "wait-for-clients": 2, "wait-for-clients-timeout": 90.0,
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


def secured_federation(workdir: Path, lab: NetnsLab, credentials) -> tuple[LocalFederation, dict[str, int]]:
    """A started federation on the server machine with the trusted clients' keys registered; their node ids."""
    tls, keys = credentials
    federation = LocalFederation(workdir, server=lab["server"], tls=tls, node_auth=True)
    federation.__enter__()
    return federation, {client: federation.register(keys[client].public) for client in TRUSTED}


def start_client(federation: LocalFederation, lab: NetnsLab, credentials, index: int, extra_env=None):
    return federation.start_supernode(index, 3, host=lab[f"c{index}"], auth_key=credentials[1][f"client-{index}"].private,
                                      extra_env=extra_env)


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


def test_a_dead_server_machine_resumes_and_loses_nothing(lab, credentials, tmp_path):
    """BayesADMM for 3 rounds twice on the same two clients: straight through, and with the whole server
    machine (SuperLink, its executor, the ServerApp) SIGKILLed after round 2 and started again. The
    SuperNodes reconnect by themselves; the run submitted again resumes from the checkpoint and ends
    with the same global posterior and client duals as the uninterrupted run."""
    workdir = tmp_path / "fed"
    straight = {**BAYESADMM, "num-server-rounds": 3, "federation": "straight", "round-timeout": 120.0,
                "results-path": str(workdir / "straight.jsonl")}
    resumed = {**straight, "federation": "resumed", "results-path": str(workdir / "resumed.jsonl")}
    federation, _ = secured_federation(workdir, lab, credentials)
    try:
        for index in range(2):
            start_client(federation, lab, credentials, index)
        federation.follow(workdir / "straight.jsonl", federation.submit(straight), 3, on_row=lambda row: None)
        first = federation.submit(resumed)
        first_run = federation.run_id(first)

        def kill_server_after_round_two(row):
            if row["round"] == 2:
                federation.kill_superlink()
                federation.processes.stop(first)  # the operator's CLI lost its SuperLink
                first.popen.wait(timeout=30)

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
    assert "lost or stale" not in server_log and "differs from the server's replay" not in server_log
    rows = [json.loads(line) for line in (workdir / "resumed.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2, 3] and all(row["clients"] == 2 for row in rows)
    final = {name: load_file(CheckpointStore(workdir / "server-state", name, {}).path) for name in ("straight", "resumed")}
    assert final["straight"].keys() == final["resumed"].keys()
    max_abs_diff = max(float(np.max(np.abs(final["resumed"][k] - v))) for k, v in final["straight"].items())
    print(f"resume equivalence: max |resumed - straight| over {len(final['straight'])} tensors = {max_abs_diff:.3e}")
    for name, value in final["straight"].items():
        np.testing.assert_allclose(final["resumed"][name], value, rtol=1e-6, atol=1e-9, err_msg=name)
