"""A registered client turned rogue, in one process: its honest reply with its tensors changed, and whatever the
server replays from a reply made to agree with the change again (BayesADMM's duals, FedDyn's λ sketch), so that
only the screen, the robust rules or the search for a culprit can stop it. Shared by the rogue tests and
benchmarks/attack_matrix.py, benchmarks/robust_aggregation.py."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import numpy as np
from flwr.app import RecordDict

from fedbayes.bayes.params import unflatten
from fedbayes.protos.codec import PayloadError, encode
from fedbayes.server.round_core import CORE_STATE_KEY
from fedbayes.strategies.bayesadmm.math import Duals, dual_step
from fedbayes.strategies.bayesadmm.server import BayesADMM
from fedbayes.strategies.dsvgd.server import DSVGD
from fedbayes.strategies.fedavg.server import FedAvg
from fedbayes.strategies.feddyn import math as feddyn
from fedbayes.strategies.feddyn.server import FedDyn
from tests.support import FakeGrid, InProcessFederation, answering, declared_payload, envelope_of, reply_message

# The reply's tensor group that carries the strategy's update.
UPDATE_GROUP = {
    "fedavg": "weights",
    "fedprox": "weights",
    "feddyn": "weights",
    "fedpa": "delta",
    "fedlap": "site_mean",
    "fedlap-cov": "site_mean",
    "fedlap-func": "site_mean",
    "p-dsvgd": "local_particles",
    "dsvgd": "particles",
    "u-dsvgd": "particles",
    "bayesadmm": "local_mean",
    "fedadmm": "local_mean",
    "bayesadmm-full": "local_mean",
}
Change = Callable[[str, str, np.ndarray], np.ndarray]  # (group, tensor name, array) -> the array the rogue sends


def consistent_reply(server, content: RecordDict, change: Change, server_round: int) -> RecordDict:
    """`content` (an honest reply to the server half `server`'s round `server_round`) with `change` applied to every
    tensor, and its replayed parts recomputed. Content that does not decode (the client's own training diverged) is
    sent as is."""
    try:
        payload = declared_payload(content, server.reply_type)
    except PayloadError:
        return content
    message = payload.message
    tensors = {
        group: {name: change(group, name, np.array(value)) for name, value in arrays.items()}
        for group, arrays in payload.tensors.items()
    }
    changed = type(payload)(payload.envelope, message, tensors)
    if isinstance(server, BayesADMM):  # the duals are the dual step from the (changed) local posterior
        previous = server.state.duals.get(payload.header.client_id) if payload.reply.resumed_from_round else None
        local = server._local_posterior(changed)
        start = previous or Duals(local.mean * 0, server.global_.precision * 0)
        duals = dual_step(start, local, server.global_, server.dual_step_size, server_round)
        for group, value in (("dual_mean", duals.mean), ("dual_precision", duals.precision)):
            layout = {name: array.shape for name, array in tensors[group].items()}
            if layout:
                tensors[group] = unflatten(value.numpy().ravel(), layout)
    if isinstance(server, FedDyn):  # the sketch of λ_k after these weights
        lam = server._replayed_lambda(changed)
        del message.lambda_sketch[:]
        message.lambda_sketch.extend(feddyn.lambda_sketch(lam, server.settings.seed, server_round).tolist())
    return encode(payload.envelope, message, tensors)


def with_num_examples(server, content: RecordDict, examples: int) -> RecordDict:
    """`content` (a reply to the server half `server`) claiming `examples` examples."""
    payload = declared_payload(content, server.reply_type)
    payload.envelope.num_examples = examples
    return encode(payload.envelope, payload.message, payload.tensors)


def scaled_update(reference: dict[str, np.ndarray], group: str, factor: float) -> Change:
    """A `Change`: group `group`'s tensors moved to reference + factor x (tensor − reference)."""

    def change(tensor_group: str, name: str, array: np.ndarray) -> np.ndarray:
        if tensor_group != group:
            return array
        return (reference[name] + factor * (array.astype(np.float64) - reference[name])).astype(np.float32)

    return change


def filled(group: str, value: float) -> Change:
    """A `Change`: group `group`'s tensors all `value`."""
    return lambda tensor_group, name, array: np.full_like(array, value) if tensor_group == group else array


def sent_reference(server, layout, client: str) -> dict[str, np.ndarray]:
    """What `client`'s update is measured from, by tensor name: the global model the server half `server` sent (w_g,
    m̄, the particles), the client's last local particles (P-DSVGD), zeros for FedPA's deltas and FedLap's site means."""
    if isinstance(server, DSVGD):
        particles = server.state.local_particles[client] if server.parallel else server.particles
        return {"particles": particles.astype(np.float64)}
    if isinstance(server, FedAvg):  # and FedProx
        flat = server.global_weights
    elif isinstance(server, BayesADMM):
        flat = server.global_.mean.numpy()
    elif isinstance(server, FedDyn):
        flat = server.global_.numpy()
    else:  # FedPA, FedLap
        flat = np.zeros(sum(int(np.prod(shape)) for shape in layout.values()))
    return unflatten(np.asarray(flat, np.float64), layout, dtype=np.float64)


# ---- a round with a rogue reply in it, against a control server that never saw it ----------------------------
SIZES = [12, 30, 20]
ROGUE_NODE = 99


def overrides(strategy: str) -> dict:
    extra = {
        "strategy": strategy,
        "local-epochs": 1,
        "particles": 3,
        "local-steps": 2,
        "distill-steps": 2,
        "server-steps": 2,
        "server-fit-steps": 20,
        "burn-in-rounds": 1,
        "samples": 2,
    }
    if strategy == "bayesadmm-full":
        extra |= {"temperature": 1.0, "lr": 1.0}
    if strategy == "bayesadmm":  # the paper's h0 and β2: honest updates of ordinary size. h0 derived from these
        # clients' data is large, their updates 1e-3 of m̄'s norm, and a millionfold of one stays under the
        # screen's floor (an RMS change of 1 per entry), where it is let through by design (bayes/robust.py)
        extra |= {"hess-init": 0.001, "beta2": 0.9998}
    return extra


def envelope_message(content, message_type):
    """The strategy's message in a payload's envelope, as sent."""
    message = message_type()
    envelope_of(content).body.Unpack(message)
    return message


def server_snapshot(core):
    """A round core's checkpoint state without its quarantine bookkeeping (which counts the rogue's refusal)."""
    state = core.state_dict()
    metadata = dict(state.metadata)
    wire = json.loads(metadata[CORE_STATE_KEY])
    del wire["quarantine"]
    metadata[CORE_STATE_KEY] = json.dumps(wire)
    return {name: np.asarray(value).copy() for name, value in state.tensors.items()}, metadata


def assert_same_state(server, control):
    tensors, metadata = server_snapshot(server)
    control_tensors, control_metadata = server_snapshot(control)
    assert tensors.keys() == control_tensors.keys() and metadata == control_metadata
    for name in tensors:
        np.testing.assert_array_equal(tensors[name], control_tensors[name], err_msg=name)


class RogueRound:
    """Round 1 honest for nodes 1-3; round 2 configured for them and the rogue's node, every client half run; then
    the same round aggregated by the real server's round core (honest replies plus `rogue` ones) and by a control
    copy (honest only). A rogue reply answers its node's own instruction of round 2 (it echoes that nonce): the
    rogue reads what it is sent, and makes up the rest."""

    def __init__(self, tmp_path, strategy: str, **extra):
        self.federation = InProcessFederation(tmp_path, {**overrides(strategy), **extra}, sizes=SIZES)
        self.federation.round(1, [1, 2, 3])
        core = self.federation.core
        self.plan = core.configure(2, self.federation.arrays, FakeGrid([1, 2, 3, ROGUE_NODE]))
        messages = self.plan.messages
        self.sent = {message.metadata.dst_node_id: message for message in messages}
        self.replies = {}
        for message in messages:
            node = message.metadata.dst_node_id
            if node in self.federation.runtimes:
                self.replies[node] = self.federation.client_update(message.content, self.federation.runtimes[node])
        self.reply_type = self.federation.server.reply_type
        self.control = copy.deepcopy(core)

    def aggregate(self, rogue: dict[int, object], honest_nodes=None):
        honest_nodes = list(self.replies) if honest_nodes is None else honest_nodes
        honest = [reply_message(self.replies[node], node) for node in honest_nodes]
        core = self.federation.core
        rogues = [reply_message(answering(self.sent[node], content), node) for node, content in rogue.items()]
        result = core.aggregate(self.plan, honest + rogues)
        expected = self.control.aggregate(self.plan, honest)
        return core, result, expected


def assert_rejected_without_trace(server, result, expected, control, label, words):
    assert label in result.report.rejected, result.report.rejected
    assert words in result.report.rejected[label]
    assert result.report.accepted == expected.report.accepted != []
    for name in expected.arrays:
        np.testing.assert_array_equal(result.arrays[name].numpy(), expected.arrays[name].numpy())
    assert_same_state(server, control)
