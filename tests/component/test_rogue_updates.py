"""Well-formed but hostile updates against every strategy, in one process (issue: one client could end any run or
poison the checkpoint). A registered client (node 1, client-1) turns rogue in round 2 and sends a reply that passes
the codec and, where the strategy replays the client's state, is consistent with it. Each time the round must be
committed from the honest clients, bit-equal to a control server that only saw them, and the rogue refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import Error
from flwr.common.constant import ErrorCode

from fedbayes.protos.codec import encode
from fedbayes.server.round_core import CORE_STATE_KEY
from fedbayes.strategies.feddyn import client as feddyn_client
from fedbayes.strategies.feddyn import math as feddyn
from tests.support import FakeGrid, InProcessFederation, declared_payload, envelope_of, reply_message, rogue, round_core
from tests.support.rogue import (
    SIZES,
    UPDATE_GROUP,
    RogueRound,
    assert_rejected_without_trace,
    envelope_message,
    overrides,
)

STRATEGIES = [name for name in UPDATE_GROUP if "dsvgd" not in name] + ["p-dsvgd"]


def consistent_reply(game: RogueRound, node: int, change) -> object:
    """Node `node`'s honest round-2 reply with `change(group, name, array)` applied, consistently
    (tests/support/rogue.py)."""
    return rogue.consistent_reply(game.federation.server, game.replies[node], change, 2)


def scaled_update(game: RogueRound, node: int, factor: float):
    """Node `node`'s round-2 reply with its update (from what the server sent) multiplied by `factor`."""
    server, layout = game.federation.server, game.federation.layout
    group = UPDATE_GROUP[server.settings.strategy]
    reference = rogue.sent_reference(server, layout, f"client-{node}")
    return consistent_reply(game, node, rogue.scaled_update(reference, group, factor))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_an_update_of_1e30_is_refused_by_the_screen_and_the_round_goes_on(tmp_path, strategy):
    game = RogueRound(tmp_path, strategy)
    server, result, expected = game.aggregate(
        {1: consistent_reply(game, 1, rogue.filled(UPDATE_GROUP[strategy], 1e30))}, honest_nodes=[2, 3]
    )
    assert_rejected_without_trace(
        server, result, expected, game.control, "client 'client-1' (node 1)", "refused by the screen"
    )


