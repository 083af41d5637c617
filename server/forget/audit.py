"""The forget audit log, forget-audit.jsonl next to the checkpoints: one line per decided request."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.common import log

from fedbayes.tasks.storage import MAX_LINE_BYTES, Line, complete_lines

AUDIT_LOG = "forget-audit.jsonl"


class AuditLog:
    """forget-audit.jsonl: one JSON object per decided request (forgotten, readmitted, refused), appended and fsynced.
    A line a crash cut short is no record: it is ended before the next one is appended, and never read."""

    def __init__(self, path: Path, on_append: Callable[[Mapping[str, Any]], None] = lambda record: None) -> None:
        self.path = path
        self.on_append = on_append  # each record once it is on disk (the ServerApp's event stream)

    def records(self) -> list[dict[str, Any]]:
        """The records on disk.

        Returns:
            Every complete line that is a JSON object, in the order appended (none: no log yet); a line a crash cut
            short, one that is not an object, and one over MAX_LINE_BYTES (logged) are left out.

        Raises:
            OSError: the log exists but cannot be read.
        """
        if not self.path.exists():
            return []
        return [record for line in complete_lines(self.path) if (record := _parsed_line(self.path, line)) is not None]

    def find(self, request_id: str) -> dict[str, Any] | None:
        """The record of a decided request.

        Args:
            request_id: the request's id (ForgetRequest.id).

        Returns:
            The first record of that request, or None where it is not decided yet.

        Raises:
            OSError: the log exists but cannot be read.
        """
        return next((record for record in self.records() if record.get("request") == request_id), None)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append `record` as one JSON line and fsync it, ending first a last line a crash cut short; then hand it to
        `on_append`.

        Args:
            record: the decided request's record (ForgetRequest.record), JSON-serialisable.

        Raises:
            OSError: the log (or its folder) cannot be written; `on_append` is not called.
        """
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
