"""Rogue clients against every strategy, in one process: real client halves, real encoded payloads, and one
hostile or broken reply per attack. Each time the server must keep running, use the honest clients' updates,
and end the round in exactly the state of a control server that never saw the rogue reply: no trace."""

from __future__ import annotations

import io

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict

from fedbayes.protos.codec import ENVELOPE_KEY, PACKED_ARRAY, TENSORS_KEY, encode, with_envelope
from fedbayes.strategies.bayesadmm.server import BayesADMMState
from fedbayes.strategies.feddyn.server import FedDynState
from fedbayes.strategies.fedlap.server import FedLapState
from fedbayes.strategies.fedlap_func.server import FedLapFuncState
from tests.support import FakeGrid, InProcessFederation, declared_payload, envelope_of, reply_message
from tests.support.rogue import (
    ROGUE_NODE,
    SIZES,
    RogueRound,
    assert_rejected_without_trace,
    assert_same_state,
    envelope_message,
    overrides,
)

STRATEGIES = [
    "fedavg",
    "fedprox",
    "bayesadmm",
    "fedadmm",
    "bayesadmm-full",
    "feddyn",
    "fedlap",
    "fedlap-cov",
    "fedlap-func",
    "fedpa",
    "p-dsvgd",
]


def with_header(content, message_type, **fields):
    """`content` re-enveloped with its envelope changed (header fields or the envelope's own)."""
    envelope = envelope_of(content)
    for name, value in fields.items():
        target = envelope.header if hasattr(envelope.header, name) else envelope
        setattr(target, name, value)
    return with_envelope(content, envelope)


def npy_bytes(value: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=False)
    return buffer.getvalue()


def with_array_bytes(content, data_of):
    """`content` with its packed tensors declared float32 of the right shape, but holding the bytes
    `data_of(shape)` returns: what a hostile sender controls."""
    shape = tuple(content[TENSORS_KEY][PACKED_ARRAY].shape)
    packed = Array(dtype="float32", shape=shape, stype="numpy.ndarray", data=data_of(shape))
    return RecordDict(
        {TENSORS_KEY: ArrayRecord({PACKED_ARRAY: packed}), ENVELOPE_KEY: content.config_records[ENVELOPE_KEY]}
    )


ATTACKS = {
    # name: (how the rogue reply is made from client-1's honest reply, words the rejection must contain)
    "unicode bytes declared float32": (
        lambda content, t: with_array_bytes(content, lambda shape: npy_bytes(np.full(shape, "x"))),
        "dtype <U1",
    ),
    "complex bytes declared float32": (
        lambda content, t: with_array_bytes(content, lambda shape: npy_bytes(np.zeros(shape, np.complex64))),
        "dtype complex64",
    ),
    "bool bytes declared float32": (
        lambda content, t: with_array_bytes(content, lambda shape: npy_bytes(np.zeros(shape, bool))),
        "dtype bool",
    ),
    "npz bytes": (
        lambda content, t: with_array_bytes(content, lambda shape: b"PK\x03\x04" + b"\x00" * 40),
        "unreadable array data",
    ),
    "NaN": (
        lambda content, t: with_array_bytes(content, lambda shape: npy_bytes(np.full(shape, np.nan, np.float32))),
        "NaN or Inf",
    ),
    "zero examples": (lambda content, t: with_header(content, t, num_examples=0), "'num_examples': 0 is not in"),
    "2^64-1 examples": (
        lambda content, t: with_header(content, t, num_examples=2**64 - 1),
        "'num_examples': 18446744073709551615 is not in",
    ),
    "wrong federation": (lambda content, t: with_header(content, t, federation="other"), "'header.federation'"),
    "server-only header field": (
        lambda content, t: _with_server_field(content, t, "accepted_rounds"),
        "'header.accepted_rounds': only the server sets it",
    ),
    "server-only header field (checkpoint)": (
        lambda content, t: _with_server_field(content, t, "checkpointed_rounds"),
        "'header.checkpointed_rounds': only the server sets it",
    ),
    "path in client id": (lambda content, t: with_header(content, t, client_id="../../etc"), "is not a client id"),
}


