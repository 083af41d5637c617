"""Rogue clients over real gRPC with TLS and node authentication (loopback): every node's key is registered and
bound to its client id in the operator's client registry. Two honest clients, one honest client that is late
in round 2, and five registered but hostile nodes (spoofed id, Sybil renaming, float32 declared over unicode
bytes, 2^64 - 1 examples, a well-formed update whose mean is scaled by 1e30 with duals that agree with it) run
four BayesADMM rounds. The server keeps running, uses the honest updates, names each rogue and the field,
quarantines the rogues after three refused rounds, and its checkpoint holds nothing of the rogues; the late
client's state stays in step with the server's (it rolls back past the reply the server never used)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import safe_open

from fedbayes.client.state import ClientStateStore
from fedbayes.deploy.launcher import LocalFederation
from fedbayes.deploy.pki import init_pki, make_supernode_key
from fedbayes.server.round_core import CORE_STATE_KEY
from tests.support.processes import fault_env, processes_of, wait_for_log_lines

pytestmark = pytest.mark.integration

ROUND_TIMEOUT = 25.0
HONEST, LATE, SCALED = (0, 1), 6, 7
ATTACKS = {2: "spoof:client-0", 3: "sybil", 4: "dtype", 5: "examples", LATE: "late:2", SCALED: "mean-scale:1e30"}
ROGUES = (2, 3, 4, 5, SCALED)


def rogue_env(index: int) -> dict[str, str]:
    return fault_env("rogue", FEDBAYES_ROGUE_ATTACK=ATTACKS[index], FEDBAYES_ROGUE_DELAY=str(ROUND_TIMEOUT + 5))


def test_rogue_clients_over_tls_with_node_auth(tmp_path):
    workdir, results = tmp_path / "fed", tmp_path / "results.jsonl"
    tls = init_pki(tmp_path / "pki", ips=["127.0.0.1"])
    clients = range(8)
    keys = {index: make_supernode_key(tmp_path / "pki" / "supernodes", f"client-{index}") for index in clients}
    config = {
        "strategy": "bayesadmm",
        "num-server-rounds": 4,
        "federation": "rogues",
        "fraction": 0.05,
        "local-epochs": 1,
        "lr": 5e-5,
        "input-scale": 255.0,
        "ensemble-samples": 0,
        "model": "logreg",
        "results-path": str(results),
        "wait-for-clients": 8,
        "round-timeout": ROUND_TIMEOUT,
        "straggler-wait": 0.0,  # the late reply is waited for up to round-timeout, then left out
    }
    # Eight organisations' machines, on one: no compute slots shared between them (the late one sleeps in its own).
    with LocalFederation(workdir, tls=tls, node_auth=True, parallel_tasks=0) as federation:
        registry = {f"client-{index}": federation.register(keys[index].public) for index in clients}
        (tmp_path / "registry.json").write_text(json.dumps(registry))
        for index in clients:
            federation.start_supernode(
                index, 8, auth_key=keys[index].private, extra_env=rogue_env(index) if index in ATTACKS else None
            )
        # round 1's timeout is short: every client's own executor has imported what it needs before the run starts
        for executor in federation.superexecs.values():
            wait_for_log_lines(executor, "fedbayes superexec: ready")
        rows = federation.follow(
            results,
            federation.submit({**config, "client-registry": str(tmp_path / "registry.json")}),
            4,
            on_row=lambda row: None,
        )
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    assert [row["round"] for row in rows] == [1, 2, 3, 4], "the server must keep running"
    # The rogues are refused in rounds 1-3 (max-client-rejections=3): round 4 goes to the honest three only.
    assert [row["clients_sent"] for row in rows] == [8, 8, 8, 3]
    assert len(rows[2]["quarantined"]) == len(ROGUES) and rows[0]["quarantined"] == []
    accepted = [row["clients"] for row in rows]
    assert accepted[0] == 3 and accepted[1] == 2 and 2 <= min(accepted[2:]) and max(accepted[2:]) == 3, accepted
    nll = [row["nll"] for row in rows]
    assert all(later < earlier for earlier, later in zip(nll, nll[1:])), f"the honest updates move the model: {nll}"
    node = registry  # client id -> node id
    for words in (
        f"node {node['client-2']} is client 'client-2'; it may not speak as 'client-0'",
        f"node {node['client-3']} is client 'client-3'; it may not speak as 'client-3-r1'",
        "field 'fedbayes-tensors': array data has dtype <U1, not float32",
        "field 'num_examples': 18446744073709551615 is not in [1, max-client-examples",
        f"client 'client-{SCALED}' (node {node[f'client-{SCALED}']}): refused by the screen",
        f"node {node['client-6']}: no reply within round-timeout",
    ):
        assert words in server_log, words

    # No trace of a rogue in the server's checkpoint; the late client's duals are what it will start from.
    with safe_open(workdir / "server-state" / "rogues" / "checkpoint.safetensors", framework="np") as checkpoint:
        strategy_metadata = json.loads(checkpoint.metadata()["strategy"])
        duals = {name.split("/")[2] for name in checkpoint.keys() if name.startswith("strategy/duals/")}
        late_duals = checkpoint.get_tensor(f"strategy/duals/client-{LATE}/mean")
    wire = json.loads(strategy_metadata[CORE_STATE_KEY])
    honest_ids = {"client-0", "client-1", f"client-{LATE}"}
    assert duals == set(wire["accepted_rounds"]) == set(json.loads(wire["identities"])) == honest_ids
    late_round = wire["accepted_rounds"][f"client-{LATE}"]
    stored = ClientStateStore(workdir / "client-state", "rogues", f"client-{LATE}").load(late_round, for_round=5)
    np.testing.assert_allclose(stored.tensors["dual_mean"].numpy(), late_duals, rtol=1e-6, atol=1e-9)
    # No honest client lost its state or was refused by the server's replay of it (the rows say why each was left out).
    reasons = [reason for row in rows for reason in row["rejected"].values()]
    assert not any("replay" in reason or "resumed_from_round" in reason for reason in reasons), reasons
    assert not any(row["fresh_starts"] for row in rows), rows
    assert processes_of(federation.flwr_home) == []
