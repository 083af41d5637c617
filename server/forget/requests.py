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