@pytest.mark.parametrize("strategy", ["fedavg", "feddyn", "fedpa", "bayesadmm", "fedlap-cov", "p-dsvgd"])
def test_an_ordinary_update_scaled_a_millionfold_is_refused_by_the_screen(tmp_path, strategy):
    game = RogueRound(tmp_path, strategy)
    server, result, expected = game.aggregate({1: scaled_update(game, 1, 1e6)}, honest_nodes=[2, 3])
    assert_rejected_without_trace(
        server, result, expected, game.control, "client 'client-1' (node 1)", "refused by the screen"
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_honest_replies_all_pass_the_screen(tmp_path, strategy):
    game = RogueRound(tmp_path, strategy)
    server, result, expected = game.aggregate({})
    assert result.report.rejected == {} and result.report.accepted == ["client-1", "client-2", "client-3"]


def test_the_dual_replay_is_checked_per_entry_so_one_huge_entry_hides_nothing(tmp_path):
    """One local precision entry of 3e38 made the old per-tensor tolerance ~6e30 for every other entry."""
    game = RogueRound(tmp_path, "bayesadmm")
    honest = consistent_reply(game, 1, lambda g, name, value: value)
    tensors = declared_payload(honest, game.reply_type).tensors
    message = envelope_message(honest, game.reply_type)
    first = next(iter(tensors["local_precision"]))
    tensors["local_precision"][first].flat[0] = 3e38
    tensors["dual_precision"][first].flat[0] = 3e38 * 2e-4  # about γ·3e38: any value, the check is per entry
    tensors["dual_mean"][first].flat[1] += 1e3  # far outside its own entry's tolerance
    server, result, expected = game.aggregate({1: encode(envelope_of(honest), message, tensors)}, honest_nodes=[2, 3])
    assert_rejected_without_trace(
        server,
        result,
        expected,
        game.control,
        "client 'client-1' (node 1)",
        "field 'dual_mean': differs from the server's replay",
    )


def test_a_global_precision_that_is_not_positive_definite_is_a_rejected_round_not_a_linalg_error(tmp_path):
    """bayesadmm-full solved with S̄ before checking it was positive definite: duals that make S̄ singular raised
    LinAlgError inside absorb. (Consistent duals cannot make S̄ singular any more, the replay being per entry: the
    hook is called directly here.)"""
    from fedbayes.strategies.base import RoundRejected

    game = RogueRound(tmp_path, "bayesadmm-full")
    server = game.federation.server
    payload = declared_payload(game.replies[1], game.reply_type)
    payload.tensors["dual_precision"] = {"matrix": -1e9 * np.eye(server.size, dtype=np.float32)}
    with pytest.raises(RoundRejected, match="not be positive definite"):
        server.absorb([payload], 2)


@pytest.mark.parametrize(
    "strategy, group, value, extra",
    [
        ("fedlap", "site_mean", 3.4e38, {"prior-precision": 0.5}),  # float64 finite, inf once stored as float32
        ("fedpa", "delta", -3.4e38, {"server-lr": 10.0}),
        ("p-dsvgd", "local_particles", 1e30, {}),
    ],
)
def test_nothing_non_finite_is_committed_when_the_screen_lets_it_through(tmp_path, strategy, group, value, extra):
    game = RogueRound(tmp_path, strategy, **{"screen-ratio": 1e300, **extra})
    server, result, expected = game.aggregate(
        {1: consistent_reply(game, 1, rogue.filled(group, value))}, honest_nodes=[2, 3]
    )
    assert_rejected_without_trace(
        server, result, expected, game.control, "client 'client-1' (node 1)", "would be unusable"
    )
    state = server.state_dict()
    assert all(np.isfinite(tensor).all() for tensor in state.tensors.values())


def test_two_rogues_whose_replies_only_overflow_together_are_isolated(tmp_path):
    """FedLap: each rogue's site alone is usable, both together are not (Σ_k v_k past float32): the search leaves
    out one and commits a usable state with client-3 in it."""
    game = RogueRound(tmp_path, "fedlap", **{"screen-ratio": 1e300})
    rogues = {node: consistent_reply(game, node, rogue.filled("site_mean", 2e38)) for node in (1, 2)}
    server, result, _ = game.aggregate(rogues, honest_nodes=[3])
    report = result.report
    assert "client-3" in report.accepted and len(report.accepted) == 2
    assert "with it the round's state would be unusable" in report.rejected["client 'client-1' (node 1)"]
    arrays = result.arrays
    assert all(np.isfinite(arrays[name].numpy()).all() for name in arrays)


def model_move(tmp_path, strategy: str, factor: float, **config) -> float:
    """How far round 2 moves the global model when client-1 scales its update by `factor` (consistently) and
    clients 2-3 are honest."""
    game = RogueRound(tmp_path, strategy, **config)
    before = {name: game.federation.arrays[name].numpy() for name in game.federation.layout}
    outcome = game.federation.core.aggregate(
        game.plan,
        [
            reply_message(scaled_update(game, 1, factor), 1),
            *(reply_message(game.replies[node], node) for node in (2, 3)),
        ],
    )
    assert outcome.report.accepted == ["client-1", "client-2", "client-3"]
    return sum(float(np.abs(outcome.arrays[name].numpy() - before[name]).sum()) for name in before)


@pytest.mark.parametrize("rule", ["clip", "median", "trimmed-mean"])
@pytest.mark.parametrize("strategy", ["fedavg", "feddyn", "fedpa"])
def test_robust_rules_bound_an_update_the_screen_lets_through(tmp_path, strategy, rule):
    """A rogue scaling its update 50x (under the screen's 100x): with a robust rule the new global model stays
    near where the honest updates put it, unlike with the plain mean."""
    trim = {"trim-fraction": 0.34}  # 3 replies: trim one a side
    assert model_move(tmp_path / rule, strategy, 50.0, **{"robust-aggregation": rule, **trim}) < 0.5 * model_move(
        tmp_path / "none", strategy, 50.0, **trim
    )


@pytest.mark.parametrize("strategy", ["bayesadmm", "fedlap-cov"])
def test_bounded_influence_tempers_a_site_or_dual_the_screen_lets_through(tmp_path, strategy):
    assert model_move(
        tmp_path / "clip", strategy, 30.0, **{"robust-aggregation": "clip", "clip-ratio": 1.0}
    ) < 0.5 * model_move(tmp_path / "none", strategy, 30.0)


@pytest.mark.parametrize(
    "strategy, rule", [("bayesadmm", "median"), ("fedlap", "trimmed-mean"), ("dsvgd", "clip"), ("p-dsvgd", "median")]
)
def test_a_robust_rule_a_strategy_does_not_implement_is_refused_at_construction(tmp_path, strategy, rule):
    from fedbayes.tasks.config import ConfigError

    with pytest.raises(ConfigError, match=f"'robust-aggregation' = '{rule}': strategy '{strategy}' implements"):
        InProcessFederation(tmp_path, {**overrides(strategy), "robust-aggregation": rule}, sizes=SIZES)


def test_feddyn_refuses_a_client_whose_lambda_differs_from_the_servers_replay(tmp_path):
    """client-1's stored λ_k is edited (x1000) between rounds: its round-2 sketch no longer matches the server's
    replay, and its reply is refused; the others are committed."""
    federation = InProcessFederation(tmp_path, overrides("feddyn"), sizes=SIZES)
    federation.round(1, [1, 2, 3])
    store = federation.runtimes[1].state_store("fed")
    state = store.load(1, for_round=2)
    state.tensors[feddyn_client.LAMBDA_KEY] = state.tensors[feddyn_client.LAMBDA_KEY] * 1000
    store.save(state, 1, accepted_round=1)
    federation.round(2, [1, 2, 3])
    report = federation.report
    assert report.accepted == ["client-2", "client-3"]
    assert (
        "field 'lambda_sketch': the client's λ_k differs from the server's replay"
        in report.rejected["client 'client-1' (node 1)"]
    )


def test_feddyn_sketches_agree_bit_for_bit_over_rounds(tmp_path):
    federation = InProcessFederation(tmp_path, overrides("feddyn"), sizes=SIZES)
    for server_round in (1, 2, 3):
        federation.round(server_round, [1, 2, 3])
        assert federation.report.accepted == ["client-1", "client-2", "client-3"]


def test_lambda_sketch_is_linear_and_seeded(tmp_path):
    lam = torch.randn(50, dtype=torch.float64)
    twice = feddyn.lambda_sketch(2 * lam, seed=3, server_round=4)
    torch.testing.assert_close(twice, 2 * feddyn.lambda_sketch(lam, seed=3, server_round=4))
    assert not torch.equal(feddyn.lambda_sketch(lam, 3, 4), feddyn.lambda_sketch(lam, 3, 5))
    assert feddyn.sketch_mismatch(feddyn.lambda_sketch(lam, 3, 4), lam, 3, 4) == 0.0


def test_dsvgd_never_starves_the_others_for_a_node_it_never_accepts(tmp_path):
    """Node 99 replies every time it is scheduled, always refused: it is scheduled once as new, then takes its turn
    after the known clients, then sits out its quarantine; clients 1-3 keep their turns."""
    federation = InProcessFederation(
        tmp_path, {**overrides("dsvgd"), "max-client-rejections": 2, "quarantine-rounds": 3}, sizes=SIZES
    )
    core, schedule = federation.core, []
    for server_round in range(1, 11):
        plan = core.configure(server_round, federation.arrays, FakeGrid([1, 2, 3, 99]))
        messages = plan.messages
        (message,) = messages
        node = message.metadata.dst_node_id
        schedule.append(node)
        if node == 99:
            reply = federation.client_update(message.content, federation.runtimes[1])  # client-1's, as client-1
        else:
            reply = federation.client_update(message.content, federation.runtimes[node])
        arrays = core.aggregate(plan, [reply_message(reply, node)]).arrays
        federation.arrays = arrays if arrays is not None else federation.arrays
    assert schedule[:3] == [1, 2, 3]  # new nodes first, in node order
    assert schedule.count(99) == 2 and 99 not in schedule[schedule.index(99) + 1 :][:1]
    second = [i for i, node in enumerate(schedule) if node == 99][1]
    assert 99 not in schedule[second + 1 : second + 4]  # quarantined for 3 rounds after its second refusal
    assert all(schedule.count(node) >= 2 for node in (1, 2, 3))


def test_the_quarantine_survives_a_server_restart(tmp_path):
    game = RogueRound(tmp_path, "fedavg", **{"max-client-rejections": 1})
    server, result, _ = game.aggregate(
        {1: consistent_reply(game, 1, rogue.filled("weights", 1e30))}, honest_nodes=[2, 3]
    )
    assert result.report.quarantined == {"client 'client-1' (node 1)": 12}
    restarted = round_core(type(server.strategy)(server.settings, server.strategy.layout))
    restarted.load_state_dict(server.state_dict())
    assert restarted.quarantine.until == {1: 12}
    assert json.loads(server.state_dict().metadata[CORE_STATE_KEY])["quarantine"]["until"] == {"1": 12}
    assert 1 not in restarted.node_pool(FakeGrid([1, 2, 3]), 3).eligible


@pytest.mark.parametrize(
    "code, quarantined", [(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, True), (ErrorCode.NODE_UNAVAILABLE, False)]
)
def test_a_node_that_is_offline_is_absent_not_refused(tmp_path, code, quarantined):
    """Three rounds of error replies: a client's own errors quarantine its node; the SuperLink's word that the node
    is offline (its SuperNode restarting) does not."""
    federation = InProcessFederation(tmp_path, {**overrides("fedavg"), "max-client-rejections": 3}, sizes=SIZES)
    core = federation.core
    for server_round in (1, 2, 3):
        plan = core.configure(server_round, federation.arrays, FakeGrid([1, 2, 3]))
        messages = plan.messages
        replies = [reply_message(None, 1, Error(code=code, reason="gone"))] + [
            reply_message(
                federation.client_update(m.content, federation.runtimes[m.metadata.dst_node_id]), m.metadata.dst_node_id
            )
            for m in messages
            if m.metadata.dst_node_id != 1
        ]
        outcome = core.aggregate(plan, replies)
        federation.arrays = outcome.arrays
    assert bool(outcome.report.quarantined) == quarantined
