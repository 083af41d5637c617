"""Forget requests: who asks to forget (or readmit) which client id, the operators' queue of request files in
<server-state-dir>/<federation>/forget-requests/, and the rules every requested id and refinement meets."""

from __future__ import annotations

import getpass
import json
import secrets
import socket
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedbayes.tasks.config import REFINE_ROUNDS
from fedbayes.tasks.storage import (
    MAX_CLIENT_ID_LENGTH,
    MAX_RECORD_BYTES,
    fsync_directory,
    is_safe_name,
    read_bounded,
    write_atomically,
)

REQUESTS_DIRECTORY = "forget-requests"


class ForgetError(ValueError):
    """`fedbayes forget` cannot go on; the message names the run, checkpoint or request and the problem."""


def utc_now() -> str:
    """The time now, as requests and audit records note it.

    Returns:
        UTC, ISO 8601 to the millisecond.
    """
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
        or a refinement out of [0, MAX_REFINE_ROUNDS].

        Args:
            federation: the federation the request is for.
            client: the client id to forget or readmit.
            refine_rounds: ordinary rounds among the remaining clients a forget asks for after it.
            readmit: readmit the revoked `client` instead of forgetting it.

        Returns:
            The request, with a new id, asked by "operator <user>@<host>" now.

        Raises:
            ForgetError: `client` is no client id, or `refine_rounds` is out of range.
        """
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
        The request is the node's, whatever id it names: honoured only when the two are one (`refusal`).

        Args:
            federation: the federation the node takes part in.
            client: the client id the LeaveAndForget names, as sent (kept to one character over the longest id).
            node: the node it came from.
            node_client: the client id `node` is bound to (None: none).

        Returns:
            The request, with a new id, asked by the node now; no refinement, no readmission.
        """
        client = client[: MAX_CLIENT_ID_LENGTH + 1]  # what a client sent: one longer is refused, and logged bounded
        bound = "to no client" if node_client is None else f"to client {node_client!r}"
        return cls(_new_request_id(), federation, client, f"node {node}, bound {bound}", utc_now(), node=node)

    def record(self, event: str, server_round: int, **details: Any) -> dict[str, Any]:
        """The audit line (and, for what is applied, the ledger's record) of this request's outcome after round
        `server_round`.

        Args:
            event: "forgotten", "readmitted" or "refused".
            server_round: the round after which it was decided.
            **details: the event's own fields (a forget's exactness, KL and rounds; a refusal's reason).

        Returns:
            The request's fields, the event, the round and the time decided, with `details`.
        """
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
        """The audit line of this request refused.

        Args:
            server_round: the round after which it was refused.
            reason: why, as the operator or client is told.

        Returns:
            The "refused" record with `reason`.
        """
        return self.record("refused", server_round, reason=reason)


def _new_request_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(4)}"


class RequestQueue:
    """Operators' requests waiting for the server: one JSON file each, written atomically."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def submit(self, request: ForgetRequest) -> Path:
        """Queue `request` for the server, as <id>.json.

        Args:
            request: an operator's request.

        Returns:
            The request file's path.

        Raises:
            OSError: the file cannot be written.
        """
        path = self.directory / f"{request.id}.json"
        write_atomically(path, json.dumps(asdict(request), sort_keys=True).encode())
        return path

    def waiting(self) -> bool:
        """Whether any request is queued.

        Returns:
            True when the queue's folder holds a .json file (read or not).
        """
        return self.directory.is_dir() and any(path.suffix == ".json" for path in self.directory.iterdir())

    def pending(self) -> list[ForgetRequest | tuple[str, str]]:
        """The waiting requests, oldest first; a file that is no request as (its id, why).

        Returns:
            One entry per .json file, by name (the id sorts by the time the request was made): the request, or
            (its file's stem, why) for a file that is no operator's request: unreadable, not a request's JSON, a
            field of the wrong type, or a node named.
        """
        if not self.directory.is_dir():
            return []
        return [_read_request(path) for path in sorted(self.directory.glob("*.json"))]

    def remove(self, request_id: str) -> None:
        """Delete a decided request's file, durably (the folder is fsynced); nothing where it is gone.

        Args:
            request_id: the request's id.

        Raises:
            OSError: the file cannot be deleted.
        """
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


def not_a_client_id(client: str) -> str | None:
    """Why `client` cannot name a client (None: it can): the rule every reply's client id meets.

    Args:
        client: the id to check.

    Returns:
        None for a safe name (tasks/storage.py is_safe_name: [A-Za-z0-9._-]+, not "." or "..") of at most
        MAX_CLIENT_ID_LENGTH characters; else the reason, quoting it bounded.
    """
    if is_safe_name(client) and len(client) <= MAX_CLIENT_ID_LENGTH:
        return None
    return f"{client[:MAX_CLIENT_ID_LENGTH]!r} is not a client id (1 to {MAX_CLIENT_ID_LENGTH} of [A-Za-z0-9._-])"


def refinement_problem(refine_rounds: int) -> str | None:
    """Why a forget may not ask for `refine_rounds` refinement rounds (None: it may).

    Args:
        refine_rounds: the refinement rounds asked for.

    Returns:
        None within [0, MAX_REFINE_ROUNDS]; else the reason.
    """
    if REFINE_ROUNDS.test(refine_rounds):
        return None
    return (
        f"refine rounds {refine_rounds} {REFINE_ROUNDS.requirement} (MAX_REFINE_ROUNDS: a longer refinement is a "
        "retraining; retrain without the client instead)"
    )
