"""The server's round core, shared by every fedbayes strategy: the trust boundary (every reply decoded and checked
inside one guard, identities bound to nodes, each reply's update screened, a round committed from the replies that
make a usable state, refused nodes quarantined: strategies/isolation.py), node sampling, the per-node instructions
that tell each client which of its rounds the server accepted, the round's metrics and arrays, and checkpointing.
An algorithm is two hooks on it (WireStrategy)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from logging import INFO, WARNING
from typing import Any, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common import log
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.bayes.params import flatten, unflatten, weighted_mean
from fedbayes.bayes.robust import norms, screen_bounds
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import (
    Payload, PayloadError, TensorLayout, check_payload_size, claimed_client_id, decode, encode, envelope_type,
    new_header, with_envelope,
)
from fedbayes.server.identity import ClientIdentities, ForgetLedger
from fedbayes.strategies.isolation import Quarantine, RoundRejected, usable_subset
from fedbayes.tasks.config import ConfigError, RunSettings, round_seed

M = TypeVar("M", bound=ProtoMessage)
WIRE_STATE_KEY = "fedbayes/wire"  # the base's part of a checkpoint's strategy metadata
MAX_REASON = 400  # characters of a rejection reason that are logged and reported


@dataclass
class ServerState:
    """What a strategy's server half must carry across a server restart, besides the global arrays the
    round loop checkpoints itself: tensors (float32/float64 numpy) and string metadata (e.g. JSON).
    Keys are the strategy's own. Randomness is derived from (seed, round), so no RNG state is needed."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def add_per_client(self, name: str, records: Mapping[str, Any]) -> None:
        """Per-client records (dataclasses of torch tensors and the `round` they were last updated in, e.g.
        BayesADMM's duals): tensors under '<name>/<client>/<field>', rounds as JSON under '<name>'."""
        for client, record in records.items():
            for item in fields(record):
                if item.name != "round":
                    self.tensors[f"{name}/{client}/{item.name}"] = getattr(record, item.name).numpy()
        self.metadata[name] = json.dumps({client: record.round for client, record in records.items()})

    def per_client(self, name: str, record_type: type) -> dict[str, Any]:
        """The records `add_per_client(name, ...)` saved, as `record_type`s (float64 torch tensors as saved)."""
        tensor_fields = [item.name for item in fields(record_type) if item.name != "round"]
        return {client: record_type(**{f: torch.from_numpy(self.tensors[f"{name}/{client}/{f}"].copy())
                                       for f in tensor_fields}, round=last_round)
                for client, last_round in json.loads(self.metadata[name]).items()}


@dataclass
class GlobalPosterior:
    """The global posterior as the server holds it, for `fedbayes export` (posterior/): a Gaussian over the flat
    parameters (layout order) whose mean is the global model, N particles (N, P) of the flat parameters, or neither:
    a point estimate, the global model itself. `note` says in one line what it is (the export's header carries it)."""

    note: str
    gaussian: Gaussian | None = None
    particles: np.ndarray | None = None


@dataclass
class RoundReport:
    """Who took part in the last round: accepted client ids, why others were left out, and the nodes that sit out
    rounds (quarantined: label -> the last round it sits out)."""

    sent: int = 0
    accepted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "client-3 (node 42)" -> reason
    quarantined: dict[str, int] = field(default_factory=dict)


def sample_nodes(nodes: Iterable[int], fraction: float, minimum: int, seed: int, server_round: int) -> list[int]:
    """The nodes to train this round: a `fraction` of the connected ones (at least `minimum`), drawn with a
    per-round seed so that a server resumed from its checkpoint draws as an uninterrupted one would."""
    nodes = sorted(nodes)
    count = min(len(nodes), max(minimum, round(fraction * len(nodes))))
    return sorted(random.Random(round_seed(seed, server_round)).sample(nodes, count))


def local_training(
    settings: RunSettings, server_round: int, weight_decay: float = 0.0, epochs: int | None = None
) -> pb.LocalTraining:
    """The local-training part of every strategy's instruction: the run's epochs (unless the strategy
    asks for others), batch size, optimizer and seed, and this round's learning rate (constant or cosine).
    Weight decay only where the strategy's objective has it; Bayesian ones regularise with their prior."""
    return pb.LocalTraining(
        epochs=settings.local_epochs if epochs is None else epochs, batch_size=settings.batch_size,
        learning_rate=settings.round_lr(server_round), optimizer=settings.optimizer, weight_decay=weight_decay,
        seed=settings.seed,
    )


