"""The server's round core: what every strategy's rounds share, around the strategy's hooks (strategies/base.py).

  configure   the nodes that may take part (connected, not quarantined, the client registry re-read), the ones the
              strategy selects, and one message per node: the strategy's instruction with the core's header (the
              rounds that node's client had accepted, those the newest checkpoint holds, a forget's confirmation, a
              nonce of its own), the model's buffers and what it asks of the clients' held-out evaluation; returned
              as the round's plan (RoundPlan), which the loop hands back to aggregate with the replies
  aggregate   the trust boundary: every reply decoded and checked inside one guard (wire schema, round, federation,
              the nonce of the instruction it answers, the client id bound to its node, num_examples,
              resumed_from_round, the held-out metrics (server/client_metrics.py), then the strategy's own checks),
              each update screened against the others
              (server/isolation.py), the round committed from the replies that make a usable state (the strategy's
              `absorb`, checked as it will be stored), refused nodes quarantined; what the checks find goes from
              check to check as one record (CheckedReplies), not kept by the core; then the round's outcome as a
              value (RoundOutcome: the strategy's weights and the clients' averaged buffers, the metrics, who took
              part, and the leave requests that forgetting decides once the round is committed)
  state       the core's part of a checkpoint (identities, accepted rounds, quarantine, the forget ledger) and the
              strategy's, saved and restored together

The loop (server/loop.py) drives it; forgetting (server/forget/) commits through the interface it needs of the core
(server/forget/interface.py BetweenRounds). The strategy's state changes only through its `commit`, once a round or a
forget is committed."""

from __future__ import annotations

import hmac
import json
import random
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.params import TensorLayout, flatten, unflatten, weighted_mean
from fedbayes.bayes.robust import norms, screen_bounds
from fedbayes.flowerseam.constants import ErrorCode
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import (
    NONCE_BYTES,
    Layouts,
    Payload,
    PayloadError,
    check_payload_size,
    claimed_client_id,
    decode,
    encode,
    envelope_type,
    new_header,
    with_envelope,
)
from fedbayes.server.client_metrics import ClientMetrics, check_evaluation, client_entry, evaluation_request
from fedbayes.server.identity import ClientIdentities, ForgetLedger
from fedbayes.server.isolation import Quarantine, usable_subset
from fedbayes.strategies.base import (
    NodePool,
    RoundRejected,
    ServerState,
    ServerStrategy,
    TensorGroups,
    Update,
)
from fedbayes.tasks.config import RunSettings, round_seed

CORE_STATE_KEY = "fedbayes/wire"  # the core's part of a checkpoint's strategy metadata
MAX_REASON = 400  # characters of a rejection reason that are logged and reported


@dataclass
class RoundReport:
    """Who took part in the last round: the nodes sent work, the accepted client ids, why others were left out, the
    clients whose accepted reply started afresh although the server held an accepted round of theirs (they lost
    their state), the nodes that sit out rounds (quarantined: label -> the last round it sits out), what the strategy
    warned of (its `Update.warning`), and the accepted clients' held-out metrics (client-eval-fraction)."""

    sent: int = 0
    accepted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "client 'client-3' (node 42)" -> reason
    fresh_starts: list[str] = field(default_factory=list)
    quarantined: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # the accepted clients' held-out metrics (server/client_metrics.py); None: the round asked for none
    client_metrics: ClientMetrics | None = None


@dataclass(frozen=True)
class RoundPlan:
    """One round as `configure` planned it: its number, the nodes connected as it was configured (those whose
    client ids a reply may not take), and its messages, one per node sent work. The loop sends the messages and
    hands the plan, with the replies, to `aggregate`."""

    server_round: int
    connected: tuple[int, ...]
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class RoundOutcome:
    """What one round's aggregate made: the new global arrays and the round's metrics (both None when no reply was
    usable or absorbing them failed: nothing changed), who took part (the round's report, built by that aggregate
    alone), and the (client id, node) of each well-formed LeaveAndForget sent instead of a reply, which forgetting
    (server/forget/) decides once the round is committed."""

    arrays: ArrayRecord | None
    metrics: MetricRecord | None
    report: RoundReport
    leave_requests: tuple[tuple[str, int], ...] = ()


