"""The networked BayesADMM server half: membership semantics, the dual consistency check, and the local posteriors it
keeps for `forget` (as its step used them, through a checkpoint file)."""

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.strategies import run_settings
from fedbayes.strategies.bayesadmm.math import (
    Duals,
    bounded_influence,
    dual_step,
    prior_weight,
    server_step,
    tempered_duals,
)
from fedbayes.strategies.bayesadmm.server import BayesADMM
from tests.support import DEFAULTS, FakeGrid, answers, reply_envelope, round_core

LAYOUT = {"w": (2,)}
BAYESADMM = {**DEFAULTS, "strategy": "bayesadmm"}  # a BayesADMM server reads the run's strategy's keys


def reply(client, server_round, mean, precision, global_, resumed_from, previous=None, gamma=0.2e-3, sent_duals=None):
    """A client's honest reply, or one whose duals are `sent_duals` instead of the dual step's."""
    local = Gaussian(torch.tensor(mean, dtype=torch.float64), torch.tensor(precision, dtype=torch.float64))
    start = previous or Duals(torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    duals = dual_step(start, local, global_, gamma, server_round)
    envelope = reply_envelope(client, server_round, 10, resumed_from_round=resumed_from)
    as_arrays = lambda t: {"w": t.numpy().astype(np.float32)}  # noqa: E731
    sent = sent_duals or duals
    content = encode(
        envelope,
        pb.BayesADMMReply(),
        {
            "local_mean": as_arrays(local.mean),
            "local_precision": as_arrays(local.precision),
            "dual_mean": as_arrays(sent.mean),
            "dual_precision": as_arrays(sent.precision),
        },
    )
    return content, local, duals


def strategy():
    """A BayesADMM server in its round core after round 1 was configured, and its hyperparameters (the defaults:
    rho 0.2, damping 1e-3 -> gamma 2e-4)."""
    core = round_core(BayesADMM(run_settings(BAYESADMM), LAYOUT))
    core.configure(1, ArrayRecord({"w": Array(np.array([0.5, -0.5], np.float32))}), FakeGrid([1, 2]))
    return core, core.strategy.hyperparameters


def test_mean_over_repliers_sum_over_all_known_clients_and_join():
    server, settings = strategy()
    global_1 = server.strategy.global_
    a1, local_a1, duals_a1 = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    b1, local_b1, duals_b1 = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    server.aggregate(*answers(server, 1, {1: a1, 2: b1}))
    expected = server_step([local_a1, local_b1], [duals_a1, duals_b1], settings.rho, settings.prior_precision)
    torch.testing.assert_close(server.strategy.global_.mean, expected.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(server.strategy.global_.precision, expected.precision, rtol=1e-5, atol=1e-6)
    # Round 2: only "a" replies, "c" joins. Mean over {a, c}; sums over {a, b, c}; K = 3.
    global_2 = server.strategy.global_
    a2, local_a2, duals_a2 = reply("a", 2, [1.5, 1.0], [6.0, 6.0], global_2, 1, previous=duals_a1)
    c2, local_c2, duals_c2 = reply("c", 2, [0.0, 1.0], [4.0, 9.0], global_2, 0)
    report = server.aggregate(*answers(server, 2, {1: a2, 3: c2})).report
    assert report.rejected == {} and report.fresh_starts == []
    expected = server_step([local_a2, local_c2], [duals_a2, duals_b1, duals_c2], settings.rho, settings.prior_precision)
    assert sorted(server.strategy.state.duals) == ["a", "b", "c"]
    torch.testing.assert_close(server.strategy.global_.mean, expected.mean, rtol=1e-5, atol=1e-6)
    alpha = 1 / (1 + settings.rho * 3)
    sum_u = duals_a2.precision + duals_b1.precision + duals_c2.precision
    mean_s = (local_a2.precision + local_c2.precision) / 2
    torch.testing.assert_close(
        server.strategy.global_.precision,
        (1 - alpha) * mean_s + alpha * (settings.prior_precision + sum_u),
        rtol=1e-5,
        atol=1e-6,
    )


def test_lost_client_state_is_reported_and_the_clients_duals_are_used(caplog):
    server, _ = strategy()
    a1, _, _ = reply("a", 1, [1.0, 2.0], [5.0, 6.0], server.strategy.global_, 0)
    server.aggregate(*answers(server, 1, {1: a1}))
    # "a" comes back with fresh duals (resumed from round 0) although the server knows round 1.
    a2, _, fresh = reply("a", 2, [1.0, 1.0], [5.0, 5.0], server.strategy.global_, 0)
    with caplog.at_level(logging.WARNING):
        report = server.aggregate(*answers(server, 2, {1: a2})).report
    assert report.fresh_starts == ["a"]
    assert "client 'a' lost its state of round 1; it starts again from zero duals" in caplog.text
    torch.testing.assert_close(server.strategy.state.duals["a"].mean, fresh.mean, rtol=1e-6, atol=1e-9)


def test_clients_that_add_no_precision_are_reported_and_warned_of_and_the_round_goes_on(caplog):
    server, _ = strategy()
    a1, _, duals_a1 = reply("a", 1, [1.0, 2.0], [50.0, 60.0], server.strategy.global_, 0)
    with caplog.at_level(logging.WARNING):
        outcome = server.aggregate(*answers(server, 1, {1: a1}))
    # shares (50 - 1)/1 and (60 - 1)/1 over δ = 1; the median of two is the lower (torch.median)
    assert outcome.metrics["client-precision-share"] == pytest.approx(49.0, rel=1e-5)
    assert outcome.report.warnings == []
    # Round 2: the client comes back with q̄'s own precision, as a client whose IVON Hessian restarted at 0 and
    # hardly grew does: it added nothing, and S̄ falls.
    global_2 = server.strategy.global_
    a2, _, _ = reply("a", 2, [1.0, 2.0], global_2.precision.tolist(), global_2, 1, previous=duals_a1)
    with caplog.at_level(logging.WARNING):
        outcome = server.aggregate(*answers(server, 2, {1: a2}))
    assert outcome.arrays is not None and outcome.report.rejected == {}
    assert abs(outcome.metrics["client-precision-share"]) < 1e-6
    assert "round 2: the clients added 0.0% to q̄'s precision" in caplog.text
    (warning,) = outcome.report.warnings  # what the results row carries and `fedbayes local` prints
    assert warning.startswith("the clients added 0.0% to q̄'s precision")
    assert "shrinks to about 0.167 of itself a round" in caplog.text  # 1 - α, α = 1/(1 + ρK) with ρ = 0.2, K = 1
    assert float(server.strategy.global_.precision.median()) < float(global_2.precision.median())


def test_tampered_duals_are_rejected_and_leave_no_trace():
    server, _ = strategy()
    global_1 = server.strategy.global_
    _, _, honest = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    tampered = Duals(torch.tensor([123.0, 0.0], dtype=torch.float64), honest.precision)
    a1, _, _ = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0, sent_duals=tampered)
    outcome = server.aggregate(*answers(server, 1, {1: a1}))
    assert outcome.arrays is None and outcome.metrics is None
    reason = outcome.report.rejected["client 'a' (node 1)"]
    assert "field 'dual_mean': differs from the server's replay of the dual step" in reason
    assert server.strategy.state.duals == {} and server.accepted_rounds == {} and server.identities.node_of_client == {}
    assert server.strategy.global_ is global_1


def test_a_non_positive_local_precision_is_rejected_and_the_round_goes_on():
    server, settings = strategy()
    global_1 = server.strategy.global_
    bad, _, _ = reply("a", 1, [1.0, 2.0], [-50.0, 6.0], global_1, 0)
    good, local_b, duals_b = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    report = server.aggregate(*answers(server, 1, {1: bad, 2: good})).report
    assert "1 precisions are <= 0" in report.rejected["client 'a' (node 1)"]
    assert report.accepted == ["b"] and sorted(server.strategy.state.duals) == ["b"]
    expected = server_step([local_b], [duals_b], settings.rho, settings.prior_precision)
    torch.testing.assert_close(server.strategy.global_.mean, expected.mean, rtol=1e-5, atol=1e-6)


def test_a_restored_server_continues_exactly_like_the_original():
    """state_dict() after round 1, restored into a new round core (a restarted server), then round 2 on
    both: the same q̄ and the same duals, bit for bit; the restored one also checks round-2 duals."""
    original, _ = strategy()
    global_1 = original.strategy.global_
    a1, _, duals_a1 = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    b1, _, _ = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    original.aggregate(*answers(original, 1, {1: a1, 2: b1}))
    restored = round_core(BayesADMM(run_settings(BAYESADMM), LAYOUT))
    restored.load_state_dict(original.state_dict())
    a2, _, _ = reply("a", 2, [1.5, 1.0], [6.0, 6.0], original.strategy.global_, 1, previous=duals_a1)
    for server in (original, restored):
        server.aggregate(*answers(server, 2, {1: a2}))
    assert torch.equal(original.strategy.global_.mean, restored.strategy.global_.mean)
    assert torch.equal(original.strategy.global_.precision, restored.strategy.global_.precision)
    assert original.strategy.state.duals.keys() == restored.strategy.state.duals.keys() == {"a", "b"}
    for client in ("a", "b"):
        assert torch.equal(original.strategy.state.duals[client].mean, restored.strategy.state.duals[client].mean)
        assert original.strategy.state.duals[client].round == restored.strategy.state.duals[client].round


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"model": "mlp"}, "needs model=logreg"),
        ({"model": "logreg", "pool": 1}, "pool=4"),  # 7850 parameters: a 7850 x 7850 precision per message
    ],
)
def test_full_covariance_refuses_models_it_cannot_carry(overrides, problem):
    from fedbayes.bayes.params import parameter_layout
    from fedbayes.strategies import get_algorithm
    from fedbayes.tasks.config import ConfigError
    from fedbayes.tasks.models import build_model

    settings = run_settings({**DEFAULTS, "strategy": "bayesadmm-full", **overrides})
    model = build_model(settings.model, (1, 28, 28), 10, pool=settings.pool)
    with pytest.raises(ConfigError, match=problem):
        get_algorithm("bayesadmm-full").build_server(settings, parameter_layout(model))


