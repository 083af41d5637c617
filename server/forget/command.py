"""`fedbayes forget`: an operator's request settled, at once on a stopped federation or queued for a running one,
and what it prints of the outcome."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedbayes.posterior.export import RunLocation
from fedbayes.server.forget.audit import AUDIT_LOG, AuditLog
from fedbayes.server.forget.lock import server_lock
from fedbayes.server.forget.requests import REQUESTS_DIRECTORY, ForgetError, ForgetRequest, RequestQueue
from fedbayes.server.forget.stopped import settle_stopped


def forget_command(
    location: RunLocation, request: ForgetRequest, wait_seconds: float, data_root: str | None = None, say=print
) -> dict[str, Any]:
    """Settle `request`: at once on a stopped federation; on a running one, queued for the server, which settles it
    after the round in flight (waiting up to `wait_seconds`, and taking over should the server stop meanwhile).
    Its audit record; ForgetError when it is refused or still waiting.

    Args:
        location: the federation: its server state directory and run config.
        request: the operator's request (ForgetRequest.by_operator).
        wait_seconds: how long to wait for the request's audit record before giving up.
        data_root: where the run's dataset is, if not where its run config says (used on a stopped federation,
            whose server is rebuilt from the test data).
        say: prints the note that a running federation settles the request after its round in flight.

    Returns:
        The request's audit record: a forget's ("forgotten") or a readmission's ("readmitted").

    Raises:
        ForgetError: the request was refused (with the reason, audited), it was not settled within `wait_seconds`
            (it stays queued), or a stopped federation's server cannot be rebuilt (nothing was changed).
        CheckpointError: a stopped federation has no readable newest checkpoint.
    """
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
    """Where the federation's forget audit log is.

    Args:
        location: the federation.

    Returns:
        <server-state-dir>/<federation>/forget-audit.jsonl.
    """
    return location.state_dir / location.federation / AUDIT_LOG


def describe_outcome(record: Mapping[str, Any], audit: Path) -> str:
    """What `fedbayes forget` prints for an applied request.

    Args:
        record: the request's audit record, a forget's ("forgotten") or a readmission's ("readmitted").
        audit: the audit log's path, named in the text.

    Returns:
        The lines to print: for a forget, whether it is exact, its KL, the strategy's note, the rounds the client
        contributed and any refinement rounds; for a readmission, one line.
    """
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
