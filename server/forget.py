"""Forgetting a client: take one client's contribution out of a federation's server state, revoke its id,
and record it, on a stopped federation or between the rounds of a running one.

Who asks. The operator, with `fedbayes forget RUN --client ID` (deploy/cli.py), or the client itself, with
`fedbayes client --leave --forget`, whose ClientApp answers every instruction with a LeaveAndForget message instead of
training (protos/payloads.proto); a client's request is honoured only from the node its id is bound to
(server/identity.py `bound_node`). The server tells the node a forgotten client was bound to, in every later
instruction to it (Header.forgotten_client_id); a leaving client then deletes its durable state and leaves.

The request path. An operator's request is a JSON file in <server-state-dir>/<federation>/forget-requests/. A running
server holds <server-state-dir>/<federation>/server.lock (flock: the kernel frees it when the process exits, however
it exits; server/loop.py run_rounds) and settles the requests, the operators' and its clients', after a round is
committed and checkpointed and before the next one is configured: never mid-round, so a request made while a round
is in flight waits for its end. When no server holds the lock, `fedbayes forget` takes it and settles them itself on
the newest checkpoint, the strategy's server half rebuilt from the checkpoint's run config (`settle_stopped`).

Applying a forget: the strategy's `forget(client)` (strategies/base.py: the state without the client, computed from
what the server holds, changing nothing), written to the checkpoint together with the client's id unbound, its
accepted round dropped, its id revoked and the forget's record in the ledger (server/identity.py ForgetLedger);
the global arrays become `Forgotten.weights` plus the model's buffers. Then, in this order: the checkpoint of the same
round is rewritten (atomically: temp file, fsync, rename), the older checkpoints, which still hold the client, are
deleted, the record is appended to the audit log (forget-audit.jsonl next to the checkpoints), the request file is
deleted, and only then does the round core (a running server's) adopt the committed state (server/round_core.py).

Atomicity. The checkpoint is the truth. A crash leaves the old or the new checkpoint, never a mix; whatever the ledger
of the newest checkpoint records that the audit log lacks (a crash between the two) is appended, and the checkpoints
older than the last forget are deleted, the next time requests are settled or the server starts. So the audit log
never records a forget the checkpoint does not hold. An operator's request file stays until its outcome is in the
audit log; a client asks again every round until it is confirmed.

Refused, with a reason in the audit log and nothing else changed: a request for another federation, an id that is
not a client id, an id already forgotten (readmit it first), a readmission of an id that is not revoked, a client's
request from another node than its own, and whatever the strategy refuses (ForgetRefused: an unknown id, the last
remaining client, strategies that cannot: FedAvg, FedProx and FedPA keep no per-client factor), and, for a strategy
whose factor lives on the client (DSVGD, U-DSVGD: `forget` returns a ClientForget), a federation that is stopped or a
client that is not connected, and a client's part that is missing or fails the checks any reply meets.

The client's part (ClientForget). The server cannot compute such a forget alone: a running server asks the node the
client id is bound to, between rounds, in a one-message exchange of its own (ClientLink, built by server/loop.py on its
grid, bounded by round-timeout), checks the answer as a round's reply (RoundCore.checked_forget_reply), and commits it
as any forget; then it tells the node at once that its client is forgotten. See Forgetting._with_client_part for why
it happens there and not inside a round.

Refinement. `refine_rounds` R, at most MAX_REFINE_ROUNDS (tasks/config.py): the federation runs at least R ordinary
rounds among the remaining clients after the round t the forget was applied after. The rounds a running federation
has left count; a federation resumed before round t + R runs through round t + R whatever its num-server-rounds says
(run_rounds raises it and logs so).
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message
from flwr.common import log

from fedbayes.bayes.params import buffer_layout, parameter_layout, unflatten
from fedbayes.posterior.export import RunLocation
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.server.round_core import Change, RoundCore, non_finite
from fedbayes.strategies import default_run_config, get_algorithm, run_settings
from fedbayes.strategies.base import ClientForget, ForgetRefused, Forgotten
from fedbayes.tasks.config import REFINE_ROUNDS
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import build_model_holding, parse_hidden
from fedbayes.tasks.storage import (
    MAX_CLIENT_ID_LENGTH,
    MAX_LINE_BYTES,
    MAX_RECORD_BYTES,
    Line,
    complete_lines,
    fsync_directory,
    is_safe_name,
    read_bounded,
    write_atomically,
)

REQUESTS_DIRECTORY = "forget-requests"
AUDIT_LOG = "forget-audit.jsonl"
LOCK_FILE = "server.lock"
Arrays = dict[str, np.ndarray]


class ForgetError(ValueError):
    """`fedbayes forget` cannot go on; the message names the run, checkpoint or request and the problem."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class ForgetRequest:
    """One request to forget (or readmit) a client id. `id` sorts by the time it was made, so requests are settled
    in that order."""

    id: str
    federation: str
    client: str  # the client id to forget or readmit: the one the request names
    asked_by: str  # "operator <user>@<host>", or "node <node>, bound to client <id>" (or "to no client")
    asked_at: str  # UTC, ISO 8601
    node: int | None = None  # the node a client's own request came from
    refine_rounds: int = 0
    readmit: bool = False

    @classmethod
    def by_operator(cls, federation: str, client: str, refine_rounds: int = 0, readmit: bool = False) -> ForgetRequest:
        """An operator's request; ForgetError, before anything is asked or locked, for an id that is no client id
        or a refinement out of [0, MAX_REFINE_ROUNDS]."""
        problem = not_a_client_id(client) or refinement_problem(refine_rounds)
        if problem is not None:
            raise ForgetError(f"{problem}; nothing was asked")
        return cls(
            _new_request_id(),
            federation,
            client,
            f"operator {getpass.getuser()}@{socket.gethostname()}",
            utc_now(),
            refine_rounds=refine_rounds,
            readmit=readmit,
        )

    @classmethod
    def by_client(cls, federation: str, client: str, node: int, node_client: str | None) -> ForgetRequest:
        """A node's LeaveAndForget naming `client`; `node_client`: the client id the node is bound to (None: none).
        The request is the node's, whatever id it names: honoured only when the two are one (`refusal`)."""
        client = client[: MAX_CLIENT_ID_LENGTH + 1]  # what a client sent: one longer is refused, and logged bounded
        bound = "to no client" if node_client is None else f"to client {node_client!r}"
        return cls(_new_request_id(), federation, client, f"node {node}, bound {bound}", utc_now(), node=node)

    def record(self, event: str, server_round: int, **details: Any) -> dict[str, Any]:
        """The audit line (and, for what is applied, the ledger's record) of this request's outcome after round
        `server_round`."""
        return {
            "event": event,
            "request": self.id,
            "federation": self.federation,
            "client": self.client,
            "asked_by": self.asked_by,
            "asked_at": self.asked_at,
            "decided_at": utc_now(),
            "round": server_round,
            **details,
        }

    def refused(self, server_round: int, reason: str) -> dict[str, Any]:
        return self.record("refused", server_round, reason=reason)