def non_finite(value: Any, what: str) -> str | None:
    """Why `value` (arrays, tensors, and the dicts, lists and dataclasses holding them) cannot be stored: the name
    of a non-finite entry, or None."""
    if isinstance(value, (np.ndarray, torch.Tensor)):
        finite = torch.isfinite(value).all() if isinstance(value, torch.Tensor) else np.isfinite(value).all()
        return None if finite else f"{what} would hold NaN or Inf"
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif is_dataclass(value) and not isinstance(value, type):
        items = ((item.name, getattr(value, item.name)) for item in fields(value))
    else:
        return None
    return next((problem for key, item in items if (problem := non_finite(item, f"{what}/{key}"))), None)


def round_metrics(payloads: list[Payload], **extra: float) -> MetricRecord:
    """What every round reports of its accepted replies: the example-weighted training loss, the mean compute
    seconds, plus the strategy's own `extra` metrics."""
    examples = np.array([p.message.num_examples for p in payloads], dtype=np.float64)
    return MetricRecord({
        "train-loss": float(np.average([p.message.train_loss for p in payloads], weights=examples)),
        "compute-seconds": float(np.mean([p.message.compute_seconds for p in payloads])),
        **extra,
    })


@dataclass
class Update:
    """What `absorb` computes from a round's accepted replies, without touching the strategy: the new global
    model (flat, in layout order; what the server evaluates and hands to the next round), the strategy's
    attributes as they become once the round is committed, and the round's own metrics."""

    weights: np.ndarray
    state: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class ForgetRefused(ValueError):
    """`forget` cannot take this client out of the server's state; the message says why and what to do instead."""


@dataclass
class Forgotten:
    """What `forget(client)` computes, without touching the strategy (../shared/specs/forget.md): the global model
    without the client (flat, in layout order; what the server then evaluates and sends), the strategy's attributes
    as they become once the caller commits it (assigned as `Update.state` is), whether the result is the exact
    posterior of the remaining clients' data at the algorithm's fixed point for the loss the clients train (False:
    an estimate that refinement rounds among the remaining clients improve), KL(q_before ‖ q_after) where the global
    posterior is a Gaussian (else None), and one line on what was done."""

    weights: np.ndarray
    state: dict[str, Any]
    exact: bool
    kl_before_after: float | None
    note: str


