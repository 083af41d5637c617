"""Forgetting a DSVGD or U-DSVGD client (Forget-SVGD): its factor t_k lives only in its own durable store, so the server
asks it, between rounds, for SVGD from the global particles towards q/t_k (server/forget/, client/core.py ForgetHalf).
The real round loop and the real server and client halves in one process behind a scripted grid
(tests/support/forgetting.py: 3 clients, logistic regression on synthetic data): a client's `--leave --forget`, the
operator's request while the client is connected, and what is refused with the state unchanged: a stopped federation,
and every kind of bad or missing answer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Error
from flwr.common.constant import ErrorCode

from fedbayes.client.state import left_marker
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, instruction_body_type, reply_header
from fedbayes.server.forget import ForgetError, ForgetRequest, RequestQueue
from fedbayes.strategies.dsvgd.client import _stored_visits
from fedbayes.strategies.dsvgd.math import (
    SVGDSettings,
    forget_update,
    gaussian_prior_score,
    unconstrained_forget_update,
)
from tests.support import declared_payload, newest_state
from tests.support.forgetting import LEAVING, ClientsGrid, Federation

SMALL = {"particles": 4, "local-steps": 10, "distill-steps": 10, "svgd-lr": 0.01, "distill-lr": 0.01}
FORGET_REQUEST = pb.DSVGDForgetInstruction.DESCRIPTOR.full_name


class ForgetGrid(ClientsGrid):
    """ClientsGrid that records each forget request as it arrives (the request, the checkpoint files and audit records
    at that moment, the asked client's stored state) and the answer; `bad_answer(request, honest_answer)`, when given,
    replaces node 3's answer."""

    def __init__(self, federation: Federation, bad_answer=None, **kwargs):
        super().__init__(federation.clients, **kwargs)
        self.outer, self.bad_answer = federation, bad_answer
        self.asked: list[dict] = []

    def client_answer(self, message):
        if instruction_body_type(message.content) != FORGET_REQUEST:
            return super().client_answer(message)
        runtime = self.federation.runtimes[message.metadata.dst_node_id]
        request = declared_payload(message.content, pb.DSVGDForgetInstruction)
        asked = {
            "request": request,
            "checkpoints": self.outer.snapshot(),
            "audit": self.outer.audit(),
            "stored": newest_state(runtime.state_store("fed")),
        }
        self.asked.append(asked)
        answer = super().client_answer(message)
        if self.bad_answer is not None:
            answer = self.bad_answer(request, answer)
        asked["answer"] = answer
        return answer


def trained(tmp_path, strategy: str) -> Federation:
    """Three rounds of a 3-client federation: one round-robin cycle, node k's client-k accepted in round k."""
    federation = Federation(tmp_path, strategy, **SMALL)
    federation.run(3)
    return federation


def expected_forget(strategy: str, request, stored) -> np.ndarray:
    """The math the client's part must be: SVGD from the particles sent towards q/t_k, t_k from its stored factor."""
    message = request.message
    settings = SVGDSettings(message.steps, 0, message.kde_bandwidth, message.step_size, message.step_size)
    particles = torch.from_numpy(request.tensors["particles"]["particles"].copy())
    prior = gaussian_prior_score(message.prior_precision)
    if strategy == "u-dsvgd":
        visits = _stored_visits(stored, tuple(particles.shape), None, "client-3")
        return unconstrained_forget_update(particles, visits, prior, settings).numpy()
    return forget_update(particles, stored.tensors["local_particles"].float(), prior, settings).numpy()


@pytest.mark.parametrize("strategy", ["dsvgd", "u-dsvgd"])
def test_a_leaving_client_computes_its_forget_and_the_server_adopts_it_revokes_it_and_it_deletes_its_state(
    tmp_path, strategy
):
    """client-3 answers with LeaveAndForget from round 4 on; its turn is round 6. After round 6 the server sends it the
    global particles (its request settled between rounds), it answers from its store alone, the server adopts the
    answer bit for bit as Θ (checkpointed), audits an estimate, revokes the id, and tells the node at once, which
    deletes its state and writes the leave marker."""
    federation = trained(tmp_path, strategy)
    grid = ForgetGrid(federation, behaviour={3: LEAVING})
    core, _, rows = federation.run(6, grid)

    assert [row["clients"] for row in rows] == [1, 1, 1, 1, 1, 0]  # round 6: client-3's turn, it sent no update
    (asked,) = grid.asked
    request = asked["request"]
    assert request.header.server_round == 6 and dict(request.header.accepted_rounds) == {"client-3": 3}
    assert request.message.variant == strategy and request.message.steps == SMALL["local-steps"]
    uploaded = declared_payload(asked["answer"], pb.DSVGDForgetReply)
    assert uploaded.reply.resumed_from_round == 3 and uploaded.reply.num_examples == 0
    forgotten = uploaded.tensors["particles"]["particles"]
    np.testing.assert_allclose(forgotten, expected_forget(strategy, request, asked["stored"]), rtol=1e-6, atol=1e-7)
    sent = request.tensors["particles"]["particles"]
    assert not np.allclose(forgotten, sent)  # the forget moved the particles

    np.testing.assert_array_equal(core.strategy.particles, forgotten)
    newest = federation.newest()
    assert newest.server_round == 6
    np.testing.assert_array_equal(newest.core.strategy.particles, forgotten)
    weights = np.concatenate([value.ravel() for value in newest.arrays.values()])
    np.testing.assert_allclose(np.sort(weights), np.sort(forgotten.astype(np.float64).mean(0)), rtol=1e-6)
    assert federation.snapshot().keys() == {"checkpoint-6.safetensors"}  # the older ones held client-3

    (record,) = federation.audit()
    assert record["event"] == "forgotten" and record["asked_by"] == "node 3, bound to client 'client-3'"
    assert record["exact"] is False and record["kl_before_after"] is None and record["round"] == 6
    assert "towards q/t_k" in record["note"] and "a particle estimate" in record["note"]
    assert record["contributed_rounds"] == [[3, 3]] and record["last_accepted_round"] == 3
    assert core.identities.ledger.revoked == {"client-3"} and "client-3" not in core.accepted_rounds
    assert newest.core.identities.ledger.revoked == {"client-3"}

    state_dir = tmp_path / "state"
    assert not (state_dir / "fed" / "client-3").exists() and (state_dir / "fed" / "client-1").exists()
    assert left_marker(state_dir, "client-3").exists()


def forged(request, honest, particles=None, resumed=None, client="client-3", nonce=None):
    """An answer to `request` as a client may forge it: the honest answer's particles or `particles`, the request's
    nonce or `nonce`."""
    honest_particles = declared_payload(honest, pb.DSVGDForgetReply).tensors["particles"]["particles"]
    envelope = pb.Reply(
        header=reply_header(request.header, client),
        resumed_from_round=request.header.accepted_rounds["client-3"] if resumed is None else resumed,
    )
    if nonce is not None:
        envelope.header.nonce = nonce
    values = honest_particles if particles is None else particles(honest_particles)
    return encode(envelope, pb.DSVGDForgetReply(), {"particles": {"particles": values.astype(np.float32)}})


def leave_request(request, honest):
    return encode(pb.LeaveAndForget(header=reply_header(request.header, "client-3")), None, {})


BAD_ANSWERS = {
    "non-finite": (
        lambda r, h: forged(r, h, particles=lambda p: np.where(np.arange(p.size).reshape(p.shape) == 1, np.nan, p)),
        "field 'particles/particles': contains NaN or Inf",
    ),
    "wrong shape": (
        lambda r, h: forged(r, h, particles=lambda p: np.concatenate([p, p[:1]])),
        "field 'particles/particles': shape must be (4, 12), got (5, 12)",
    ),
    "another factor": (lambda r, h: forged(r, h, resumed=0), "field 'resumed_from_round': 0, but the factor"),
    "another id": (lambda r, h: forged(r, h, client="client-1"), "field 'header.client_id': 'client-1' is not"),
    # the honest particles, but not an answer to this request: a nonce the server did not send
    "another message's nonce": (
        lambda r, h: forged(r, h, nonce=bytes(16)),
        "field 'header.nonce': not the nonce of the server's last message to node 3",
    ),
    "too far": (lambda r, h: forged(r, h, particles=lambda p: p + 1e4), "refused by the screen"),
    "no update": (leave_request, "field 'type': expected fedbayes.v1.Reply, got 'fedbayes.v1.LeaveAndForget'"),
    "client error": (
        lambda r, h: Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "StateLostError: gone"),
        "sent no forget reply: client error: StateLostError: gone",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
def test_a_bad_forget_answer_is_refused_audited_and_changes_nothing(tmp_path, case):
    """Whatever node 3 answers the forget request with, the server checks it as any reply: a bad one is refused with
    the reason in the audit log, the checkpoint stays as it was, the id is not revoked and the client keeps its state;
    the federation goes on (the leaving client asks again at its next turn)."""
    bad_answer, reason = BAD_ANSWERS[case]
    federation = trained(tmp_path, "dsvgd")
    grid = ForgetGrid(federation, bad_answer=bad_answer, behaviour={3: LEAVING})
    core, _, rows = federation.run(6, grid)

    (asked,) = grid.asked
    assert federation.snapshot() == asked["checkpoints"] and asked["audit"] == []
    (record,) = federation.audit()
    assert record["event"] == "refused" and record["asked_by"] == "node 3, bound to client 'client-3'"
    assert "client 'client-3' (node 3)" in record["reason"] and reason in record["reason"]
    np.testing.assert_array_equal(core.strategy.particles, asked["request"].tensors["particles"]["particles"])
    assert not core.identities.ledger.revoked and core.accepted_rounds["client-3"] == 3
    assert (tmp_path / "state" / "fed" / "client-3").exists() and not left_marker(
        tmp_path / "state", "client-3"
    ).exists()


def test_a_silent_client_is_refused_after_round_timeout(tmp_path):
    federation = trained(tmp_path, "u-dsvgd")
    grid = ForgetGrid(federation, bad_answer=lambda request, honest: None, behaviour={3: LEAVING})
    core, _, _ = federation.run(6, grid)
    (record,) = federation.audit()
    assert record["event"] == "refused"
    assert "client 'client-3' (node 3) sent no forget reply: no reply within round-timeout (5 s)" in record["reason"]
    assert not core.identities.ledger.revoked


def test_the_operator_forgets_a_connected_client_of_a_running_federation_but_not_of_a_stopped_one(tmp_path):
    """On a stopped federation the server cannot ask the client: refused, naming the client's own route. While the
    federation runs and the client is connected, the operator's request is settled like the client's own, by a normal
    client (it need not be leaving), which keeps its files; from then on its replies are refused by name."""
    federation = trained(tmp_path, "dsvgd")
    before = federation.snapshot()
    with pytest.raises(ForgetError, match=r"\(its local particles\).*the federation is stopped.*--leave --forget"):
        federation.forget("client-2")
    assert federation.snapshot() == before

    def during_round(server_round, grid):
        if server_round == 4 and not grid.asked:
            RequestQueue(federation.directory / "forget-requests").submit(ForgetRequest.by_operator("fed", "client-2"))

    grid = ForgetGrid(federation, during_round=during_round)
    federation.run(4, grid)  # the request is settled after round 4, the last
    records = federation.audit()
    assert [record["event"] for record in records] == ["refused", "forgotten"]
    assert records[1]["asked_by"].startswith("operator ") and records[1]["round"] == 4
    (asked,) = grid.asked
    assert asked["request"].header.accepted_rounds["client-2"] == 2
    uploaded = declared_payload(asked["answer"], pb.DSVGDForgetReply).tensors["particles"]["particles"]
    newest = federation.newest()
    np.testing.assert_array_equal(newest.core.strategy.particles, uploaded)
    assert newest.core.identities.ledger.revoked == {"client-2"}
    assert (tmp_path / "state" / "fed" / "client-2").exists()  # a client the operator forgot keeps its files

    core, _, rows = federation.run(6, ClientsGrid(federation.clients))
    assert "client-2" not in core.accepted_rounds
    refused = [reason for row in rows[4:] for reason in row["rejected"].values()]
    assert any("client id 'client-2' was forgotten after round 4" in reason for reason in refused), refused