def _new_request_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


class RequestQueue:
    """Operators' requests waiting for the server: one JSON file each, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def submit(self, request: ForgetRequest) -> Path:
        path = self.directory / f"{request.id}.json"
        write_atomically(path, json.dumps(asdict(request), sort_keys=True).encode())
        return path

    def waiting(self) -> bool:
        return self.directory.is_dir() and any(path.suffix == ".json" for path in self.directory.iterdir())

    def pending(self) -> list[ForgetRequest | tuple[str, str]]:
        """The waiting requests, oldest first; a file that is no request as (its id, why)."""
        if not self.directory.is_dir():
            return []
        return [_read_request(path) for path in sorted(self.directory.glob("*.json"))]

    def remove(self, request_id: str) -> None:
        path = self.directory / f"{request_id}.json"
        if path.exists():
            path.unlink()
            fsync_directory(self.directory)


REQUEST_TYPES = {
    "id": str,
    "federation": str,
    "client": str,
    "asked_by": str,
    "asked_at": str,
    "refine_rounds": int,
    "readmit": bool,
}


def _read_request(path: Path) -> ForgetRequest | tuple[str, str]:
    try:
        request = ForgetRequest(**json.loads(read_bounded(path, MAX_RECORD_BYTES, "a forget request")))
    except (OSError, ValueError, TypeError, RecursionError) as error:  # written by hand, or by another version
        return path.stem, f"request file {path} is no forget request ({type(error).__name__}: {error})"
    wrong = [name for name, kind in REQUEST_TYPES.items() if not isinstance(getattr(request, name), kind)]
    if wrong or request.node is not None:
        return path.stem, f"request file {path} is no operator's forget request (fields {wrong or ['node']})"
    return request


class AuditLog:
    """forget-audit.jsonl: one JSON object per decided request (forgotten, readmitted, refused), appended and fsynced.
    A line a crash cut short is no record: it is ended before the next one is appended, and never read."""

    def __init__(self, path: Path, on_append: Callable[[Mapping[str, Any]], None] = lambda record: None) -> None:
        self.path = path
        self.on_append = on_append  # each record once it is on disk (the ServerApp's event stream)

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [record for line in complete_lines(self.path) if (record := _parsed_line(self.path, line)) is not None]

    def find(self, request_id: str) -> dict[str, Any] | None:
        return next((record for record in self.records() if record.get("request") == request_id), None)

    def append(self, record: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a+b") as audit_file:
            audit_file.seek(0, os.SEEK_END)
            torn = audit_file.tell() > 0 and not _ends_with_newline(audit_file)
            audit_file.write(b"\n" * torn + json.dumps(record, sort_keys=True).encode() + b"\n")
            audit_file.flush()
            os.fsync(audit_file.fileno())
        self.on_append(record)


def _parsed_line(path: Path, line: Line) -> dict[str, Any] | None:
    if line.text is None:
        log(WARNING, "forget audit log %s: line %d is over %d bytes: skipped", path, line.number, MAX_LINE_BYTES)
        return None
    try:
        record = json.loads(line.text)
    except (ValueError, RecursionError):
        return None  # a line a crash cut short, ended by the next append
    return record if isinstance(record, dict) else None


def _ends_with_newline(audit_file) -> bool:
    audit_file.seek(-1, os.SEEK_END)
    ended = audit_file.read(1) == b"\n"
    audit_file.seek(0, os.SEEK_END)
    return ended


@contextmanager
def server_lock(directory: Path, wait: bool = True) -> Iterator[bool]:
    """Hold `directory`/server.lock: a running server holds it for its whole run, `fedbayes forget` while it works on
    a stopped federation's checkpoint. With `wait=False`, yields whether it was free (and is now held)."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / LOCK_FILE).open("a") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            held = True
        except BlockingIOError:
            held = False
        try:
            yield held
        finally:
            if held:
                fcntl.flock(lock_file, fcntl.LOCK_UN)


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

    def has_work(self, core: RoundCore) -> bool:
        return bool(core.leave_requests) or self.queue.waiting()

    def settle(
        self,
        core: RoundCore,
        arrays: Arrays,
        server_round: int,
        wall_seconds: float,
        own: tuple[ForgetRequest, ...] = (),
    ) -> Arrays:
        """Finish what a crash interrupted, then decide this round's client requests, the queued ones and `own`
        (an operator's on a stopped federation), in that order; the global arrays after them. `server_round`: the
        newest checkpoint's round, whose state `core` and `arrays` are."""
        self.finish_interrupted(core)
        clients = [
            ForgetRequest.by_client(self.federation, client, node, core.identities.client_of(node))
            for client, node in core.take_leave_requests()
        ]
        for request in (*clients, *self.queue.pending(), *own):
            if isinstance(request, tuple):  # a file that is no request
                unreadable = ForgetRequest(request[0], self.federation, "", "an unreadable request file", "")
                self._decided(unreadable.refused(server_round, request[1]))
            else:
                arrays = self._settle_one(core, arrays, request, server_round, wall_seconds)
        return arrays

    def settle_records(
        self, core: RoundCore, arrays: ArrayRecord, server_round: int, wall_seconds: float
    ) -> ArrayRecord:
        """`settle` for the round loop, whose global arrays are an ArrayRecord."""
        settled = self.settle(core, {name: arrays[name].numpy() for name in arrays}, server_round, wall_seconds)
        return ArrayRecord({name: Array(value) for name, value in settled.items()})

    def finish_interrupted(self, core: RoundCore) -> None:
        """After a crash between the checkpoint and the audit line: append the ledger's records the audit log lacks,
        delete the checkpoints older than the last forget, and the request files already decided."""
        audited = {record.get("request") for record in self.audit.records()}
        for record in core.identities.ledger.records:
            if record["request"] not in audited:
                log(
                    WARNING,
                    "forget request %s was applied but not audited (interrupted): auditing it now",
                    record["request"],
                )
                self.audit.append(record)
            self.queue.remove(record["request"])
        forgotten = [record["round"] for record in core.identities.ledger.records if record["event"] == "forgotten"]
        if forgotten:
            self._delete_checkpoints_before(max(forgotten))

    def _settle_one(
        self, core: RoundCore, arrays: Arrays, request: ForgetRequest, server_round: int, wall_seconds: float
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
        self, core: RoundCore, arrays: Arrays, request: ForgetRequest, server_round: int, wall_seconds: float
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
        change = Change(
            core.identities.forgetting(request.client, record), forgotten.state, core.accepted_without(request.client)
        )
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

    def _asked(self, core: RoundCore, request: ForgetRequest, server_round: int) -> tuple[Forgotten, int | None] | None:
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
        self, core: RoundCore, request: ForgetRequest, asked: ClientForget, server_round: int
    ) -> tuple[Forgotten, int]:
        """A forget whose factor lives on the client (DSVGD, U-DSVGD): one exchange with the node the client id is
        bound to, between rounds, as the forget's own step. Here, not in a round: a request is settled after a round
        is committed and checkpointed and before the next is configured (module docstring), so the client works from
        the state the checkpoint holds, no round's replies mix with its answer, and a refused or missing answer
        leaves the federation as the last round left it. The client runs it from its durable store alone, so a
        leaving client (which sends no updates) answers too. The reply is checked as any reply (RoundCore
        checked_forget_reply); ForgetRefused for whatever is wrong with it, or when the node cannot be asked."""
        client = request.client
        core.strategy.check_forgettable(client, core.accepted_rounds)  # the server knows the holders by their rounds
        node = core.identities.bound_node(client)
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
        reply = self.link.ask(core.forget_message(server_round, node, asked.instruction, asked.tensors))
        if isinstance(reply, str):
            raise ForgetRefused(f"client {client!r} (node {node}) sent no forget reply: {reply}")
        return asked.finish(core.checked_forget_reply(reply, client, asked, server_round)), node

    def _confirm(self, core: RoundCore, node: int, server_round: int) -> None:
        """Tell `node` at once that its client is forgotten (Header.forgotten_client_id, the confirmation every later
        instruction to it carries too): a leaving client deletes its state and leaves now, rather than at its next
        turn. Its answer changes nothing; a missing one is logged."""
        assert self.link is not None, "only a client part, asked through the link, is confirmed at once"
        answer = self.link.ask(core.forget_message(server_round, node))
        if isinstance(answer, str):
            log(
                INFO,
                "node %d was not told at once that its client is forgotten (%s); its next instruction says so",
                node,
                answer,
            )

    def _readmit(
        self, core: RoundCore, arrays: Arrays, request: ForgetRequest, server_round: int, wall_seconds: float
    ) -> Arrays:
        record = request.record("readmitted", server_round)
        self._commit(
            core,
            Change(core.identities.readmitting(request.client, record)),
            arrays,
            server_round,
            wall_seconds,
            record,
        )
        log(INFO, "readmitted client %r (%s): it may reply again, as a new client", request.client, request.asked_by)
        return arrays

    def _commit(
        self,
        core: RoundCore,
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

    def rounds_to_run(self, core: RoundCore, num_rounds: int) -> int:
        """`num_rounds`, raised to the last round a forget's refinement asked for (logged when raised)."""
        forgets = [record for record in core.identities.ledger.records if record["event"] == "forgotten"]
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


def forget_record(core: RoundCore, request: ForgetRequest, forgotten: Forgotten, server_round: int) -> dict[str, Any]:
    """The audit line and ledger record of an applied forget. `node`: the node the id was bound to, which is told
    from now on that it is forgotten (Header.forgotten_client_id)."""
    client = request.client
    return request.record(
        "forgotten",
        server_round,
        node=core.identities.bound_node(client),
        strategy=core.settings.strategy,
        exact=forgotten.exact,
        kl_before_after=forgotten.kl_before_after,
        note=forgotten.note + (BUFFERS_NOTE if core.buffer_layout else ""),
        contributed_rounds=core.identities.ledger.contributed.get(client, []),
        last_accepted_round=core.accepted_rounds.get(client, 0),
        refine_rounds=request.refine_rounds,
        refine_through_round=server_round + request.refine_rounds,
    )


BUFFERS_NOTE = (
    "; the model's buffers (e.g. BatchNorm statistics) stay the last round's average, which includes the "
    "client, until the next round replaces them"
)


def refusal(core: RoundCore, request: ForgetRequest, federation: str) -> str | None:
    """Why `request` cannot be applied to the federation's state, before the strategy is asked (None: ask it)."""
    client, ledger = request.client, core.identities.ledger
    if request.federation != federation:
        return f"the request is for federation {request.federation[:64]!r}, this is {federation!r}"
    problem = not_a_client_id(client) or refinement_problem(request.refine_rounds)
    if problem is not None:
        return problem
    forget = ledger.forget_of(client)
    if request.readmit:
        return None if forget is not None else f"client {client!r} is not revoked: there is nothing to readmit"
    if forget is not None:
        return (
            f"client {client!r} was already forgotten after round {forget['round']} (request {forget['request']}); "
            "readmit it first (--readmit) if it is to come back as a new client"
        )
    if request.node is not None and core.identities.bound_node(client) != request.node:
        bound = core.identities.bound_node(client)
        owner = f"is bound to node {bound}" if bound is not None else "is bound to no node"
        return f"node {request.node} asked to forget client {client!r}, which {owner}: only its own node may ask"
    return None


def not_a_client_id(client: str) -> str | None:
    """Why `client` cannot name a client (None: it can): the rule every reply's client id meets."""
    if is_safe_name(client) and len(client) <= MAX_CLIENT_ID_LENGTH:
        return None
    return f"{client[:MAX_CLIENT_ID_LENGTH]!r} is not a client id (1 to {MAX_CLIENT_ID_LENGTH} of [A-Za-z0-9._-])"


def refinement_problem(refine_rounds: int) -> str | None:
    """Why a forget may not ask for `refine_rounds` refinement rounds (None: it may)."""
    if REFINE_ROUNDS.test(refine_rounds):
        return None
    return (
        f"refine rounds {refine_rounds} {REFINE_ROUNDS.requirement} (MAX_REFINE_ROUNDS: a longer refinement is a "
        "retraining; retrain without the client instead)"
    )


def _acknowledges(core: RoundCore, request: ForgetRequest) -> bool:
    """A client asking from the node it was bound to when it was forgotten: it has been told so (its instruction
    said), and leaves; nothing to decide."""
    forget = core.identities.ledger.forget_of(request.client)
    return request.node is not None and forget is not None and forget.get("node") == request.node


# ---- a stopped federation: `fedbayes forget` ---------------------------------------------------------------------
@dataclass
class Rebuilt:
    """A stopped federation's newest checkpoint, with a round core (and its strategy) holding its state."""

    store: CheckpointStore  # writes checkpoints with the checkpoint's own run config
    core: RoundCore
    arrays: Arrays
    server_round: int
    wall_seconds: float


def checked_newest(location: RunLocation) -> tuple[Checkpoint, dict[str, Any]]:
    """The newest checkpoint and its run config; ForgetError when it belongs to another federation."""
    store = CheckpointStore(location.state_dir, location.federation, {})
    checkpoint, run_config = store.read()
    if run_config.get("federation") != location.federation:
        raise ForgetError(
            f"{store.round_path(checkpoint.server_round)} is a checkpoint of federation "
            f"{str(run_config.get('federation'))[:64]!r}, not of {location.federation!r} (copied from "
            "another federation's directory?); nothing was changed"
        )
    return checkpoint, run_config


def rebuild(location: RunLocation, data_root: str | None = None) -> Rebuilt:
    """The newest checkpoint's state in the strategy's server half, built from the checkpoint's run config as the
    ServerApp builds it (the model from the run's test data: its input shape and classes)."""
    checkpoint, saved_run_config = checked_newest(location)
    options = {"data-root": data_root} if data_root is not None else {}
    run_config = {**location.run_config, **saved_run_config, **options}
    source = f"the run config of {CheckpointStore(location.state_dir, location.federation, {}).path}"
    if problem := location.code_problem(source, run_config):  # before anything it names is imported
        raise ForgetError(f"{problem}; nothing was changed")
    # Operators' requests only: a client's comes through a running server, so the registry is not needed here.
    defaults = default_run_config(str(run_config.get("strategy", "")))
    settings = run_settings({**defaults, **run_config, "client-registry": ""})
    try:
        test = load_dataset(settings.dataset, train=False, data_root=settings.data_root)
    except (FileNotFoundError, ValueError) as error:
        raise ForgetError(
            f"rebuilding the server of {location.federation!r} needs the run's test data (input shape, "
            f"classes): {error}; --data-root names where the dataset is"
        ) from None
    try:  # laid out against the checkpoint's arrays first: its run config's sizes cost no more than they do
        model = build_model_holding(
            settings.model,
            test.input_shape,
            test.num_classes,
            parse_hidden(settings.hidden),
            settings.activation,
            settings.pool,
            {name: value.shape for name, value in checkpoint.arrays.items()},
        )
    except ValueError as error:
        raise ForgetError(
            f"the newest checkpoint of {location.federation!r} does not fit the model its run config builds here: "
            f"{error}; nothing was changed"
        ) from None
    strategy = get_algorithm(settings.strategy).build_server(settings, parameter_layout(model), buffer_layout(model))
    core = RoundCore(settings, strategy)
    core.load_state_dict(checkpoint.strategy_state)
    store = CheckpointStore(
        location.state_dir,
        location.federation,
        saved_run_config,
        initial_arrays=checkpoint.arrays,
        keep=settings.keep_checkpoints,
    )
    return Rebuilt(store, core, checkpoint.arrays, checkpoint.server_round, checkpoint.wall_seconds)


def settle_stopped(location: RunLocation, own: tuple[ForgetRequest, ...] = (), data_root: str | None = None) -> None:
    """With the server lock held: settle the queued requests and `own` on the newest checkpoint."""
    rebuilt = rebuild(location, data_root)
    Forgetting(rebuilt.store).settle(rebuilt.core, rebuilt.arrays, rebuilt.server_round, rebuilt.wall_seconds, own)


def forget_command(
    location: RunLocation, request: ForgetRequest, wait_seconds: float, data_root: str | None = None, say=print
) -> dict[str, Any]:
    """Settle `request`: at once on a stopped federation; on a running one, queued for the server, which settles it
    after the round in flight (waiting up to `wait_seconds`, and taking over should the server stop meanwhile).
    Its audit record; ForgetError when it is refused or still waiting."""
    directory = location.state_dir / location.federation
    audit = AuditLog(directory / AUDIT_LOG)
    with server_lock(directory, wait=False) as stopped:
        if stopped:
            settle_stopped(location, (request,), data_root)
    if not stopped:
        RequestQueue(directory / REQUESTS_DIRECTORY).submit(request)
        say(
            f"federation {location.federation!r} is running: request {request.id} waits for the end of the round in "
            "flight (applied between rounds, never mid-round)"
        )
    deadline = time.monotonic() + wait_seconds
    while (record := audit.find(request.id)) is None:
        if time.monotonic() > deadline:
            raise ForgetError(
                f"request {request.id} was not settled within {wait_seconds:g} s; it stays queued in "
                f"{directory / REQUESTS_DIRECTORY} and the server settles it after its round in flight "
                f"(or at its next start); its outcome will be in {audit.path}"
            )
        time.sleep(0.5)
        with server_lock(directory, wait=False) as stopped:  # the server stopped before settling it: settle it here
            if stopped and audit.find(request.id) is None:
                settle_stopped(location, data_root=data_root)
    if record["event"] == "refused":
        raise ForgetError(f"request {request.id} refused: {record['reason']} (audit: {audit.path})")
    return record


def audit_path(location: RunLocation) -> Path:
    return location.state_dir / location.federation / AUDIT_LOG


def describe_outcome(record: Mapping[str, Any], audit: Path) -> str:
    """What `fedbayes forget` prints for an applied request."""
    client, server_round = record["client"], record["round"]
    if record["event"] == "readmitted":
        return (
            f"readmitted client {client!r} after round {server_round}: it may take part again, as a new client "
            f"(fresh state); request {record['request']}, audit: {audit}"
        )
    kl = record["kl_before_after"]
    spans = ", ".join(f"{first}-{last}" if last > first else str(first) for first, last in record["contributed_rounds"])
    lines = [
        f"forgot client {client!r} of federation {record['federation']!r} after round {server_round} "
        f"(request {record['request']}, asked by {record['asked_by']})",
        f"  exact: {'yes' if record['exact'] else 'no, an estimate (refinement rounds improve it)'}; "
        f"KL(before || after) = {'none (not a Gaussian posterior)' if kl is None else f'{kl:.6g}'}",
        f"  {record['note']}",
        f"  it had contributed rounds {spans or 'none recorded'} (last accepted: {record['last_accepted_round']}); "
        f"its id is revoked: the server refuses it until `fedbayes forget ... --readmit {client}`",
    ]
    if record["refine_rounds"]:
        lines.append(
            f"  refinement: {record['refine_rounds']} ordinary rounds among the remaining clients, through "
            f"round {record['refine_through_round']}: a running federation's remaining rounds count, and one "
            "started again before then (`fedbayes local ... --resume`, or the run submitted again) runs "
            "through that round whatever its num-server-rounds"
        )
    return "\n".join([*lines, f"  audit: {audit}"])