@dataclass
class CheckedReplies:
    """One aggregate's record of its replies as the checks go: the plan they answer, the report the aggregate
    returns, the node of each client whose reply passed the checks, the nodes whose reply was refused (their
    quarantine counts them) and the leave requests. Built by that aggregate and passed from check to check; the core
    keeps none of it."""

    plan: RoundPlan
    report: RoundReport
    nodes: dict[str, int] = field(default_factory=dict)  # client id -> node
    refused: set[int] = field(default_factory=set)
    leave_requests: list[tuple[str, int]] = field(default_factory=list)

    def node_of(self, payload: Payload[Any]) -> int:
        """The node whose reply `payload` is.

        Args:
            payload: a reply that passed the checks this round.

        Returns:
            The node it came from.
        """
        return self.nodes[payload.header.client_id]


@dataclass(frozen=True)
class Change:
    """A change of the federation's state decided between rounds rather than by one (server/forget/: a forget or a
    readmission): the strategy's new state (None: unchanged), the client whose accepted round goes (None: none), and
    the ledger's record of the decision (None: none), a "forgotten" one revoking its client's id, unbinding it and
    dropping its contributions, a "readmitted" one lifting the revocation."""

    strategy_state: Any = None
    dropped: str | None = None
    record: Mapping[str, Any] | None = None


def sample_nodes(nodes: Iterable[int], fraction: float, minimum: int, seed: int, server_round: int) -> list[int]:
    """The nodes to train this round: a `fraction` of the connected ones (at least `minimum`), drawn with a
    per-round seed so that a server resumed from its checkpoint draws as an uninterrupted one would.

    Args:
        nodes: the nodes to draw from.
        fraction: the share of them to draw (run config fraction-train).
        minimum: the fewest to draw, where there are as many (min-clients).
        seed: the run's seed.
        server_round: the round, mixed into the seed.

    Returns:
        The nodes drawn, sorted.
    """
    nodes = sorted(nodes)
    count = min(len(nodes), max(minimum, round(fraction * len(nodes))))
    return sorted(random.Random(round_seed(seed, server_round)).sample(nodes, count))


def non_finite(value: Any, what: str) -> str | None:
    """Why `value` (arrays, tensors, and the dicts, lists and dataclasses holding them) cannot be stored.

    Args:
        value: what would be stored.
        what: its name, which the reason starts with (an entry's is its path under it, "the state/sites/a").

    Returns:
        "<name of the first non-finite entry> would hold NaN or Inf", or None when every entry is finite.
    """
    if isinstance(value, (np.ndarray, torch.Tensor)):
        finite = torch.isfinite(value).all() if isinstance(value, torch.Tensor) else np.isfinite(value).all()
        return None if finite else f"{what} would hold NaN or Inf"
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif is_dataclass(value) and not isinstance(value, type):
        items = ((item.name, getattr(value, item.name)) for item in fields(value))
    else:
        return None
    return next((problem for key, item in items if (problem := non_finite(item, f"{what}/{key}"))), None)


def round_metrics(payloads: list[Payload[Any]], **extra: float) -> MetricRecord:
    """What every round reports of its accepted replies.

    Args:
        payloads: the round's accepted replies (at least one).
        **extra: the strategy's own metrics (Update.metrics).

    Returns:
        The example-weighted training loss ("train-loss"), the mean compute seconds ("compute-seconds") and `extra`.
    """
    replies = [payload.reply for payload in payloads]
    examples = np.array([reply.num_examples for reply in replies], dtype=np.float64)
    return MetricRecord(
        {
            "train-loss": float(np.average([reply.train_loss for reply in replies], weights=examples)),
            "compute-seconds": float(np.mean([reply.compute_seconds for reply in replies])),
            **extra,
        }
    )