def _with_server_field(content, message_type, field_name):
    envelope = envelope_of(content)
    getattr(envelope.header, field_name)["client-2"] = 7
    return with_envelope(content, envelope)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_malformed_reply_is_rejected_alone_and_leaves_no_trace(tmp_path, strategy, attack):
    make, words = ATTACKS[attack]
    game = RogueRound(tmp_path, strategy)
    # The rogue is a fourth node speaking for a new client id (it may never speak for another's).
    rogue = with_header(game.replies[1], game.reply_type, client_id="client-9")
    if attack != "path in client id":
        rogue = make(rogue, game.reply_type)
    else:
        rogue = make(game.replies[1], game.reply_type)
    server, result, expected = game.aggregate({ROGUE_NODE: rogue})
    label = "client 'client-9' (node 99)" if attack != "path in client id" else "client '../../etc' (node 99)"
    assert_rejected_without_trace(server, result, expected, game.control, label, words)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_spoofed_client_id_is_refused_and_the_honest_client_keeps_its_state(tmp_path, strategy):
    """Node 99 replays client-1's honest reply as its own: client-1 is bound to node 1."""
    game = RogueRound(tmp_path, strategy)
    server, result, expected = game.aggregate({ROGUE_NODE: game.replies[1]}, honest_nodes=[2, 3])
    game_label = "client 'client-1' (node 99)"
    assert_rejected_without_trace(
        server,
        result,
        expected,
        game.control,
        game_label,
        "client id 'client-1' is bound to node 1; node 99 may not use it",
    )


def test_a_spoofer_is_named_as_one_when_its_reply_comes_after_the_real_clients(tmp_path):
    """The refusal must not depend on arrival order (a real federation's replies come in any order)."""
    game = RogueRound(tmp_path, "bayesadmm")
    server, result, expected = game.aggregate({ROGUE_NODE: game.replies[1]})  # after node 1's own reply
    assert_rejected_without_trace(
        server,
        result,
        expected,
        game.control,
        "client 'client-1' (node 99)",
        "client id 'client-1' is bound to node 1; node 99 may not use it",
    )


@pytest.mark.parametrize("strategy", ["fedavg", "bayesadmm", "feddyn", "p-dsvgd"])
def test_a_node_cannot_rename_itself_nor_count_past_max_clients(tmp_path, strategy):
    """Sybil: node 3 (client-3) claims a new id; a new node with a new id past max-clients=3 is refused too."""
    game = RogueRound(tmp_path, strategy, **{"max-clients": 3})
    renamed = with_header(game.replies[3], game.reply_type, client_id="client-3b")
    server, result, expected = game.aggregate({3: renamed}, honest_nodes=[1, 2])
    assert_rejected_without_trace(
        server,
        result,
        expected,
        game.control,
        "client 'client-3' (node 3) claiming to be client 'client-3b'",
        "node 3 is client 'client-3'; it may not speak as 'client-3b'",
    )
    game = RogueRound(tmp_path / "again", strategy, **{"max-clients": 3})
    newcomer = with_header(game.replies[1], game.reply_type, client_id="client-4")
    server, result, expected = game.aggregate({ROGUE_NODE: newcomer})
    assert_rejected_without_trace(
        server, result, expected, game.control, "client 'client-4' (node 99)", "already counts max-clients=3 clients"
    )


def test_two_replies_for_one_client_id_in_a_round_the_second_is_refused(tmp_path):
    game = RogueRound(tmp_path, "bayesadmm")
    server, result, expected = game.aggregate({1: game.replies[1]})  # node 1 sends its reply twice
    assert "already replied this round from node 1" in result.report.rejected["client 'client-1' (node 1)"]
    assert_same_state(server, game.control)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_reply_from_an_earlier_round_is_rejected(tmp_path, strategy):
    """A late reply (round 1's, from a client whose round-1 reply the server already has) is refused."""
    game = RogueRound(tmp_path, strategy)
    stale = with_header(game.replies[1], game.reply_type, server_round=1)
    server, result, expected = game.aggregate({1: stale}, honest_nodes=[2, 3])
    assert_rejected_without_trace(
        server, result, expected, game.control, "client 'client-1' (node 1)", "the reply is for round 1, not 2"
    )


