"""Replies bound to the instruction they answer (Header.nonce), for every strategy family, in one process: real client
halves, real encoded payloads. A client's own earlier reply sent again in a later round, its round edited to the
current one, is refused by the round core and leaves no trace (the state is a control server's that never saw it); so
is a reply carrying another node's nonce, a leave request answering no instruction, and a reply to the instruction of
a server that has since been restarted from its checkpoint. Honest replies pass."""

from __future__ import annotations

import copy

import pytest

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import NONCE_BYTES, decode_header, encode, reply_header, with_envelope
from fedbayes.server.round_core import RoundCore
from fedbayes.strategies import get_algorithm
from tests.support import FakeGrid, InProcessFederation, answering, envelope_of, reply_message
from tests.support.rogue import SIZES, assert_same_state, overrides

FAMILIES = ["fedavg", "fedprox", "feddyn", "fedlap", "fedlap-cov", "fedpa", "bayesadmm", "dsvgd", "p-dsvgd"]
NONCE_REFUSAL = "field 'header.nonce': not the nonce of the server's last message to node"
REPLAYER = 1


def federation(tmp_path, strategy: str) -> InProcessFederation:
    return InProcessFederation(tmp_path, {**overrides(strategy), "fraction-train": 1.0}, sizes=SIZES)


def with_round(content, server_round: int):
    """`content` as it was sent, but for its round, edited to `server_round`: a recorded reply replayed."""
    envelope = envelope_of(content)
    envelope.header.server_round = server_round
    return with_envelope(content, envelope)


def nonce_of(message) -> bytes:
    return decode_header(message.content, "server").nonce


def until_the_replayer_is_asked_again(run: InProcessFederation, nodes: list[int]):
    """Honest rounds until node REPLAYER is sent work a second time (DSVGD schedules one node a round): its first
    reply, and that later round (its plan and node -> instruction), configured and not yet aggregated."""
    recorded = None
    for server_round in range(1, 2 * len(nodes) + 2):
        plan = run.core.configure(server_round, run.arrays, FakeGrid(nodes))
        messages = plan.messages
        sent = {message.metadata.dst_node_id: message for message in messages}
        if recorded is not None and REPLAYER in sent:
            return recorded, plan, sent
        replies = {node: run.answer(message) for node, message in sent.items()}
        recorded = replies.get(REPLAYER, recorded)
        outcome = run.core.aggregate(plan, [reply_message(reply, node) for node, reply in replies.items()])
        run.arrays = outcome.arrays if outcome.arrays is not None else run.arrays
    raise AssertionError(f"node {REPLAYER} was not sent work twice")


def replay_round(tmp_path, strategy: str, make_rogue):
    """A federation of nodes 1-3 up to node 1's second turn, where node 1 answers with `make_rogue(the federation, its
    recorded first reply, this round, node -> instruction)` and the others honestly; aggregated by the round core and
    by a control copy that saw only the honest replies. Returns (core, control, result, expected)."""
    run = federation(tmp_path, strategy)
    recorded, plan, sent = until_the_replayer_is_asked_again(run, [1, 2, 3])
    honest = [reply_message(run.answer(message), node) for node, message in sent.items() if node != REPLAYER]
    control = copy.deepcopy(run.core)
    rogue = reply_message(make_rogue(run, recorded, plan.server_round, sent), REPLAYER)
    result = run.core.aggregate(plan, [rogue, *honest])
    expected = control.aggregate(plan, honest)
    return run.core, control, result, expected


def assert_refused_without_trace(core: RoundCore, control: RoundCore, result, expected, words: str):
    label = f"client 'client-{REPLAYER}' (node {REPLAYER})"
    assert words in result.report.rejected.get(label, ""), result.report.rejected
    assert result.report.accepted == expected.report.accepted
    assert f"client-{REPLAYER}" not in result.report.accepted
    assert (result.arrays is None) == (expected.arrays is None)
    for name in expected.arrays or {}:
        assert (result.arrays[name].numpy() == expected.arrays[name].numpy()).all(), name
    assert_same_state(core, control)


@pytest.mark.parametrize("strategy", FAMILIES)
def test_a_replayed_earlier_reply_with_its_round_edited_is_refused_and_leaves_no_trace(tmp_path, strategy):
    """Node 1 sends its first reply again at its next turn, its round edited to the current one; its client id, node,
    resumed_from_round (0: a fresh start) and tensors are those of a reply the server accepted."""
    core, control, result, expected = replay_round(
        tmp_path, strategy, lambda run, recorded, server_round, sent: with_round(recorded, server_round)
    )
    assert_refused_without_trace(core, control, result, expected, NONCE_REFUSAL)
    if strategy != "dsvgd":  # DSVGD's round has node 1 alone; in the others, the honest replies are the round
        assert expected.report.accepted == ["client-2", "client-3"]


# What refuses the same replay once it carries this round's nonce: only FedDyn's and BayesADMM's own checks of the
# client's state; the other strategies take it.
OWN_CHECK = {"feddyn": "field 'lambda_sketch'", "bayesadmm": "field 'dual_mean'"}