class RoundCore:
    """One federation's round core around one strategy (module docstring)."""

    def __init__(self, settings: RunSettings, strategy: ServerStrategy[Any]) -> None:
        self.settings = settings
        self.strategy = strategy
        self._trust = settings.trust
        self.identities = ClientIdentities(
            self._trust.client_identity, self._trust.max_clients, self._trust.client_registry
        )
        self.quarantine = Quarantine(self._trust.max_client_rejections, self._trust.quarantine_rounds)
        self.accepted_rounds: dict[str, int] = {}  # client id -> last round whose reply was accepted
        self.checkpointed_rounds: dict[str, int] = {}  # accepted_rounds as the newest checkpoint on disk holds them
        # the nodes connected when the last round was configured: between rounds, a forget's message to a node and
        # the check of its answer judge against them, as that round's did
        self._connected: list[int] = []
        # node -> the nonce of the last message sent to it (this round's instruction, or a forget's message between
        # rounds): the only reply it may send is the answer to that message. Never checkpointed: a resumed server
        # refuses every answer to its predecessor's messages.
        self._nonces: dict[int, bytes] = {}
        self.client_examples: dict[str, int] = {}  # client id -> num_examples of its last accepted reply

    @property
    def buffer_layout(self) -> TensorLayout:
        """The layout of the model's buffers (BatchNorm statistics; empty for a model without)."""
        return self.strategy.buffer_layout

    # ---- what the core knows of the clients (server/forget/) ------------------------------------------------------
    def client_of(self, node: int) -> str | None:
        """The client id bound to `node`.

        Args:
            node: a node id.

        Returns:
            Its client id, or None where none is bound to it.
        """
        return self.identities.client_of(node)

    def bound_node(self, client: str) -> int | None:
        """The node `client` is bound to.

        Args:
            client: a client id.

        Returns:
            Its node, or None where it is bound to none.
        """
        return self.identities.bound_node(client)

    def last_accepted(self) -> dict[str, int]:
        """The last accepted round of every client.

        Returns:
            Client id -> the last round whose reply of it was accepted (a copy).
        """
        return dict(self.accepted_rounds)

    def ledger_records(self) -> tuple[dict[str, Any], ...]:
        """Every forget and readmission applied (server/identity.py ForgetLedger).

        Returns:
            Their records, oldest first.
        """
        return self.identities.ledger.records

    def forget_of(self, client: str) -> dict[str, Any] | None:
        """The record of the last forget of `client`.

        Args:
            client: a client id.

        Returns:
            The record, if its id is revoked; None otherwise.
        """
        return self.identities.ledger.forget_of(client)

    def contributed_rounds(self, client: str) -> list[list[int]]:
        """The rounds whose reply of `client` was accepted.

        Args:
            client: a client id.

        Returns:
            Those rounds as [first, last] ranges, oldest first (none: no reply of it was accepted).
        """
        return self.identities.ledger.contributed.get(client, [])

    # ---- configure -------------------------------------------------------------------------------------------------
    def configure(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> RoundPlan:
        """This round's plan: the strategy's instruction to the nodes it selects, one message per node.

        Args:
            server_round: the round to configure.
            arrays: the global arrays the round starts from.
            grid: the nodes connected now.

        Returns:
            The round's plan: its messages, and what `aggregate` checks their replies against.
        """
        nodes = self.strategy.select_nodes(self.node_pool(grid, server_round), server_round)
        body, tensors = self.strategy.instruction(server_round, arrays, nodes)
        instruction = pb.Instruction(header=new_header(self.settings.federation, server_round))
        request = evaluation_request(self.settings)
        if request is not None:
            instruction.client_evaluation.CopyFrom(request)
        buffers = {name: arrays[name].numpy() for name in self.buffer_layout}
        return self.instructions(instruction, body, {**tensors, "buffers": buffers}, nodes)

    def node_pool(self, grid: Grid, server_round: int) -> NodePool:
        """The nodes connected as this round starts that are not quarantined (the operator's client registry is
        re-read first), and what the core knows of them. They are the connected nodes the round's messages and, until
        the next round is configured, the messages between rounds judge against.

        Args:
            grid: the nodes connected now.
            server_round: the round about to start.

        Returns:
            The eligible nodes, the seeded fraction-train sample of them, and the clients bound to them and their
            accepted rounds (strategies/base.py NodePool).
        """
        self.identities.refresh_registry()
        self._connected = sorted(grid.get_node_ids())
        eligible = [node for node in self._connected if not self.quarantine.excludes(node, server_round)]
        sample = sample_nodes(
            eligible, self.settings.fraction_train, self.settings.min_clients, self.settings.seed, server_round
        )
        return NodePool(eligible, sample, self.identities.client_of, dict(self.accepted_rounds), self.node_label)

    def instructions(
        self, instruction: pb.Instruction, body: ProtoMessage, tensors: TensorGroups, nodes: Iterable[int]
    ) -> RoundPlan:
        """One TRAIN message per node: the strategy's `body` and the tensors are packed once and shared; each header
        carries the rounds that node's client had accepted (Header.accepted_rounds), so it continues from the right
        state, those the newest checkpoint holds (Header.checkpointed_rounds), whose states it must keep, and a nonce
        of its own (Header.nonce), which that node's reply must echo. The nonces of earlier messages are forgotten.

        Args:
            instruction: the envelope, with the round's header.
            body: the strategy's instruction.
            tensors: the tensor groups every node is sent.
            nodes: the nodes to send work to.

        Returns:
            The round's plan: the round of `instruction`'s header, the nodes connected as it was configured, and the
            messages, in the order of `nodes`.
        """
        content = encode(instruction, body, tensors)
        self._nonces = {}
        messages = tuple(self._addressed(content, instruction, node, self.checkpointed_rounds) for node in nodes)
        return RoundPlan(instruction.header.server_round, tuple(self._connected), messages)

    def _addressed(
        self, content: RecordDict, instruction: pb.Instruction, node: int, checkpointed: Mapping[str, int]
    ) -> Message:
        """`content` as the message to `node`, its header telling that node's accepted and checkpointed rounds, the
        forget of its client, if it asked for one (Header.forgotten_client_id), and a new nonce (Header.nonce): from
        here on, only an answer to this message is taken from `node`."""
        header = instruction.header
        for field_, rounds in (
            (header.accepted_rounds, self.accepted_rounds),
            (header.checkpointed_rounds, checkpointed),
        ):
            field_.clear()
            field_.update(self.identities.accepted_view(node, rounds, self._connected))
        header.forgotten_client_id = self.identities.ledger.confirmation_for(node)
        header.nonce = self._nonces[node] = secrets.token_bytes(NONCE_BYTES)
        return Message(with_envelope(content, instruction), dst_node_id=node, message_type=MessageType.TRAIN)

    # ---- aggregate -------------------------------------------------------------------------------------------------
    def aggregate(
        self,
        plan: RoundPlan,
        replies: Iterable[Message],
        errors: Mapping[int, Error] | None = None,
        absent: Mapping[int, str] | None = None,
    ) -> RoundOutcome:
        """The round from the replies that pass every check and make a usable state, the strategy's state committed.
        Guarded: an error while absorbing the round (a reply the strategy should have refused, or a bug) is logged
        and leaves the state as it was (the core commits last); the round then changes nothing.

        Args:
            plan: the round's plan (`configure`), whose messages the replies answer.
            replies: the replies received this round.
            errors: node -> the error it answered with instead of a reply (the node the instruction went to: the
                SuperLink answers for a node it saw go offline from a node id of its own).
            absent: node -> why it sent nothing usable in time (round-timeout, straggler-wait).

        Returns:
            The round's new arrays and metrics (both None when no reply was usable or absorbing them failed) and
            its report: who was sent work, accepted, left out and why, quarantined.
        """
        server_round = plan.server_round
        evaluated = evaluation_request(self.settings) is not None
        report = RoundReport(sent=len(plan.messages), client_metrics={} if evaluated else None)
        checked = CheckedReplies(plan, report)
        for node, error in (errors or {}).items():  # before the round's quarantine is decided: an error is a refusal
            self._client_error(checked, node, error)
        arrays: ArrayRecord | None = None
        metrics: MetricRecord | None = None
        try:
            arrays, metrics = self._absorbed(checked, server_round, replies)
        except Exception as error:
            log(
                ERROR,
                "round %d: absorbing the replies failed (%s: %s); the round changes nothing",
                server_round,
                type(error).__name__,
                error,
                exc_info=True,
            )
            report.accepted.clear()
            if report.client_metrics is not None:
                report.client_metrics.clear()
            report.rejected["round"] = f"the server could not absorb the replies: {type(error).__name__}: {error}"
        for node, why in (absent or {}).items():
            report.rejected[self.node_label(node)] = why
        return RoundOutcome(arrays, metrics, report, tuple(checked.leave_requests))

    def _absorbed(
        self, checked: CheckedReplies, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's new arrays and metrics from `replies` (None, None: no reply was usable, nothing changes), the
        round's refusals, acceptances, quarantines and leave requests recorded in `checked`."""

        def layouts(message: ProtoMessage) -> dict[str, TensorLayout]:
            return {**self.strategy.reply_layouts_for(message), "buffers": self.buffer_layout}

        payloads = self.decode_replies(checked, replies, layouts)
        payloads, update_norms = self._screened(checked, payloads)
        isolated = usable_subset(payloads, lambda subset: self._candidate(subset, server_round), update_norms)
        for payload, reason in isolated.left_out:
            node = checked.node_of(payload)
            label = f"client {payload.header.client_id!r} (node {node})"
            self._reject(checked, label, f"{self.settings.strategy}: {reason}", node)
        self._quarantined_after(checked, server_round, isolated.used)
        if not isolated.used:
            return None, None
        weights, update = isolated.result
        self._commit(checked, isolated.used, server_round)
        self.strategy.commit(update.state)
        if update.warning:
            log(WARNING, "round %d: %s", server_round, update.warning)
            checked.report.warnings.append(update.warning)
        return (
            ArrayRecord({name: Array(value) for name, value in weights.items()}),
            round_metrics(isolated.used, **update.metrics),
        )

    def decode_replies(
        self,
        checked: CheckedReplies,
        replies: Iterable[Message],
        layouts: Callable[[ProtoMessage], Layouts],
    ) -> list[Payload[Any]]:
        """The replies of this round that pass every check, in client-id order (so aggregates do not depend on
        arrival order). Anything wrong with a reply, whatever it raises, rejects that reply alone, logged with its
        client id, node id and the field; nothing about it is kept.

        Args:
            checked: the round's record so far (with the plan the replies answer); each passing reply's node, each
                refusal and each leave request are added to it.
            replies: the replies received this round.
            layouts: a reply body's tensor layouts, by its message.

        Returns:
            The replies that pass every check, sorted by client id.
        """
        server_round = checked.plan.server_round
        accepted: list[Payload[Any]] = []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                self._client_error(checked, node, reply.error)
                continue
            if envelope_type(reply.content) == pb.LeaveAndForget.DESCRIPTOR.full_name:
                self._leave_request(checked, reply, server_round)
                continue
            try:
                payload = self._checked_reply(reply, layouts, checked)
            except Exception as error:  # the guard: no reply may stop the server
                self._reject_reply(checked, reply, "rejected reply", error)
                continue
            checked.nodes[payload.header.client_id] = node
            accepted.append(payload)
        log(
            INFO,
            "round %d: %d replies pass the checks, %d left out",
            server_round,
            len(accepted),
            len(checked.report.rejected),
        )
        return sorted(accepted, key=lambda payload: payload.header.client_id)

    def _checked_reply(
        self, reply: Message, layouts: Callable[[ProtoMessage], Layouts], checked: CheckedReplies
    ) -> Payload[Any]:
        """`reply` decoded and checked against the round's plan and the replies that passed before it in `checked`;
        PayloadError (or whatever the strategy's check raises) when anything is wrong."""
        node = reply.metadata.src_node_id
        sender = self.reply_label(reply)
        check_payload_size(reply.content, self._trust.max_payload_mb, sender=sender)
        payload = decode(reply.content, pb.Reply, self.strategy.reply_type, layouts, sender=sender)
        header = payload.header
        self._check_header(header, checked.plan.server_round, node)
        self.identities.check(node, header.client_id, checked.plan.connected, checked.nodes)
        examples = payload.reply.num_examples
        if not 1 <= examples <= self._trust.max_client_examples:
            raise PayloadError(
                f"field 'num_examples': {examples} is not in [1, max-client-examples={self._trust.max_client_examples}]"
            )
        self._check_resumed(payload)
        check_evaluation(payload.reply, evaluation_request(self.settings) is not None, self._trust.max_client_examples)
        self.strategy.check_reply(payload)
        return payload

    def _check_header(self, header: pb.Header, server_round: int, node: int) -> None:
        """A reply's header from `node`: of this round and federation, no field only the server sets, and the nonce
        of the message the server last sent `node` (it answers that message, not an earlier one nor another node's)."""
        if header.server_round != server_round:
            raise PayloadError(
                f"field 'header.server_round': the reply is for round {header.server_round}, not {server_round}"
            )
        if header.federation != self.settings.federation:
            raise PayloadError(f"field 'header.federation': {header.federation[:64]!r} is not this federation")
        for name in ("accepted_rounds", "checkpointed_rounds", "forgotten_client_id"):
            if getattr(header, name):
                raise PayloadError(f"field 'header.{name}': only the server sets it")
        # in constant time: how long a refusal takes tells a sender nothing of the nonce it should have sent
        if not header.nonce or not hmac.compare_digest(header.nonce, self._nonces.get(node, b"")):
            raise PayloadError(
                f"field 'header.nonce': not the nonce of the server's last message to node {node}: the reply answers "
                "an earlier instruction (sent again, or late) or another node's"
            )

    def _check_resumed(self, payload: Payload[Any]) -> None:
        """The reply of a strategy whose clients keep state must continue from the state of the client's last
        accepted round, or start afresh (a new client, or one that lost its state: reported, with what that means
        for the algorithm); anything else belongs to a round the server never used."""
        if self.strategy.fresh_start is None:  # its clients keep no state
            return
        client, resumed = payload.header.client_id, payload.reply.resumed_from_round
        accepted = self.accepted_rounds.get(client, 0)
        if resumed not in (0, accepted):
            raise PayloadError(
                f"field 'resumed_from_round': {resumed}, but the last round the server accepted from "
                f"client {client!r} is {accepted}"
            )
        if accepted and resumed == 0:
            log(WARNING, "client %r lost its state of round %d; %s", client, accepted, self.strategy.fresh_start)

    def _leave_request(self, checked: CheckedReplies, reply: Message, server_round: int) -> None:
        """A client's LeaveAndForget, sent instead of its reply: nothing of it enters the round. A well-formed one is
        added to the round's leave requests (RoundOutcome.leave_requests) for server/forget/, which decides it after
        the round is committed and honours it only from the node the client id is bound to."""
        node = reply.metadata.src_node_id
        label = self.reply_label(reply)
        try:
            check_payload_size(reply.content, self._trust.max_payload_mb, sender=label)
            header = decode(reply.content, pb.LeaveAndForget, None, {}, sender=label).header
            self._check_header(header, server_round, node)
        except Exception as error:  # the guard, as for every reply
            self._reject_reply(checked, reply, "rejected leave request", error)
            return
        checked.leave_requests.append((header.client_id, node))
        self._reject(
            checked,
            label,
            "asked to leave and be forgotten: it sent no update, and the request is decided once this "
            "round is committed",
            node,
            refused=False,
        )

    def _screened(
        self, checked: CheckedReplies, payloads: list[Payload[Any]]
    ) -> tuple[list[Payload[Any]], dict[int, float]]:
        """The replies whose update passes the screen (bayes/robust.py screen_bounds: at most `screen-ratio` x the
        largest of the others' median per unit of expected size times this one's (`update_scale`), the state's norm
        and an RMS change of 1), and every reply's update norm by id()."""
        updates = [self.strategy.update_of(payload) for payload in payloads]
        measured = [update for update in updates if update is not None]
        if not payloads or len(measured) < len(updates):  # a strategy that screens nothing
            return payloads, {}
        update_norms = norms(measured)
        scales = np.array([self.strategy.update_scale(payload) for payload in payloads], dtype=np.float64)
        bounds = screen_bounds(
            update_norms, scales, self.strategy.state_norm(), measured[0].size, self._trust.screen_ratio
        )
        kept = []
        for payload, norm, bound in zip(payloads, update_norms, bounds):
            if norm <= bound:
                kept.append(payload)
                continue
            node = checked.node_of(payload)
            self._reject(
                checked,
                f"client {payload.header.client_id!r} (node {node})",
                f"refused by the screen: its update's norm {norm:.3g} "
                f"is over {bound:.3g} (screen-ratio={self._trust.screen_ratio:g} x the largest of the other "
                "updates' median norm for a client of its size, the state's and an RMS change of 1)",
                node,
            )
        return kept, {id(payload): float(norm) for payload, norm in zip(payloads, update_norms)}

    def _candidate(self, payloads: list[Payload[Any]], server_round: int) -> tuple[dict[str, np.ndarray], Update[Any]]:
        """The global arrays and the update these replies would make, checked as they would be stored (float32
        arrays, every tensor of the state finite); RoundRejected when unusable. Changes nothing."""
        buffers = self._averaged_buffers(payloads)
        update = self.strategy.absorb(payloads, server_round)
        with np.errstate(over="ignore"):  # a float32 overflow is what the check below is for
            weights = unflatten(update.weights, self.strategy.layout) | buffers
        problem = non_finite(weights, "the global model") or non_finite(update.state, "the state")
        if problem:
            raise RoundRejected(problem)
        return weights, update

    def _averaged_buffers(self, payloads: list[Payload[Any]]) -> dict[str, np.ndarray]:
        """The model's buffers (BatchNorm statistics) FedAvg-style, whatever the algorithm: the clients' buffers
        after their local training, weighted by their example counts (none for a model without buffers)."""
        if not self.buffer_layout:
            return {}
        average = weighted_mean(
            [flatten(p.tensors["buffers"], self.buffer_layout) for p in payloads],
            [p.reply.num_examples for p in payloads],
        ).astype(np.float32)
        if not np.isfinite(average).all():  # finite buffers can still overflow float32 together
            raise RoundRejected("the averaged model buffers are not finite")
        return unflatten(average, self.buffer_layout)

    def _quarantined_after(self, checked: CheckedReplies, server_round: int, used: list[Payload[Any]]) -> None:
        """Count this round's refusals per node; a node refused `max-client-rejections` rounds in a row sits out
        `quarantine-rounds` rounds (logged, and in the round report)."""
        accepted = {checked.node_of(payload) for payload in used}
        for node in self.quarantine.record(server_round, checked.refused, accepted):
            log(
                WARNING,
                "%s: refused %d rounds in a row; quarantined for rounds %d-%d (max-client-rejections, "
                "quarantine-rounds)",
                self.node_label(node),
                self._trust.max_client_rejections,
                server_round + 1,
                server_round + self._trust.quarantine_rounds,
            )
        checked.report.quarantined = {
            self.node_label(node): last for node, last in self.quarantine.active(server_round + 1).items()
        }

    def _commit(self, checked: CheckedReplies, payloads: Iterable[Payload[Any]], server_round: int) -> None:
        """These replies went into the round's state: bind their ids, record the round."""
        report = checked.report
        for payload in payloads:
            client = payload.header.client_id
            fresh = self.strategy.fresh_start is not None and payload.reply.resumed_from_round == 0
            if fresh and self.accepted_rounds.get(client):
                report.fresh_starts.append(client)
            self.identities.bind(checked.nodes[client], client)
            self.identities.ledger.record_contribution(client, server_round)
            self.accepted_rounds[client] = server_round
            self.client_examples[client] = payload.reply.num_examples
            report.accepted.append(client)
            if report.client_metrics is not None:
                report.client_metrics[client] = client_entry(payload.reply.evaluation)

    def _client_error(self, checked: CheckedReplies, node: int, error: Error) -> None:
        """`node` answered with an error instead of a reply. One the SuperLink made for a node it saw go offline
        (NODE_UNAVAILABLE) is absence, not a refusal: it does not count towards the node's quarantine."""
        self._reject(
            checked,
            self.node_label(node),
            f"client error: {error.reason}",
            node,
            refused=error.code != ErrorCode.NODE_UNAVAILABLE,
        )

    def examples_of(self, node: int) -> int | None:
        """The examples `node`'s client reported in its last accepted reply (the loop's straggler policy).

        Args:
            node: a node id.

        Returns:
            Its num_examples, or None where no reply of its client was accepted in this process.
        """
        client = self.identities.client_of(node)
        return self.client_examples.get(client) if client else None

    # ---- labels and rejections -----------------------------------------------------------------------------------
    def node_label(self, node: int) -> str:
        """How logs and round reports name `node`.

        Args:
            node: a node id.

        Returns:
            "client '<id>' (node <node>)" where a client id is bound to it, else "node <node>".
        """
        client = self.identities.client_of(node)
        return f"client {client!r} (node {node})" if client else f"node {node}"

    def reply_label(self, reply: Message) -> str:
        """How logs name the sender of `reply`.

        Args:
            reply: a reply as received.

        Returns:
            Its node with its bound client, or the client it claims to be (both where they differ).
        """
        node = reply.metadata.src_node_id
        claimed = claimed_client_id(reply.content)
        known = self.identities.client_of(node)
        if claimed and known and claimed != known:
            return f"client {known!r} (node {node}) claiming to be client {claimed[:64]!r}"
        if claimed and not known:
            return f"client {claimed[:64]!r} (node {node})"
        return self.node_label(node)

    def _reject_reply(self, checked: CheckedReplies, reply: Message, what: str, error: Exception) -> None:
        label = self.reply_label(reply)
        reason = str(error) if isinstance(error, PayloadError) else f"{type(error).__name__}: {error}"
        self._reject(checked, label, f"{what}: {reason.removeprefix(f'{label}: ')}", reply.metadata.src_node_id)

    def _reject(self, checked: CheckedReplies, label: str, reason: str, node: int, refused: bool = True) -> None:
        """Leave one reply of `node` out of the round, with the reason (logged, and in the round's report; when
        `refused`, it counts towards the node's quarantine)."""
        if len(reason) > MAX_REASON:  # reasons quote what the sender sent: bound what a reply can make us log
            reason = f"{reason[:MAX_REASON]}... ({len(reason)} characters)"
        checked.report.rejected[label] = reason
        if refused:
            checked.refused.add(node)
        log(WARNING, "%s: %s", label, reason)

    # ---- state -----------------------------------------------------------------------------------------------------
    def state_dict(self, change: Change | None = None) -> ServerState:
        """Everything a restarted server needs besides the global arrays (which the loop checkpoints itself): the
        strategy's state and the core's bound identities, accepted rounds, quarantine and forget ledger; as they
        are, or as `change` would make them (nothing is changed).

        Args:
            change: a change to save the state as it would make it (None: the state as it is).

        Returns:
            The strategy's `save_state`, with the core's part in its metadata (CORE_STATE_KEY).
        """
        change = change or Change()
        identities = self._identities_after(change)
        strategy_state = self.strategy.state if change.strategy_state is None else change.strategy_state
        state = self.strategy.save_state(strategy_state)
        core = {
            "identities": identities.to_metadata(),
            "accepted_rounds": self._accepted_after(change),
            "quarantine": self.quarantine.to_metadata(),
            "forget-ledger": identities.ledger.to_metadata(),
        }
        state.metadata[CORE_STATE_KEY] = json.dumps(core)
        return state

    def load_state_dict(self, state: ServerState) -> None:
        """Continue from `state_dict()` as saved by an earlier server process.

        Args:
            state: what `state_dict()` returned.
        """
        core = json.loads(state.metadata[CORE_STATE_KEY])
        self.identities.restore(core["identities"])
        self.accepted_rounds = {client: int(r) for client, r in core["accepted_rounds"].items()}
        self.quarantine.restore(core["quarantine"])
        self.identities.ledger = ForgetLedger.from_metadata(core["forget-ledger"])
        self.strategy.commit(self.strategy.load_state(state))
        self.checkpoint_written(state)

    def checkpoint_written(self, state: ServerState) -> None:
        """A checkpoint holding `state` (from `state_dict()`) is on disk: the loop wrote it, or the server resumed
        from it. A server restarted now would resume from it and name its accepted rounds to the clients again, so
        from here on every instruction asks the clients to keep those rounds' states (Header.checkpointed_rounds).

        Args:
            state: the checkpoint's strategy state, as `state_dict()` made it.
        """
        core = json.loads(state.metadata[CORE_STATE_KEY])
        self.checkpointed_rounds = {client: int(r) for client, r in core["accepted_rounds"].items()}

    def adopt(self, change: Change) -> None:
        """Take a committed change (a forget's or a readmission's, server/forget/) as the federation's state.

        Args:
            change: the change, committed (its checkpoint is on disk).
        """
        self.identities = self._identities_after(change)
        self.accepted_rounds = self._accepted_after(change)
        if change.strategy_state is not None:
            self.strategy.commit(change.strategy_state)

    def _identities_after(self, change: Change) -> ClientIdentities:
        """A copy of the identities with the change's record applied (these themselves when it has none)."""
        record = change.record
        if record is None:
            return self.identities
        apply = self.identities.readmitting if record["event"] == "readmitted" else self.identities.forgetting
        return apply(record["client"], record)

    def _accepted_after(self, change: Change) -> dict[str, int]:
        return {client: r for client, r in self.accepted_rounds.items() if client != change.dropped}

    # ---- one message between rounds (server/forget/) ----------------------------------------------------------------
    def message_between_rounds(
        self, server_round: int, node: int, body: ProtoMessage | None = None, tensors: TensorGroups | None = None
    ) -> Message:
        """A message to `node` between rounds, outside any round's bookkeeping (server/forget/: the part of a forget
        only the node's client can compute, or, with no body, the confirmation that its client is forgotten). Its
        header is the one the node's instructions carry (the accepted round: the state the client works from; a
        forget's confirmation), for round `server_round`, the round it follows, with a new nonce.

        Args:
            server_round: the round the message follows.
            node: the node to send it to.
            body: the strategy's message (None: the confirmation that the node's client is forgotten).
            tensors: the message's tensor groups.

        Returns:
            The TRAIN message; from here on only its answer is taken from `node`.
        """
        instruction = pb.Instruction(header=new_header(self.settings.federation, server_round))
        content = encode(instruction, body, tensors or {})
        return self._addressed(content, instruction, node, self.checkpointed_rounds)

    def checked_lone_reply(
        self, reply: Message, client: str, reply_type: Any, layouts: Layouts, server_round: int
    ) -> Payload[Any]:
        """`client`'s answer to `message_between_rounds`, checked as a round's reply is.

        Args:
            reply: the node's answer.
            client: the client id it must be of.
            reply_type: the reply's body type (the wire schema), with `layouts` its tensors'.
            layouts: the layouts of the reply's tensor groups.
            server_round: the round the message followed.

        Returns:
            The decoded reply: no client error, its size, wire schema, round, federation, the nonce of that message,
            the client id, the node it is bound to and the strategy's own checks all passed.

        Raises:
            PayloadError: naming what is wrong; whatever the strategy's check raises, as it raises it.
        """
        label = self.reply_label(reply)
        if reply.has_error():
            raise PayloadError(f"client error: {reply.error.reason}")
        check_payload_size(reply.content, self._trust.max_payload_mb, sender=label)
        payload = decode(reply.content, pb.Reply, reply_type, layouts, sender=label)
        self._check_header(payload.header, server_round, reply.metadata.src_node_id)
        if payload.header.client_id != client:
            raise PayloadError(f"field 'header.client_id': {payload.header.client_id[:64]!r} is not {client!r}")
        self.identities.check(reply.metadata.src_node_id, client, self._connected, {})
        self.strategy.check_reply(payload)
        return payload
