"""`fedbayes runs`, `fedbayes status` and `fedbayes clients` (deploy/inspection.py) on a real loopback federation, run
as a user runs them: while the federation runs (its round 2 held open) and after it stopped, text and --json.

The federation: SuperLink and 3 SuperNodes on loopback (as `fedbayes local` runs them), BayesADMM, FMNIST 2%,
logistic regression, 3 rounds. client-2's replies are all NaN, so it is refused in rounds 1 and 2 and then
quarantined (max-client-rejections=2); after the run the operator forgets client-1 (`fedbayes forget`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.processes import fault_env, fedbayes, run_loopback, stall_env, wait_for_file

QUARANTINE_ROUNDS = 5


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """The federation's workdir (in a runs folder with a damaged workdir beside it), and the commands' answers while
    it ran (`live`) and the forget's."""
    tmp = tmp_path_factory.mktemp("inspection")
    workdir, marker, release = tmp / "runs" / "fed", tmp / "held", tmp / "release"
    live = {}

    def ask_while_round_2_is_held(federation, row):
        if row["round"] == 1:
            wait_for_file(Path(f"{marker}-r2"), "client-0 never reached round 2")
            live["status"] = fedbayes(["status", str(workdir), "--json"])
            live["status_text"] = fedbayes(["status", str(workdir)])
            live["superlink"] = fedbayes(["status", "--superlink", f"127.0.0.1:{federation.control_port}", "--json"])
            Path(f"{release}-r2").touch()

    config = {
        "strategy": "bayesadmm",
        "num-server-rounds": 3,
        "fraction": 0.02,
        "model": "logreg",
        "results-path": str(workdir / "results.jsonl"),
        "federation": "fed",
        "wait-for-clients": 3,
        "round-timeout": 180.0,
        "straggler-wait": 0.0,  # round 2 waits for the held client
        "max-client-rejections": 2,
        "quarantine-rounds": QUARANTINE_ROUNDS,
    }
    run = run_loopback(
        workdir,
        config,
        3,
        clients=3,
        node_env={0: stall_env("2", marker, release), 2: fault_env("nan")},
        on_row=ask_while_round_2_is_held,
    )
    forget = fedbayes(["forget", str(workdir), "--client", "client-1"])
    assert forget.returncode == 0, forget.stdout + forget.stderr
    broken = tmp / "runs" / "broken"
    broken.mkdir()
    (broken / "run-config.toml").write_text('strategy = "fedavg\n')  # an unterminated string: no TOML
    return workdir, run, live


def answer(result) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def test_status_of_a_running_federation_says_running_its_round_and_the_clients_connected(federation):
    workdir, _, live = federation
    status = answer(live["status"])
    assert status["status"] == "running" and status["why"].startswith("live process ")
    assert (status["rounds_done"], status["rounds_planned"], status["strategy"]) == (1, 3, "bayesadmm")
    assert status["connected"]["online"] == 3
    assert status["last_round"]["clients"] == 2 and status["last_round"]["clients_sent"] == 3
    assert status["checkpoint"]["round"] == 1
    assert Path(status["checkpoint"]["path"]) == workdir / "server-state" / "fed" / "checkpoint-1.safetensors"
    text = live["status_text"].stdout
    assert "status: running (live process " in text and "round: 1/3 done" in text
    assert "connected now: 3 (of 3 nodes it knows)" in text


def test_status_asks_a_running_superlink_for_its_nodes_and_runs(federation):
    superlink = answer(federation[2]["superlink"])
    assert [node["status"] for node in superlink["nodes"]] == ["online"] * 3
    (run,) = superlink["runs"]
    assert run["status"] == "running" and run["federation"] == "fed"
    assert (run["strategy"], run["num_server_rounds"]) == ("bayesadmm", 3)