@pytest.mark.parametrize("strategy", FAMILIES)
def test_the_nonce_is_what_refuses_a_replay_that_the_strategy_would_take(tmp_path, strategy):
    """The guarantee's limit, and why it is needed: the same replay carrying this round's nonce (a client that rewrites
    its header fabricates its reply) meets only the other checks, and all but FedDyn's and BayesADMM's take it; what
    stops a fabricated reply is the screen and the strategies' checks (docs/guides/robustness.md)."""
    _, _, result, _ = replay_round(
        tmp_path,
        strategy,
        lambda run, recorded, server_round, sent: answering(sent[REPLAYER], with_round(recorded, server_round)),
    )
    label = f"client 'client-{REPLAYER}' (node {REPLAYER})"
    if strategy in OWN_CHECK:
        assert OWN_CHECK[strategy] in result.report.rejected[label], result.report.rejected
    else:
        assert f"client-{REPLAYER}" in result.report.accepted, result.report.rejected


@pytest.mark.parametrize("strategy", ["fedavg", "bayesadmm", "p-dsvgd"])
def test_a_reply_with_another_nodes_nonce_is_refused_and_the_honest_ones_pass(tmp_path, strategy):
    """Node 1's honest answer to this round, but carrying node 2's nonce: it answers node 2's instruction."""
    core, control, result, expected = replay_round(
        tmp_path, strategy, lambda run, recorded, server_round, sent: answering(sent[2], run.answer(sent[REPLAYER]))
    )
    assert_refused_without_trace(core, control, result, expected, f"{NONCE_REFUSAL} {REPLAYER}:")
    assert result.report.accepted == ["client-2", "client-3"]


def test_every_message_to_every_node_carries_a_nonce_of_its_own(tmp_path):
    """Per node and per message: a round's instructions, the next round's, and a message between rounds (a forget's)
    each get new random bytes, and only the last one sent to a node is taken from it."""
    run = federation(tmp_path, "fedavg")
    first = run.core.configure(1, run.arrays, FakeGrid([1, 2, 3]))
    second = run.core.configure(2, run.arrays, FakeGrid([1, 2, 3]))
    between = run.core.message_between_rounds(2, 1)
    nonces = [nonce_of(message) for message in (*first.messages, *second.messages, between)]
    assert all(len(nonce) == NONCE_BYTES for nonce in nonces) and len(set(nonces)) == len(nonces)
    replies = [reply_message(run.answer(message), message.metadata.dst_node_id) for message in second.messages]
    report = run.core.aggregate(second, replies).report
    assert report.accepted == ["client-2", "client-3"]  # node 1 was sent a message since
    assert NONCE_REFUSAL in report.rejected["client 'client-1' (node 1)"]


def test_a_leave_request_that_answers_no_instruction_of_this_round_is_refused(tmp_path):
    """A LeaveAndForget is decided only when it answers the node's instruction of this round."""
    run = federation(tmp_path, "fedavg")
    (old,) = run.core.configure(1, run.arrays, FakeGrid([1])).messages
    plan = run.core.configure(2, run.arrays, FakeGrid([1]))
    (now,) = plan.messages
    stale = encode(pb.LeaveAndForget(header=reply_header(decode_header(old.content, "server"), "client-1")), None, {})
    stale = with_round(stale, 2)
    refused = run.core.aggregate(plan, [reply_message(stale, 1)])
    assert refused.leave_requests == ()
    (reason,) = refused.report.rejected.values()
    assert reason.startswith(f"rejected leave request: {NONCE_REFUSAL} 1:"), reason
    leave = encode(pb.LeaveAndForget(header=reply_header(decode_header(now.content, "server"), "client-1")), None, {})
    assert run.core.aggregate(plan, [reply_message(leave, 1)]).leave_requests == (("client-1", 1),)


@pytest.mark.parametrize("strategy", ["fedavg", "fedlap", "p-dsvgd"])
def test_a_resumed_server_refuses_the_answers_to_its_predecessors_instructions(tmp_path, strategy):
    """A server killed after sending round 3 and resumed from its checkpoint of round 2 sends round 3 again, with new
    nonces: a client's answer to the killed server's round 3 (late, and of a state nobody uses) is refused, its
    answer to the resumed server's is taken."""
    run = federation(tmp_path, strategy)
    for server_round in (1, 2):
        plan = run.core.configure(server_round, run.arrays, FakeGrid([1, 2, 3]))
        messages = plan.messages
        run.arrays = run.core.aggregate(
            plan, [reply_message(run.answer(m), m.metadata.dst_node_id) for m in messages]
        ).arrays
    checkpoint = run.core.state_dict()
    killed = {m.metadata.dst_node_id: m for m in run.core.configure(3, run.arrays, FakeGrid([1, 2, 3])).messages}
    late = run.answer(killed[1])
    resumed = RoundCore(run.settings, get_algorithm(strategy).build_server(run.settings, run.layout))
    resumed.load_state_dict(checkpoint)
    plan = resumed.configure(3, run.arrays, FakeGrid([1, 2, 3]))
    sent = {m.metadata.dst_node_id: m for m in plan.messages}
    answers = [reply_message(late, 1)] + [reply_message(run.answer(sent[node]), node) for node in (2, 3)]
    report = resumed.aggregate(plan, answers).report
    assert report.accepted == ["client-2", "client-3"]
    assert NONCE_REFUSAL in report.rejected["client 'client-1' (node 1)"]
    assert resumed.accepted_rounds["client-1"] == 2  # still the checkpoint's: the late reply left nothing