def two_rounds_with_a_join():
    """Round 1: a and b reply; round 2: a and c (c joins), b does not. Returns the round core and, per client, its last
    reply's local posterior as sent (float32 values), its round and the q̄ it was fitted against."""
    server, _ = strategy()
    global_1 = server.strategy.global_
    a1, local_a1, duals_a1 = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    b1, local_b1, _ = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    server.aggregate(*answers(server, 1, {1: a1, 2: b1}))
    global_2 = server.strategy.global_
    a2, local_a2, _ = reply("a", 2, [1.5, 1.0], [6.0, 6.0], global_2, 1, previous=duals_a1)
    c2, local_c2, _ = reply("c", 2, [0.0, 1.0], [4.0, 9.0], global_2, 0)
    assert server.aggregate(*answers(server, 2, {1: a2, 3: c2})).report.rejected == {}
    return server, {"a": (local_a2, 2, global_2), "b": (local_b1, 1, global_1), "c": (local_c2, 2, global_2)}


def test_the_server_keeps_each_clients_last_local_posterior_and_its_round():
    """What `forget` redoes the last server step with: every client's local posterior of its last accepted round,
    exactly as the server step used it (no `clip` here: as the client sent it), with that round; a client that did
    not reply keeps its older one. Redone with nobody left out, round 2's step gives q̄ again."""
    server, expected = two_rounds_with_a_join()
    held = server.strategy.state.local_posteriors
    assert sorted(held) == ["a", "b", "c"]
    for client, (local, server_round, _) in expected.items():
        assert torch.equal(held[client].mean, local.mean) and torch.equal(held[client].precision, local.precision)
        assert held[client].round == server_round == server.strategy.state.duals[client].round
    settings = server.strategy.hyperparameters
    redone = server_step(
        [held["a"].gaussian(), held["c"].gaussian()],
        list(server.strategy.state.duals.values()),
        settings.rho,
        settings.prior_precision,
    )
    torch.testing.assert_close(server.strategy.global_.mean, redone.mean, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(server.strategy.global_.precision, redone.precision, rtol=1e-6, atol=0)


def test_the_clients_shares_add_up_to_q_with_a_join_and_a_client_that_did_not_reply():
    """What `forget` takes out: each known client's share of q̄ (`shares_step`). Over round 1 (a, b; K = 2) and round 2
    (a and c; c joins, b does not reply; K = 3) they add up, with the initial q̄'s part Π(1-α) and the prior's, to q̄
    in natural parameters: the server steps are linear in every client's duals and local posterior. b's share decays
    by (1-α) and gains α times its duals; c's starts in round 2."""
    server, expected = two_rounds_with_a_join()
    strategy_ = server.strategy
    hp, shares = strategy_.hyperparameters, strategy_.state.shares
    assert sorted(shares) == ["a", "b", "c"] and {c.round for c in shares.values()} == {2}
    initial = expected["b"][2]  # q̄ of round 1, before any step
    alpha_1, alpha_2 = prior_weight(hp.rho, 2), prior_weight(hp.rho, 3)
    initial_part = (1 - alpha_1) * (1 - alpha_2)
    prior_part = hp.prior_precision * (alpha_1 * (1 - alpha_2) + alpha_2)
    eta, _ = strategy_.global_.natural()
    torch.testing.assert_close(
        eta, initial_part * initial.natural()[0] + sum(c.mean for c in shares.values()), rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(
        strategy_.global_.precision,
        initial_part * initial.precision + prior_part + sum(c.precision for c in shares.values()),
        rtol=1e-6,
        atol=1e-6,
    )
    # round 1: K = R = 2, so b's term is U_b + ρ (S_b - S̄); round 2: b did not reply, its term is U_b alone
    b_after_round_1 = alpha_1 * (
        strategy_.state.duals["b"].precision + hp.rho * (expected["b"][0].precision - initial.precision)
    )
    torch.testing.assert_close(
        shares["b"].precision,
        (1 - alpha_2) * b_after_round_1 + alpha_2 * strategy_.state.duals["b"].precision,
        rtol=1e-9,
        atol=1e-12,
    )


def test_a_server_without_shares_does_not_start_them_midway():
    """Shares add up to q̄ only when kept from round 1: a server whose state has duals but no shares (a checkpoint
    from before they were kept) keeps none in later rounds, and `forget` takes its other estimates."""
    server, _ = two_rounds_with_a_join()
    held = server.strategy
    held.commit(replace(held.state, shares={}))
    a3, _, _ = reply("a", 3, [1.0, 1.0], [6.0, 6.0], held.global_, 2, previous=held.state.duals["a"])
    report = server.aggregate(*answers(server, 3, {1: a3})).report
    assert report.rejected == {} and held.state.duals["a"].round == 3 and held.state.shares == {}
    assert held.forget("b").note.startswith("round 3's server step (Eqs. 37-38) redone without 'b'")


def test_under_clip_the_server_keeps_the_local_posteriors_as_its_step_moved_them():
    """`robust-aggregation = clip` moves each local posterior towards q̄ before the server step (bounded_influence):
    the server keeps the moved one, so the step redone from what it keeps (with the duals tempered as it tempers
    them) gives q̄ again; an outlier's kept local is not the one it sent."""
    settings = run_settings({**BAYESADMM, "robust-aggregation": "clip", "clip-ratio": 1.0})
    server = round_core(BayesADMM(settings, LAYOUT))
    server.configure(1, ArrayRecord({"w": Array(np.array([0.5, -0.5], np.float32))}), FakeGrid([1, 2, 3]))
    global_1 = server.strategy.global_
    sent = {
        "a": reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0),
        "b": reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0),
        "c": reply("c", 1, [40.0, -30.0], [9.0, 3.0], global_1, 0),  # far from the others
    }
    report = server.aggregate(
        *answers(server, 1, {node: content for node, (content, _, _) in enumerate(sent.values(), 1)})
    ).report
    assert report.accepted == ["a", "b", "c"]
    held = server.strategy.state.local_posteriors
    moved, _ = bounded_influence(
        [local for _, local, _ in sent.values()], [duals for _, _, duals in sent.values()], global_1, 1.0
    )
    for client, local in zip(sent, moved):
        torch.testing.assert_close(held[client].mean, local.mean, rtol=1e-6, atol=1e-7)
    assert (held["c"].mean - sent["c"][1].mean).abs().max() > 1.0
    hp = server.strategy.hyperparameters
    redone = server_step(
        [q.gaussian() for q in held.values()],
        tempered_duals(list(server.strategy.state.duals.values()), 1.0),
        hp.rho,
        hp.prior_precision,
    )
    torch.testing.assert_close(server.strategy.global_.mean, redone.mean, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(server.strategy.global_.precision, redone.precision, rtol=1e-6, atol=0)


def test_the_local_posteriors_and_shares_survive_a_checkpoint_file_and_forget_gives_the_same_after_it(tmp_path):
    """Through a real checkpoint file (safetensors, checksum): every client's local posterior, share and round back
    as they were, and `forget` on the restored server gives the original's result, bit for bit."""
    original, _ = two_rounds_with_a_join()
    weights = original.strategy.global_.mean.numpy().astype(np.float32)
    CheckpointStore(tmp_path, "fed", DEFAULTS).save(Checkpoint(2, {"w": weights}, original.state_dict(), 1.0))
    restored = round_core(BayesADMM(run_settings(BAYESADMM), LAYOUT))
    restored.load_state_dict(CheckpointStore(tmp_path, "fed", DEFAULTS).load().strategy_state)
    for held in ("local_posteriors", "shares"):
        mine, theirs = getattr(original.strategy.state, held), getattr(restored.strategy.state, held)
        assert mine.keys() == theirs.keys() == {"a", "b", "c"}
        for client in mine:
            assert torch.equal(mine[client].mean, theirs[client].mean)
            assert torch.equal(mine[client].precision, theirs[client].precision)
            assert mine[client].round == theirs[client].round
    before, after = original.strategy.forget("a"), restored.strategy.forget("a")
    np.testing.assert_array_equal(before.weights, after.weights)
    assert before.note == after.note and before.note.startswith("q̄ less 'a''s share of it")