def test_status_of_the_stopped_federation_gives_each_clients_rounds_and_refusals(federation):
    workdir, run, _ = federation
    status = answer(fedbayes(["status", str(workdir), "--json"]))
    assert status["status"] == "finished" and (status["rounds_done"], status["rounds_planned"]) == (3, 3)
    assert status["metrics"]["round"] == 3 and status["metrics"]["accuracy"] == run.rows[-1]["accuracy"]
    clients = {client["client"]: client for client in status["clients"]}
    assert sorted(clients) == ["client-0", "client-1", "client-2"]  # client-2's node is client-2, not a client
    assert [clients[c]["accepted"] for c in ("client-0", "client-1", "client-2")] == [3, 3, 0]
    refused = clients["client-2"]
    assert refused["refused"] == 2 and sorted(r for reason in refused["reasons"] for r in reason["rounds"]) == [1, 2]
    label = next(label for label in run.rows[0]["rejected"] if label.startswith("client 'client-2' (node "))
    assert {reason["reason"] for reason in refused["reasons"]} == {row["rejected"][label] for row in run.rows[:2]}
    assert status["checkpoint"]["round"] == 3 and status["tracking"]["target"] == ""
    text = fedbayes(["status", str(workdir)]).stdout
    assert "status: finished (all 3 rounds are done)" in text
    assert "  client-2: 0 accepted, 2 left out" in text and "tracking: off" in text


def test_clients_lists_the_bound_ids_the_quarantined_and_the_forgotten(federation):
    workdir, run, _ = federation
    clients = answer(fedbayes(["clients", str(workdir), "--json"]))
    by_id = {client["client"]: client for client in clients["clients"]}
    assert sorted(by_id) == ["client-0", "client-1", "client-2"]
    kept, forgotten, refused = by_id["client-0"], by_id["client-1"], by_id["client-2"]
    assert kept["bound"] and kept["rounds_accepted"] == 3 and kept["accepted_rounds"] == [[1, 3]]
    assert kept["last_accepted_round"] == 3 and not kept["forgotten"] and kept["quarantined_until"] is None
    assert forgotten["forgotten"] and not forgotten["bound"] and forgotten["rounds_accepted"] == 0
    assert [(record["client"], record["round"]) for record in clients["forgotten"]] == [("client-1", 3)]
    assert not refused["bound"] and refused["rounds_accepted"] == 0 and refused["last_seen_round"] == 2
    assert refused["quarantined_until"] == 2 + QUARANTINE_ROUNDS
    assert [(entry["client"], entry["until_round"]) for entry in clients["quarantined_nodes"]] == [
        ("client-2", 2 + QUARANTINE_ROUNDS)
    ]
    assert run.rows[1]["quarantined"] == [f"node {refused['node']}"]  # an id never bound is no node's
    text = fedbayes(["clients", str(workdir)]).stdout
    assert f"{refused['node']} (unbound)" in text and "forgotten: client-1 after round 3 (request " in text


def test_runs_lists_each_workdir_and_names_the_damaged_one(federation):
    workdir, _, _ = federation
    listed = fedbayes(["runs", str(workdir.parent)])
    assert listed.returncode == 1, "a workdir that cannot be read makes the listing exit 1"
    assert f"fedbayes: error: {workdir.parent / 'broken' / 'run-config.toml'}: cannot read a run config: " in (
        listed.stderr
    )
    lines = [line.split() for line in listed.stdout.splitlines()]
    assert lines[0] == ["run", "strategy", "rounds", "status", "accuracy", "nll"]
    assert lines[1][:4] == ["broken", "?", "?", "unreadable"]
    assert lines[2][:4] == ["fed", "bayesadmm", "3/3", "finished"]
    summaries = json.loads(fedbayes(["runs", str(workdir.parent), "--json"]).stdout)
    assert [summary["name"] for summary in summaries] == ["broken", "fed"]
    assert "cannot read a run config" in summaries[0]["error"]
    assert summaries[1]["status"] == "finished" and summaries[1]["metrics"]["round"] == 3