def test_a_negative_dual_precision_is_rejected_not_a_server_crash(tmp_path):
    """The red-team's exit-201 crash: a reply whose u_k is very negative drove the global precision below 0."""
    game = RogueRound(tmp_path, "bayesadmm")
    message = envelope_message(game.replies[1], game.reply_type)
    tensors = declared_payload(game.replies[1], game.reply_type).tensors
    tensors["dual_precision"] = {
        name: np.full(value.shape, -1e9, np.float32) for name, value in tensors["dual_precision"].items()
    }
    rogue = encode(envelope_of(game.replies[1]), message, tensors)
    assert envelope_of(rogue).header.client_id == "client-1"
    server, result, expected = game.aggregate({1: rogue}, honest_nodes=[2, 3])
    assert_rejected_without_trace(
        server,
        result,
        expected,
        game.control,
        "client 'client-1' (node 1)",
        "field 'dual_precision': differs from the server's replay",
    )


@pytest.mark.parametrize("strategy", ["fedavg", "bayesadmm", "feddyn", "fedlap-cov", "fedpa", "p-dsvgd"])
def test_the_only_reply_being_rogue_changes_nothing(tmp_path, strategy):
    game = RogueRound(tmp_path, strategy)
    rogue = with_header(game.replies[1], game.reply_type, num_examples=0)
    core = game.federation.core
    outcome = core.aggregate(game.plan, [reply_message(rogue, 1)])
    assert outcome.arrays is None and outcome.metrics is None and outcome.report.accepted == []
    game.control.aggregate(game.plan, [])
    assert_same_state(core, game.control)


# ---- lost and late replies (issue: they desynchronised FedDyn's λ_k for good) -----------------------------
def server_mirror(state, client):
    """What a server half's `state` holds of `client`'s state, named as the client stores it."""
    if isinstance(state, BayesADMMState):
        return {"dual_mean": state.duals[client].mean}
    if isinstance(state, FedDynState):
        return {"feddyn_lambda": state.lambdas[client].value}
    if isinstance(state, FedLapState):
        return {"site_mean": state.sites[client].mean, "site_precision": state.sites[client].precision}
    if isinstance(state, FedLapFuncState):  # its site, and the predictions its next round removes
        return {**server_mirror(state.sites, client), "memory_predictions": state.memories[client].predictions}
    return {"local_particles": state.local_particles[client]}


def assert_server_matches_clients(federation):
    """Every client the server accepted a round from will start its next round from the state the server
    holds for it (float32 wire rounding aside)."""
    core = federation.core
    for runtime in federation.runtimes.values():
        client = runtime.node.client_id
        if client not in core.accepted_rounds:
            continue
        stored = runtime.state_store("fed").load(core.accepted_rounds[client], for_round=0)
        for name, mirror in server_mirror(core.strategy.state, client).items():
            np.testing.assert_allclose(
                np.asarray(stored.tensors[name], np.float64),
                np.asarray(mirror, np.float64),
                rtol=1e-6,
                atol=1e-9,
                err_msg=f"{client} {name}",
            )


@pytest.mark.parametrize(
    "strategy", ["bayesadmm", "fedadmm", "feddyn", "fedlap", "fedlap-cov", "fedlap-func", "p-dsvgd"]
)
def test_a_dropped_and_a_late_reply_leave_client_and_server_in_step(tmp_path, strategy):
    federation = InProcessFederation(tmp_path, {**overrides(strategy), "fraction-train": 1.0}, sizes=SIZES)
    core, nodes = federation.core, [1, 2, 3]
    federation.round(1, nodes)
    held_back = None
    for server_round in (2, 3, 4):
        plan = core.configure(server_round, federation.arrays, FakeGrid(nodes))
        messages = plan.messages
        replies = {
            m.metadata.dst_node_id: reply_message(
                federation.client_update(m.content, federation.runtimes[m.metadata.dst_node_id]), m.metadata.dst_node_id
            )
            for m in messages
        }
        if server_round == 2:  # client-1 trained and stored round 2, but its reply is lost in transit
            held_back = replies.pop(1)
        delivered = list(replies.values()) + ([held_back] if server_round == 3 else [])  # ...and turns up late
        outcome = core.aggregate(plan, delivered)
        federation.arrays = outcome.arrays
        if server_round == 3:
            assert "the reply is for round 2, not 3" in outcome.report.rejected["client 'client-1' (node 1)"]
        assert_server_matches_clients(federation)
    assert core.accepted_rounds == {"client-1": 4, "client-2": 4, "client-3": 4}
