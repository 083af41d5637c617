"""Settling forget requests against a round core: deciding each, applying it through the strategy's `forget`,
committing it (checkpoint, older checkpoints, audit line, request file, in that order), and how many rounds a
forget's refinement asks the federation to run (the package docstring has the whole protocol)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.common import log

from fedbayes.bayes.params import unflatten
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.server.forget.audit import AUDIT_LOG, AuditLog
from fedbayes.server.forget.client_part import checked_forget_reply
from fedbayes.server.forget.interface import BetweenRounds
from fedbayes.server.forget.requests import (
    REQUESTS_DIRECTORY,
    ForgetRequest,
    RequestQueue,
    not_a_client_id,
    refinement_problem,
)
from fedbayes.server.round_core import Change, non_finite
from fedbayes.strategies.base import ClientForget, ForgetRefused, Forgotten
from fedbayes.tasks.storage import fsync_directory

Arrays = dict[str, np.ndarray]


@dataclass(frozen=True)
class ClientLink:
    """How a running server reaches one node between rounds (server/loop.py builds it on its grid): the nodes
    connected now, and `ask(message)`: the node's reply, or why none came (a client error, no reply within
    round-timeout)."""

    connected: Callable[[], Collection[int]]
    ask: Callable[[Message], Message | str]


class Forgetting:
    """One federation's forget requests, settled against a round core whose state is that of the newest checkpoint,
    `store`'s: a running server's (server/loop.py), or one rebuilt from the checkpoint (`settle_stopped`). `link`: a
    running server's way to its nodes, for the strategies whose forget needs the client's own part (ClientForget);
    None on a stopped federation, which refuses those."""

    def __init__(
        self,
        store: CheckpointStore,
        link: ClientLink | None = None,
        on_record: Callable[[Mapping[str, Any]], None] = lambda record: None,
    ) -> None:
        self.store = store
        self.link = link
        self.federation = store.directory.name
        self.queue = RequestQueue(store.directory / REQUESTS_DIRECTORY)
        self.audit = AuditLog(store.directory / AUDIT_LOG, on_record)

    def has_work(self, leave_requests: Sequence[tuple[str, int]]) -> bool:
        """Whether there is anything to settle: the round's `leave_requests` ((client id, node) of each LeaveAndForget
        the round received, RoundOutcome.leave_requests), or a queued request.

        Args:
            leave_requests: the round's leave requests.

        Returns:
            True when `settle` has a request to decide.
        """
        return bool(leave_requests) or self.queue.waiting()

    def settle(
        self,
        core: BetweenRounds,
        arrays: Arrays,
        server_round: int,
        wall_seconds: float,
        own: tuple[ForgetRequest, ...] = (),
        leave_requests: Sequence[tuple[str, int]] = (),
    ) -> Arrays:
        """Finish what a crash interrupted, then decide the round's client requests, the queued ones and `own` (an
        operator's on a stopped federation), in that order.

        Args:
            core: the round core, in the state of the newest checkpoint.
            arrays: the global arrays of that checkpoint.
            server_round: the newest checkpoint's round, whose state `core` and `arrays` are.
            wall_seconds: the federation's wall-clock seconds so far, for the checkpoints a forget writes.
            own: an operator's requests, decided last.
            leave_requests: (client id, node) of each LeaveAndForget of round `server_round`
                (RoundOutcome.leave_requests), decided first.

        Returns:
            The global arrays after the requests decided.
        """
        self.finish_interrupted(core)
        clients = [
            ForgetRequest.by_client(self.federation, client, node, core.client_of(node))
            for client, node in leave_requests
        ]
        for request in (*clients, *self.queue.pending(), *own):
            if isinstance(request, tuple):  # a file that is no request
                unreadable = ForgetRequest(request[0], self.federation, "", "an unreadable request file", "")
                self._decided(unreadable.refused(server_round, request[1]))
            else:
                arrays = self._settle_one(core, arrays, request, server_round, wall_seconds)
        return arrays

    def settle_records(
        self,
        core: BetweenRounds,
        arrays: ArrayRecord,
        server_round: int,
        wall_seconds: float,
        leave_requests: Sequence[tuple[str, int]] = (),
    ) -> ArrayRecord:
        """`settle` for the round loop, whose global arrays are an ArrayRecord.

        Args:
            core: the round core, in the state of the newest checkpoint.
            arrays: the global arrays of that checkpoint.
            server_round: the newest checkpoint's round.
            wall_seconds: the federation's wall-clock seconds so far.
            leave_requests: the leave requests of round `server_round` (RoundOutcome.leave_requests).

        Returns:
            The global arrays after the requests decided.
        """
        numpy_arrays = {name: arrays[name].numpy() for name in arrays}
        settled = self.settle(core, numpy_arrays, server_round, wall_seconds, leave_requests=leave_requests)
        return ArrayRecord({name: Array(value) for name, value in settled.items()})

    def finish_interrupted(self, core: BetweenRounds) -> None:
        """After a crash between the checkpoint and the audit line: append the ledger's records the audit log lacks,
        delete the checkpoints older than the last forget, and the request files already decided.

        Args:
            core: the round core, in the state of the newest checkpoint (its ledger holds what was applied).

        Raises:
            OSError: the audit log, a request file or a checkpoint cannot be written or deleted.
        """
        audited = {record.get("request") for record in self.audit.records()}
        for record in core.ledger_records():
            if record["request"] not in audited:
                log(
                    WARNING,
                    "forget request %s was applied but not audited (interrupted): auditing it now",
                    record["request"],
                )
                self.audit.append(record)
            self.queue.remove(record["request"])
        forgotten = [record["round"] for record in core.ledger_records() if record["event"] == "forgotten"]
        if forgotten:
            self._delete_checkpoints_before(max(forgotten))

    def _settle_one(
        self, core: BetweenRounds, arrays: Arrays, request: ForgetRequest, server_round: int, wall_seconds: float
    ) -> Arrays:
        if self.audit.find(request.id) is not None:  # refused before a crash kept its file
            self.queue.remove(request.id)
            return arrays
        if _acknowledges(core, request):
            log(INFO, "%s: told it is forgotten, it leaves", request.asked_by)
            return arrays
        reason = refusal(core, request, self.federation)
        if reason is not None:
            self._decided(request.refused(server_round, reason))
            return arrays
        apply = self._readmit if request.readmit else self._forget
        return apply(core, arrays, request, server_round, wall_seconds)

    def _forget(
        self, core: BetweenRounds, arrays: Arrays, request: ForgetRequest, server_round: int, wall_seconds: float
    ) -> Arrays:
        asked = self._asked(core, request, server_round)
        if asked is None:
            return arrays
        forgotten, part_of = asked
        new_arrays = unflatten(np.asarray(forgotten.weights), core.strategy.layout) | {
            name: arrays[name] for name in core.buffer_layout
        }
        problem = non_finite(new_arrays, "the global model") or non_finite(forgotten.state, "the state")
        if problem is not None:
            self._decided(request.refused(server_round, f"without client {request.client!r}, {problem}"))
            return arrays
        record = forget_record(core, request, forgotten, server_round)
        change = Change(forgotten.state, dropped=request.client, record=record)
        self._commit(core, change, new_arrays, server_round, wall_seconds, record)
        log(
            INFO,
            "forgot client %r after round %d (%s; %s)",
            request.client,
            server_round,
            request.asked_by,
            "exact" if forgotten.exact else "an estimate",
        )
        if part_of is not None:  # the client took part, and is connected: it need not wait for its next turn
            self._confirm(core, part_of, server_round)
        return new_arrays

    def _asked(
        self, core: BetweenRounds, request: ForgetRequest, server_round: int
    ) -> tuple[Forgotten, int | None] | None:
        """The strategy's `forget` (with the client's part, where the strategy needs it) and the node that computed
        that part (None: the server alone), or None once its refusal (or its failure: a bug must not stop the
        federation) is decided."""
        try:
            asked = core.strategy.forget(request.client)
            if isinstance(asked, ClientForget):
                return self._with_client_part(core, request, asked, server_round)
            return asked, None
        except ForgetRefused as refused:
            reason = str(refused)
        except Exception as error:
            log(ERROR, "forget of client %r failed", request.client, exc_info=True)
            reason = f"{core.settings.strategy}'s forget failed: {type(error).__name__}: {error}"
        self._decided(request.refused(server_round, reason))
        return None

    def _with_client_part(
        self, core: BetweenRounds, request: ForgetRequest, asked: ClientForget, server_round: int
    ) -> tuple[Forgotten, int]:
        """A forget whose factor lives on the client (DSVGD, U-DSVGD): one exchange with the node the client id is
        bound to, between rounds, as the forget's own step. Here, not in a round: a request is settled after a round
        is committed and checkpointed and before the next is configured (module docstring), so the client works from
        the state the checkpoint holds, no round's replies mix with its answer, and a refused or missing answer
        leaves the federation as the last round left it. The client runs it from its durable store alone, so a
        leaving client (which sends no updates) answers too. The reply is checked as any reply (client_part.py
        checked_forget_reply); ForgetRefused for whatever is wrong with it, or when the node cannot be asked."""
        client = request.client
        core.strategy.check_forgettable(client, core.last_accepted())  # the server knows the holders by their rounds
        node = core.bound_node(client)
        if self.link is None or node is None or node not in self.link.connected():
            where = "the federation is stopped" if self.link is None else f"its node {node} is not connected"
            raise ForgetRefused(
                f"{core.settings.strategy}: client {client!r}'s factor t_k lives only in its own durable store "
                f"({asked.factor}), so it must take part (Forget-SVGD), and {where}: the client asks itself, with "
                "`fedbayes client ... --leave --forget`, while the federation runs (or the operator asks while it runs "
                "and the client is connected); otherwise retrain from the last checkpoint that predates the client's "
                "first accepted round, or from scratch"
            )
        log(INFO, "forget of client %r: asking node %d for its part (%s)", client, node, asked.factor)
        reply = self.link.ask(core.message_between_rounds(server_round, node, asked.instruction, asked.tensors))
        if isinstance(reply, str):
            raise ForgetRefused(f"client {client!r} (node {node}) sent no forget reply: {reply}")
        return asked.finish(checked_forget_reply(core, reply, client, asked, server_round)), node

    def _confirm(self, core: BetweenRounds, node: int, server_round: int) -> None:
        """Tell `node` at once that its client is forgotten (Header.forgotten_client_id, the confirmation every later
        instruction to it carries too): a leaving client deletes its state and leaves now, rather than at its next
        turn. Its answer changes nothing; a missing one is logged."""
        assert self.link is not None, "only a client part, asked through the link, is confirmed at once"
        answer = self.link.ask(core.message_between_rounds(server_round, node))
        if isinstance(answer, str):
            log(
                INFO,
                "node %d was not told at once that its client is forgotten (%s); its next instruction says so",
                node,
                answer,
            )

    def _readmit(
        self, core: BetweenRounds, arrays: Arrays, request: ForgetRequest, server_round: int, wall_seconds: float
    ) -> Arrays:
        record = request.record("readmitted", server_round)
        self._commit(
            core,
            Change(record=record),
            arrays,
            server_round,
            wall_seconds,
            record,
        )
        log(INFO, "readmitted client %r (%s): it may reply again, as a new client", request.client, request.asked_by)
        return arrays

    def _commit(
        self,
        core: BetweenRounds,
        change: Change,
        arrays: Arrays,
        server_round: int,
        wall_seconds: float,
        record: dict[str, Any],
    ) -> None:
        """The checkpoint of `server_round` rewritten with `change`, the older ones deleted, the audit line, the
        request file gone; then the round core adopts the change."""
        state = core.state_dict(change)
        self.store.save(Checkpoint(server_round, arrays, state, wall_seconds))
        if record["event"] == "forgotten":
            self._delete_checkpoints_before(server_round)
        self._decided(record)
        core.adopt(change)
        core.checkpoint_written(state)

    def _decided(self, record: dict[str, Any]) -> None:
        if record["event"] == "refused":
            log(
                WARNING,
                "forget request %s (%s) for client %r refused: %s",
                record["request"],
                record["asked_by"],
                record["client"],
                record["reason"],
            )
        self.audit.append(record)
        self.queue.remove(record["request"])

    def _delete_checkpoints_before(self, server_round: int) -> None:
        older = [kept for kept in self.store.kept_rounds() if kept < server_round]
        for kept in older:
            self.store.round_path(kept).unlink()
        if older:
            fsync_directory(self.store.directory)

    def rounds_to_run(self, core: BetweenRounds, num_rounds: int) -> int:
        """`num_rounds`, raised to the last round a forget's refinement asked for (logged when raised).

        Args:
            core: the round core, whose ledger holds the forgets applied.
            num_rounds: the run config's num-server-rounds.

        Returns:
            The larger of `num_rounds` and every forget's refine_through_round.
        """
        forgets = [record for record in core.ledger_records() if record["event"] == "forgotten"]
        through = max((record["refine_through_round"] for record in forgets), default=0)
        if through > num_rounds:
            log(
                INFO,
                "the forget of client %r asked for refinement rounds through round %d: num-server-rounds %d -> %d",
                forgets[-1]["client"],
                through,
                num_rounds,
                through,
            )
        return max(num_rounds, through)


def forget_record(
    core: BetweenRounds, request: ForgetRequest, forgotten: Forgotten, server_round: int
) -> dict[str, Any]:
    """The audit line and ledger record of an applied forget. `node`: the node the id was bound to, which is told
    from now on that it is forgotten (Header.forgotten_client_id).

    Args:
        core: the round core, in the state before the forget.
        request: the request applied.
        forgotten: the strategy's answer to it.
        server_round: the round after which it is applied.

    Returns:
        The "forgotten" record: the request's fields, the node, strategy, exactness, KL and note, the rounds the
        client contributed and its last accepted one, and the refinement through round `server_round` +
        `request.refine_rounds`.
    """
    client = request.client
    return request.record(
        "forgotten",
        server_round,
        node=core.bound_node(client),
        strategy=core.settings.strategy,
        exact=forgotten.exact,
        kl_before_after=forgotten.kl_before_after,
        note=forgotten.note + (BUFFERS_NOTE if core.buffer_layout else ""),
        contributed_rounds=core.contributed_rounds(client),
        last_accepted_round=core.last_accepted().get(client, 0),
        refine_rounds=request.refine_rounds,
        refine_through_round=server_round + request.refine_rounds,
    )


BUFFERS_NOTE = (
    "; the model's buffers (e.g. BatchNorm statistics) stay the last round's average, which includes the "
    "client, until the next round replaces them"
)


def refusal(core: BetweenRounds, request: ForgetRequest, federation: str) -> str | None:
    """Why `request` cannot be applied to the federation's state, before the strategy is asked (None: ask it).

    Args:
        core: the round core, in the state of the newest checkpoint.
        request: the request to decide.
        federation: the federation settling it.

    Returns:
        The reason: a request for another federation, no client id, a refinement out of range, a readmission of an
        id not revoked, a forget of one already forgotten, or a node asking for a client id not bound to it; None
        when the strategy is to be asked.
    """
    client = request.client
    if request.federation != federation:
        return f"the request is for federation {request.federation[:64]!r}, this is {federation!r}"
    problem = not_a_client_id(client) or refinement_problem(request.refine_rounds)
    if problem is not None:
        return problem
    forget = core.forget_of(client)
    if request.readmit:
        return None if forget is not None else f"client {client!r} is not revoked: there is nothing to readmit"
    if forget is not None:
        return (
            f"client {client!r} was already forgotten after round {forget['round']} (request {forget['request']}); "
            "readmit it first (--readmit) if it is to come back as a new client"
        )
    if request.node is not None and core.bound_node(client) != request.node:
        bound = core.bound_node(client)
        owner = f"is bound to node {bound}" if bound is not None else "is bound to no node"
        return f"node {request.node} asked to forget client {client!r}, which {owner}: only its own node may ask"
    return None


def _acknowledges(core: BetweenRounds, request: ForgetRequest) -> bool:
    """A client asking from the node it was bound to when it was forgotten: it has been told so (its instruction
    said), and leaves; nothing to decide."""
    forget = core.forget_of(request.client)
    return request.node is not None and forget is not None and forget.get("node") == request.node
