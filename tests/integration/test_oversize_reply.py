"""A 200 MiB reply under `max-payload-mb=1`, over real gRPC, from a registered client (TLS, node authentication, the
SuperLink's state in SQLite, as deployments run): the SuperLink refuses it at its first chunk, before storing it
(`fedbayes superlink --max-message-mb`, which `LocalFederation` sets as `fedbayes local` does), the round commits
the other clients, the rogue's refusal names the limit, and neither the SuperLink nor the ServerApp holds the reply:
the SuperLink's peak resident memory stays under 400 MiB, the ServerApp's within 250 MiB of what it held as it was
forked (the pages it shares with its warm executor; its model and test set take about 150), the SuperLink's database
far below the reply. Before, the SuperLink stored what arrived
until the ServerApp had pulled past the limit: 0.55 GB peak and a 116 MB database for this reply
(benchmarks/oversize_reply.py, docs/guides/robustness.md)."""

from __future__ import annotations

import threading

import pytest

from fedbayes.deploy.launcher import LocalFederation
from fedbayes.deploy.pki import init_pki, make_supernode_key
from fedbayes.deploy.processes import is_serverapp
from tests.support.processes import PeakMemory, fault_env

pytestmark = pytest.mark.integration

PADDING_MB = 200
SUPERLINK_PEAK_MIB = 400  # a round without the reply takes it to about 160 MiB
SERVERAPP_GROWTH_MIB = 250  # its growth after the fork in a round without the reply: about 150 MiB (model, test set)
DATABASE_PEAK_MB = 20  # the reply would be 200 MB in it


def test_a_reply_over_the_limit_is_refused_by_the_superlink_before_it_is_stored(tmp_path):
    workdir, results = tmp_path / "fed", tmp_path / "results.jsonl"
    keys = [make_supernode_key(tmp_path / "keys", f"client-{index}") for index in range(3)]
    config = {
        "strategy": "fedavg",
        "num-server-rounds": 1,
        "federation": "oversize",
        "fraction": 0.02,
        "model": "logreg",
        "max-payload-mb": 1.0,
        "results-path": str(results),
        "wait-for-clients": 3,
    }
    database_mb, stop = [0.0], threading.Event()
    tls = init_pki(tmp_path / "pki", ips=["127.0.0.1"])
    with LocalFederation(workdir, tls=tls, node_auth=True, max_message_mb=1.0) as federation:
        for key in keys:
            federation.register(key.public)
        rogue = fault_env("rogue", FEDBAYES_ROGUE_ATTACK=f"pad:{PADDING_MB}")
        federation.start_supernode(0, 3, extra_env=rogue, auth_key=keys[0].private)
        for index in (1, 2):
            federation.start_supernode(index, 3, auth_key=keys[index].private)
        superlink = federation.superlink.popen.pid

        def role(pid: int) -> str | None:
            return "SuperLink" if pid == superlink else "ServerApp" if is_serverapp(pid) else None

        def watch_database() -> None:
            while not stop.wait(0.1):
                for path in workdir.glob("superlink.db*"):  # the file and its write-ahead log
                    database_mb[0] = max(database_mb[0], path.stat().st_size / 1e6)

        watcher = threading.Thread(target=watch_database, daemon=True)
        watcher.start()
        with PeakMemory(federation.processes.members, role) as memory:
            (row,) = federation.follow(results, federation.submit(config), 1, on_row=lambda row: None)
        stop.set()
        watcher.join()
        server_log = (federation.log_dir / "flwr-run.log").read_text()

    assert row["clients"] == 2 and row["clients_sent"] == 3, row["rejected"]
    ((who, why),) = row["rejected"].items()
    assert "client error: the SuperLink refused the reply of node" in why, why
    assert "it is over --max-message-mb=1 (5.0 MiB of its objects sent, the rest not taken)" in why
    assert "the SuperLink refused the reply" in server_log  # the round's log says so too
    assert memory.peaks["SuperLink"] < SUPERLINK_PEAK_MIB, memory.peaks
    # a fork counts the pages it shares with its warm executor: what the ServerApp took is its growth after the fork
    assert memory.peaks["ServerApp"] - memory.first["ServerApp"] < SERVERAPP_GROWTH_MIB, (memory.first, memory.peaks)
    assert database_mb[0] < DATABASE_PEAK_MB, database_mb


def test_an_instruction_over_a_supernodes_limit_is_refused_by_it_and_named_in_the_round(tmp_path):
    """SuperNodes bounding messages at 1 MiB (`fedbayes supernode --max-message-mb 1`) under a run whose
    max-payload-mb is 512: the instruction of an MLP of 3 MiB is refused by the SuperNode as it pulls it, and its
    error reply names the limit in the round's report."""
    from fedbayes.tasks.runlog import RunFailed

    workdir, results = tmp_path / "fed", tmp_path / "results.jsonl"
    config = {
        "strategy": "fedavg",
        "num-server-rounds": 1,
        "federation": "oversize-instruction",
        "fraction": 0.02,
        "hidden": "1000",  # 784 x 1000 float32 weights: 3 MiB
        "results-path": str(results),
        "wait-for-clients": 1,
    }
    with LocalFederation(workdir, max_message_mb=1.0) as federation:
        federation.start_supernode(0, 1)
        with pytest.raises(RunFailed) as failed:
            federation.follow(results, federation.submit(config), 1, on_row=lambda row: None)
        supernode_log = (federation.log_dir / "supernode-0.log").read_text()
    assert "client error: the SuperNode refused the instruction: it is over --max-message-mb=1 (" in str(failed.value)
    assert "Failed to receive message" in supernode_log  # Flower's own line, with the reason
