"""Multi-host system test: the SuperLink on one machine, each SuperNode on its own, TLS + node auth on.

Machines are network namespaces on a bridge (tests/netns.py), each with its own IP; SuperNodes dial
the SuperLink's IP over TLS with their own registered key; the operator's `flwr` runs on the server
machine against its loopback-only Control API. BayesADMM with small data so the whole module takes a
few minutes: membership changes (a late joiner, a client SIGKILLed mid-round and restarted) and a
server machine that dies mid-run and resumes to the same final posterior as an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.launcher import LocalFederation
from deploy.pki import init_pki, list_supernodes, make_supernode_key
from tests.netns import NetnsLab

pytestmark = pytest.mark.integration

APP_ROOT = Path(__file__).resolve().parents[1]
# How long a round waits for a silent client; the kill test measures it. Well above a normal round
# (4-6 s on an idle 2-core machine, 35 s seen under a load average of 20).
ROUND_TIMEOUT = 60.0
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