class WireStrategy(Strategy):
    """Base of every fedbayes server strategy: one round core, two hooks. The core owns who may reply and
    what a reply must be (the trust boundary), node sampling, headers, encoding, the round's metrics, the
    returned arrays and checkpointing (`state_dict` / `load_state_dict`, torch's convention). An algorithm
    supplies

      instruction(server_round, arrays, nodes) -> (message, tensors)   what this round's clients are told
      absorb(payloads, server_round) -> Update                         the new state from the accepted replies

    plus `reply_type`, `reply_layouts()`, optionally `check_reply(payload)` (checks against its state),
    `update_of(payload)` and `state_norm()` (what the screen measures) and `round_nodes(grid, server_round)`
    (default: a seeded `fraction-train` sample). `absorb` must not change the strategy: the core may call it on
    several subsets of a round's replies (strategies/isolation.py), assigns `Update.state` only once the round is
    committed, and a `RoundRejected` it raises leaves everything as it was.
    `robust_rules`: the run-config `robust-aggregation` rules the algorithm implements (others are refused).
    `forget(client) -> Forgotten`: the state without one client, from what the server holds alone; refused by default.
    """

    settings: RunSettings
    reply_type: type[ProtoMessage]
    robust_rules: tuple[str, ...] = ("none",)

    def __init__(self, settings: RunSettings, layout: TensorLayout) -> None:
        if settings.robust_aggregation not in self.robust_rules:
            raise ConfigError(f"run config 'robust-aggregation' = {settings.robust_aggregation!r}: strategy "
                              f"{settings.strategy!r} implements {', '.join(self.robust_rules)}")
        self.settings = settings
        self.layout = layout  # the model's parameters, what the algorithm's math works on
        self.buffer_layout: TensorLayout = {}  # the rest of its state (server/app.py sets it): averaged by the core
        self.round_report = RoundReport()
        self.identities = ClientIdentities(settings.client_identity, settings.max_clients, settings.client_registry)
        self.quarantine = Quarantine(settings.max_client_rejections, settings.quarantine_rounds)
        self.accepted_rounds: dict[str, int] = {}  # client id -> last round whose reply was accepted
        self.checkpointed_rounds: dict[str, int] = {}  # accepted_rounds as the newest checkpoint on disk holds them
        self.connected: list[int] = []  # the nodes connected when this round was configured
        self._reply_nodes: dict[str, int] = {}  # client id -> node, of this round's replies that passed the checks
        self._refused_nodes: set[int] = set()  # nodes whose reply this round was refused
        self.leave_requests: list[tuple[str, int]] = []  # (client id, node) of this round's LeaveAndForget

    # ---- the algorithm's hooks ------------------------------------------------------------------------------
    def instruction(self, server_round: int, arrays: ArrayRecord,
                    nodes: list[int]) -> tuple[ProtoMessage, Mapping[str, Mapping[str, np.ndarray]]]:
        """This round's instruction (its header is filled in by the core) and its tensor groups."""
        raise NotImplementedError

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layout of every tensor group of `reply_type`."""
        raise NotImplementedError

    def check_reply(self, payload: Payload) -> None:
        """The algorithm's checks of one reply against its state; raise to reject that reply alone."""

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        raise NotImplementedError

    def update_of(self, payload: Payload) -> np.ndarray | None:
        """The reply's update: its change to the state, flat float64, in parameters where honest updates are of
        comparable size (weights, a Gaussian's mean and log precision, particles). What the screen and the search
        for a culprit measure; None: not screened."""
        return None

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`: the screen never refuses a shorter update."""
        return 0.0

    def round_nodes(self, grid: Grid, server_round: int) -> list[int]:
        return self.sample(grid, server_round)

    def forget(self, client: str) -> Forgotten:
        """The state without `client`'s contribution, computed by the server alone (no client work) and without
        changing the strategy: the caller commits `Forgotten.state` as it commits `Update.state`. ForgetRefused,
        naming why, where the server cannot; here: the algorithm keeps no per-client factor (FedAvg, FedProx, FedPA)."""
        raise ForgetRefused(
            f"{self.settings.strategy}: the server keeps no per-client factor to remove, only a global model that "
            f"every accepted round of client {client[:64]!r} went into; retrain from the last checkpoint that predates "
            "the client's first accepted round, or from scratch")

    def check_forgettable(self, client: str, holders: Collection[str]) -> None:
        """Refuse (ForgetRefused) a client the state holds nothing of, and the last one it holds (without it only the
        prior would be left: a new federation, not a forgotten client)."""
        if client not in holders:
            raise ForgetRefused(f"client {client[:64]!r} is unknown: the server holds no state of it "
                                f"({len(holders)} known clients)")
        if len(holders) == 1:
            raise ForgetRefused(f"client {client!r} is the last remaining client: forgetting it leaves only the prior; "
                                "start a new federation instead")

    def core_state_without(self, client: str) -> dict[str, Any]:
        """The core's attributes once `client` is forgotten: its accepted round goes, so no instruction names a state
        of it any more (its binding and the revocation of its id are the caller's: ClientIdentities.forgetting)."""
        return {"accepted_rounds": {c: r for c, r in self.accepted_rounds.items() if c != client}}

    # ---- Flower's Strategy, written once ---------------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        nodes = self.round_nodes(grid, server_round)
        instruction, tensors = self.instruction(server_round, arrays, nodes)
        instruction.header.CopyFrom(new_header(self.settings.federation, server_round))
        buffers = {name: arrays[name].numpy() for name in self.buffer_layout}
        return self.instructions(instruction, {**tensors, "buffers": buffers}, nodes)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        layouts = {**self.reply_layouts(), "buffers": self.buffer_layout}
        payloads = self.decode_replies(replies, self.reply_type, layouts, server_round, check=self.check_reply)
        payloads, update_norms = self.screened(payloads)
        isolated = usable_subset(payloads, lambda subset: self.candidate(subset, server_round), update_norms)
        for payload, reason in isolated.left_out:
            client = payload.message.header.client_id
            node = self._reply_nodes[client]
            self._reject(f"client {client!r} (node {node})", f"{self.settings.strategy}: {reason}", node)
        self.quarantined_after(server_round, isolated.used)
        if not isolated.used:
            return None, None
        weights, update = isolated.result
        self.commit(isolated.used, server_round)
        vars(self).update(update.state)
        return (ArrayRecord({name: Array(value) for name, value in weights.items()}),
                round_metrics(isolated.used, **update.metrics))

    def candidate(self, payloads: list[Payload], server_round: int) -> tuple[dict[str, np.ndarray], Update]:
        """The global arrays and the update these replies would make, checked as they would be stored (float32
        arrays, every tensor of the state finite); RoundRejected when unusable. Changes nothing."""
        buffers = self.averaged_buffers(payloads)
        update = self.absorb(payloads, server_round)
        unknown = set(update.state) - set(vars(self))
        if unknown:  # a bug in the algorithm, not in a reply: the loop's guard logs it and the round changes nothing
            raise AttributeError(f"{type(self).__name__}.absorb returned state for unknown attributes {sorted(unknown)}")
        with np.errstate(over="ignore"):  # a float32 overflow is what the check below is for
            weights = unflatten(update.weights, self.layout) | buffers
        problem = non_finite(weights, "the global model") or non_finite(update.state, "the state")
        if problem:
            raise RoundRejected(problem)
        return weights, update

    def screened(self, payloads: list[Payload]) -> tuple[list[Payload], dict[int, float]]:
        """The replies whose update passes the screen (bayes/robust.py screen_bounds: at most `screen-ratio` x the
        largest of the others' median, the state's norm and an RMS change of 1), and every reply's update norm by
        id()."""
        updates = [self.update_of(payload) for payload in payloads]
        if not payloads or any(update is None for update in updates):
            return payloads, {}
        update_norms = norms(updates)
        bounds = screen_bounds(update_norms, self.state_norm(), updates[0].size, self.settings.screen_ratio)
        kept = []
        for payload, norm, bound in zip(payloads, update_norms, bounds):
            if norm <= bound:
                kept.append(payload)
                continue
            client = payload.message.header.client_id
            node = self._reply_nodes[client]
            self._reject(f"client {client!r} (node {node})", f"refused by the screen: its update's norm {norm:.3g} "
                         f"is over {bound:.3g} (screen-ratio={self.settings.screen_ratio:g} x the largest of the other "
                         "updates' median norm, the state's and an RMS change of 1)", node)
        return kept, {id(payload): float(norm) for payload, norm in zip(payloads, update_norms)}

    def quarantined_after(self, server_round: int, used: list[Payload]) -> None:
        """Count this round's refusals per node; a node refused `max-client-rejections` rounds in a row sits out
        `quarantine-rounds` rounds (logged, and in the round report)."""
        accepted = {self._reply_nodes[p.message.header.client_id] for p in used}
        for node in self.quarantine.record(server_round, self._refused_nodes, accepted):
            log(WARNING, "%s: refused %d rounds in a row; quarantined for rounds %d-%d (max-client-rejections, "
                "quarantine-rounds)", self.node_label(node), self.settings.max_client_rejections, server_round + 1,
                server_round + self.settings.quarantine_rounds)
        self.round_report.quarantined = {self.node_label(node): last
                                         for node, last in self.quarantine.active(server_round + 1).items()}

    def averaged_buffers(self, payloads: list[Payload]) -> dict[str, np.ndarray]:
        """The model's buffers (BatchNorm statistics) FedAvg-style, whatever the algorithm: the clients' buffers
        after their local training, weighted by their example counts (none for a model without buffers)."""
        if not self.buffer_layout:
            return {}
        average = weighted_mean([flatten(p.tensors["buffers"], self.buffer_layout) for p in payloads],
                                [p.message.num_examples for p in payloads]).astype(np.float32)
        if not np.isfinite(average).all():  # finite buffers can still overflow float32 together
            raise RoundRejected("the averaged model buffers are not finite")
        return unflatten(average, self.buffer_layout)

    def round_seed(self, server_round: int) -> int:
        """The seed of everything random the server draws for a round, so a resumed run draws the same."""
        return round_seed(self.settings.seed, server_round)

    # ---- configure_train --------------------------------------------------------------------------------
    def connected_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """The nodes connected as this round starts that are not quarantined; also when the operator's client
        registry is re-read."""
        self.identities.refresh_registry()
        self.connected = sorted(grid.get_node_ids())
        return [node for node in self.connected if not self.quarantine.excludes(node, server_round)]

    def sample(self, grid: Grid, server_round: int) -> list[int]:
        return sample_nodes(self.connected_nodes(grid, server_round), self.settings.fraction_train,
                            self.settings.min_clients, self.settings.seed, server_round)

    def instructions(self, instruction: ProtoMessage, tensors: Mapping[str, Mapping[str, np.ndarray]],
                     nodes: Iterable[int]) -> list[Message]:
        """One TRAIN message per node: the tensors are packed once and shared; each header carries the rounds
        that node's client had accepted (Header.accepted_rounds), so it continues from the right state, and
        those the newest checkpoint holds (Header.checkpointed_rounds), whose states it must keep."""
        content = encode(instruction, tensors)
        nodes = list(nodes)
        self.round_report = RoundReport(sent=len(nodes))
        self._refused_nodes, self.leave_requests = set(), []
        checkpointed = self.checkpointed_rounds  # one snapshot: the loop's finisher thread replaces it
        messages = []
        for node in nodes:
            for field_, rounds in ((instruction.header.accepted_rounds, self.accepted_rounds),
                                   (instruction.header.checkpointed_rounds, checkpointed)):
                field_.clear()
                field_.update(self.identities.accepted_view(node, rounds, self.connected))
            instruction.header.forgotten_client_id = self.identities.ledger.confirmation_for(node)
            messages.append(Message(with_envelope(content, instruction), dst_node_id=node,
                                    message_type=MessageType.TRAIN))
        return messages

    # ---- aggregate_train ----------------------------------------------------------------------------------
    def decode_replies(
        self,
        replies: Iterable[Message],
        message_type: type[M],
        layouts: Mapping[str, TensorLayout],
        server_round: int,
        check: Callable[[Payload[M]], None] | None = None,
    ) -> list[Payload[M]]:
        """The replies of this round that pass every check, in client-id order (so aggregates do not depend on
        arrival order). Anything wrong with a reply, whatever it raises, rejects that reply alone, logged
        with its client id, node id and the field; nothing about it is kept. `check` adds the strategy's own
        checks against its state (positive precisions, duals that match the server's replay, ...)."""
        accepted: list[Payload[M]] = []
        claimed: dict[str, int] = {}
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():  # a node the SuperLink saw go offline is absent, not refused (no quarantine)
                self._reject(self.node_label(node), f"client error: {reply.error.reason}", node,
                             refused=reply.error.code != ErrorCode.NODE_UNAVAILABLE)
                continue
            if envelope_type(reply.content) == pb.LeaveAndForget.DESCRIPTOR.full_name:
                self._leave_request(reply, server_round)
                continue
            try:
                payload = self._checked_reply(reply, message_type, layouts, server_round, claimed, check)
            except Exception as error:  # the guard: no reply may stop the server
                label = self._claimed_label(reply, message_type)
                reason = str(error) if isinstance(error, PayloadError) else f"{type(error).__name__}: {error}"
                self._reject(label, f"rejected reply: {reason.removeprefix(f'{label}: ')}", node)
                continue
            claimed[payload.message.header.client_id] = node
            accepted.append(payload)
        self._reply_nodes = claimed
        log(INFO, "round %d: %d replies pass the checks, %d left out", server_round, len(accepted),
            len(self.round_report.rejected))
        return sorted(accepted, key=lambda payload: payload.message.header.client_id)

    def _checked_reply(self, reply: Message, message_type: type[M], layouts: Mapping[str, TensorLayout],
                       server_round: int, claimed: Mapping[str, int], check) -> Payload[M]:
        node = reply.metadata.src_node_id
        sender = self._claimed_label(reply, message_type)
        check_payload_size(reply.content, self.settings.max_payload_mb, sender=sender)
        payload = decode(reply.content, message_type, layouts, sender=sender)
        header = payload.message.header
        self._check_header(header, server_round)
        self.identities.check(node, header.client_id, self.connected, claimed)
        examples = payload.message.num_examples
        if not 1 <= examples <= self.settings.max_client_examples:
            raise PayloadError(f"field 'num_examples': {examples} is not in [1, max-client-examples="
                               f"{self.settings.max_client_examples}]")
        if check is not None:
            check(payload)
        return payload

    def _check_header(self, header: pb.Header, server_round: int) -> None:
        if header.server_round != server_round:
            raise PayloadError(f"field 'header.server_round': the reply is for round {header.server_round}, "
                               f"not {server_round}")
        if header.federation != self.settings.federation:
            raise PayloadError(f"field 'header.federation': {header.federation[:64]!r} is not this federation")
        for name in ("accepted_rounds", "checkpointed_rounds", "forgotten_client_id"):
            if getattr(header, name):
                raise PayloadError(f"field 'header.{name}': only the server sets it")

    def _leave_request(self, reply: Message, server_round: int) -> None:
        """A client's LeaveAndForget, sent instead of its reply: nothing of it enters the round. A well-formed one is
        kept in `leave_requests` for server/forget.py, which decides it after the round is committed and honours it
        only from the node the client id is bound to."""
        node = reply.metadata.src_node_id
        label = self._claimed_label(reply, pb.LeaveAndForget)
        try:
            check_payload_size(reply.content, self.settings.max_payload_mb, sender=label)
            header = decode(reply.content, pb.LeaveAndForget, {}, sender=label).message.header
            self._check_header(header, server_round)
        except Exception as error:  # the guard, as for every reply
            reason = str(error) if isinstance(error, PayloadError) else f"{type(error).__name__}: {error}"
            self._reject(label, f"rejected leave request: {reason.removeprefix(f'{label}: ')}", node)
            return
        self.leave_requests.append((header.client_id, node))
        self._reject(label, "asked to leave and be forgotten: it sent no update, and the request is decided once this "
                     "round is committed", node, refused=False)

    def check_resumed(self, payload: Payload, consequence: str) -> bool:
        """A stateful strategy's check: the reply must continue from the state of the client's last accepted round,
        or start afresh (a new client, or one that lost its state: logged with `consequence`); anything else
        belongs to a round the server never used. True when it continued."""
        message = payload.message
        client = message.header.client_id
        accepted = self.accepted_rounds.get(client, 0)
        if message.resumed_from_round not in (0, accepted):
            raise PayloadError(f"field 'resumed_from_round': {message.resumed_from_round}, but the last round the "
                               f"server accepted from client {client!r} is {accepted}")
        if accepted and message.resumed_from_round == 0:
            log(WARNING, "client %r lost its state of round %d; %s", client, accepted, consequence)
        return message.resumed_from_round != 0

    def commit(self, payloads: Iterable[Payload], server_round: int) -> None:
        """The strategy has absorbed these replies into its state: bind their ids, record the round."""
        for payload in payloads:
            client = payload.message.header.client_id
            self.identities.bind(self._reply_nodes[client], client)
            self.identities.ledger.record_contribution(client, server_round)
            self.accepted_rounds[client] = server_round
            self.round_report.accepted.append(client)

    def node_label(self, node: int) -> str:
        client = self.identities.client_of(node)
        return f"client {client!r} (node {node})" if client else f"node {node}"

    def _claimed_label(self, reply: Message, message_type: type[ProtoMessage]) -> str:
        node = reply.metadata.src_node_id
        claimed = claimed_client_id(reply.content, message_type)
        known = self.identities.client_of(node)
        if claimed and known and claimed != known:
            return f"client {known!r} (node {node}) claiming to be client {claimed[:64]!r}"
        if claimed and not known:
            return f"client {claimed[:64]!r} (node {node})"
        return self.node_label(node)

    def _reject(self, label: str, reason: str, node: int, refused: bool = True) -> None:
        """Leave one reply of `node` out of the round, with the reason (logged and reported; when `refused`, it
        counts towards the node's quarantine)."""
        if len(reason) > MAX_REASON:  # reasons quote what the sender sent: bound what a reply can make us log
            reason = f"{reason[:MAX_REASON]}... ({len(reason)} characters)"
        self.round_report.rejected[label] = reason
        if refused:
            self._refused_nodes.add(node)
        log(WARNING, "%s: %s", label, reason)

    # ---- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> ServerState:
        """Everything a restarted server needs besides the global arrays (which the loop checkpoints itself):
        the core's bound identities and accepted rounds, plus what a subclass adds (call super() first)."""
        wire = {"identities": self.identities.to_metadata(), "accepted_rounds": self.accepted_rounds,
                "quarantine": self.quarantine.to_metadata(), "forget-ledger": self.identities.ledger.to_metadata()}
        return ServerState(metadata={WIRE_STATE_KEY: json.dumps(wire)})

    def load_state_dict(self, state: ServerState) -> None:
        """Continue from `state_dict()` as saved by an earlier server process (subclasses: call super() first)."""
        wire = json.loads(state.metadata[WIRE_STATE_KEY])
        self.identities.restore(wire["identities"])
        self.accepted_rounds = {client: int(r) for client, r in wire["accepted_rounds"].items()}
        self.quarantine.restore(wire["quarantine"])
        if "forget-ledger" in wire:  # a checkpoint written before forgetting existed: no forget, no contributions kept
            self.identities.ledger = ForgetLedger.from_metadata(wire["forget-ledger"])
        self.checkpoint_written(state)

    def checkpoint_written(self, state: ServerState) -> None:
        """A checkpoint holding `state` (from `state_dict()`) is on disk: the loop wrote it, or the server resumed
        from it. A server restarted now would resume from it and name its accepted rounds to the clients again, so
        from here on every instruction asks the clients to keep those rounds' states (Header.checkpointed_rounds)."""
        wire = json.loads(state.metadata[WIRE_STATE_KEY])
        self.checkpointed_rounds = {client: int(r) for client, r in wire["accepted_rounds"].items()}

    def posterior_samples(self, count: int, generator) -> list[dict]:
        """Weight samples of the global posterior for a predictive ensemble; none for point estimates."""
        return []

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the global posterior (`fedbayes export`); here a point estimate."""
        return GlobalPosterior(f"a point estimate: {self.settings.strategy} holds no posterior beyond its global model")

    # The server evaluates the global model centrally; Flower's federated evaluation is not used.
    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None

    def summary(self) -> None:
        log(INFO, "%s: %s", type(self).__name__, self.settings.strategy)


@dataclass
class Membership:
    """The clients a server has accepted a reply from: each one's N_k and the last round it replied in.
    FedDyn and FedLap take K and N from here (../shared/specs/feddyn-fedlap-splits.md §9 P14: "the server
    learns N_k from num_examples"), so K grows when a client joins and never shrinks when one vanishes."""

    examples: dict[str, int] = field(default_factory=dict)
    last_round: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Membership:
        return Membership(dict(self.examples), dict(self.last_round))

    def without(self, client: str) -> Membership:
        """A copy without `client` (forgotten): K and N no longer count it."""
        return Membership({c: n for c, n in self.examples.items() if c != client},
                          {c: r for c, r in self.last_round.items() if c != client})

    def record(self, client: str, num_examples: int, server_round: int) -> None:
        self.examples[client] = num_examples
        self.last_round[client] = server_round

    @property
    def clients(self) -> int:
        return len(self.examples)

    @property
    def total_examples(self) -> int:
        return sum(self.examples.values())

    def to_metadata(self) -> dict[str, str]:
        return {"examples": json.dumps(self.examples), "last_round": json.dumps(self.last_round)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> Membership:
        return cls(json.loads(metadata["examples"]), json.loads(metadata["last_round"]))


def client_population(known_clients: int, known_examples: int, num_examples: int, fresh: bool) -> tuple[int, int]:
    """(K, N) as a client sees them: the server's counts, plus this client itself when it has no state yet
    after round 1 (the server has not heard of it). N = 0 means the server knows no sizes yet (round 1)."""
    if fresh and known_examples > 0:
        return known_clients + 1, known_examples + num_examples
    return max(known_clients, 1), known_examples
