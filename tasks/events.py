"""The ServerApp's event stream: what happened in a run, as data the command-line tools read instead of log wording.

The ServerApp appends one JSON object a line to <server-state-dir>/<federation>/events.jsonl (`EVENTS_FILE`), each
written whole by one append and flushed, so the file may be tailed while the run goes: a reader takes only lines
that end in a newline, and reads a last line still being written once it is complete (`EventTail`). Every start
of the ServerApp appends to the same file, after a `run_started` event. Each event is also logged as one line,
`fedbayes event: <the same JSON>` (`LOG_PREFIX`), so that `fedbayes run`, which sees of a ServerApp on another
machine only the log Flower streams, reads the same events (and does not show those lines); a failure before the
federation is named (a run config the ServerApp refuses) reaches the log only.

An event: {"type": ..., "round": <int or null>, "time": <Unix seconds>, ...its fields (`FIELDS`)}. The file is data
from another process: it is parsed as JSON only, every line bounded by MAX_EVENT_BYTES, and a line that is no
event is refused (MalformedEvent, naming the line and what is wrong), never guessed at.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbayes.tasks.storage import complete_lines

EVENTS_FILE = "events.jsonl"  # in a federation's server state directory, beside its checkpoints
LOG_PREFIX = "fedbayes event: "  # an event's line in the ServerApp's log
MAX_EVENT_BYTES = 64 * 2**10  # a refused client's reason is at most 400 characters; a metric a number

RUN_STARTED = "run_started"
ROUND_STARTED = "round_started"
REPLIES = "replies"
REFUSED = "refused"
COMMITTED = "committed"
EVALUATED = "evaluated"
CHECKPOINTED = "checkpointed"
FORGOTTEN = "forgotten"
TRACKING = "tracking"
RUN_ENDED = "run_ended"
COMPLETED, FAILED = "completed", "failed"  # a run_ended event's outcome


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_optional_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _is_optional_int(value: Any) -> bool:
    return value is None or type(value) is int


def _is_metrics(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_number(v) for k, v in value.items())


def _is_outcome(value: Any) -> bool:
    return value in (COMPLETED, FAILED)


Check = Callable[[Any], bool]
# Per type, its fields and what each must be; whether the event names a round.
FIELDS: dict[str, tuple[bool, dict[str, tuple[Check, str]]]] = {
    RUN_STARTED: (
        False,
        {
            "federation": (_is_text, "a string"),
            "named_by_server": (lambda value: isinstance(value, bool), "true or false"),
            "strategy": (_is_text, "a string"),
            "rounds": (_is_int, "an integer"),
        },
    ),
    ROUND_STARTED: (True, {"rounds": (_is_int, "an integer")}),
    REPLIES: (
        True,
        {"sent": (_is_int, "an integer"), "replies": (_is_int, "an integer"), "silent": (_is_int, "an integer")},
    ),
    REFUSED: (True, {"client": (_is_text, "a string"), "reason": (_is_text, "a string")}),
    COMMITTED: (True, {"clients": (_is_int, "an integer"), "clients_sent": (_is_int, "an integer")}),
    EVALUATED: (True, {"metrics": (_is_metrics, "an object of finite numbers")}),
    CHECKPOINTED: (True, {"rounds": (_is_int, "an integer")}),
    FORGOTTEN: (
        True,
        {
            "client": (_is_text, "a string"),
            "request": (_is_text, "a string"),
            "refine_through_round": (_is_optional_int, "an integer or null"),
        },
    ),
    TRACKING: (False, {"message": (_is_text, "a string")}),
    RUN_ENDED: (
        False,
        {"outcome": (_is_outcome, f"{COMPLETED!r} or {FAILED!r}"), "reason": (_is_optional_text, "a string or null")},
    ),
}


class MalformedEvent(ValueError):
    """A line that is no event of ours: the message says what is wrong with it."""


@dataclass(frozen=True)
class Event:
    type: str
    round: int | None
    time: float
    fields: Mapping[str, Any]

    def json_line(self) -> str:
        """The event as its line of the file (no newline); the writer refuses what the reader would.

        Returns:
            The JSON object of its type, round, time and fields.

        Raises:
            MalformedEvent: the event is none a reader would take (parse_event).
        """
        line = json.dumps({"type": self.type, "round": self.round, "time": self.time, **self.fields})
        parse_event(line)  # the writer refuses what the reader would
        return line


def parse_event(line: str | bytes) -> Event:
    """The event a line holds.

    Args:
        line: one line of an events file or the JSON after LOG_PREFIX, without its newline.

    Returns:
        The event, its fields those its type has (FIELDS).

    Raises:
        MalformedEvent: the line is over MAX_EVENT_BYTES, no JSON object, of an unknown type, or a field is missing
            or not what its type says.
    """
    if len(line) > MAX_EVENT_BYTES:
        raise MalformedEvent(f"a line of {len(line)} bytes, over the {MAX_EVENT_BYTES} an event may have")
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as error:
        raise MalformedEvent(f"not JSON ({error})") from None
    if not isinstance(record, dict):
        raise MalformedEvent(f"a JSON {type(record).__name__}, not an object")
    kind = record.pop("type", None)
    if kind not in FIELDS:
        raise MalformedEvent(f"type {str(kind)[:64]!r} is none of {', '.join(FIELDS)}")
    has_round, fields = FIELDS[kind]
    server_round, when = record.pop("round", None), record.pop("time", None)
    if has_round != (type(server_round) is int and server_round >= 0):
        raise MalformedEvent(f"a {kind} event's round is {'an integer >= 0' if has_round else 'null'}")
    if not _is_number(when):
        raise MalformedEvent(f"a {kind} event's time is a number (Unix seconds)")
    for name, (usable, what) in fields.items():
        if name not in record or not usable(record[name]):
            raise MalformedEvent(f"a {kind} event's field {name!r} is missing or not {what}")
    if extra := sorted(set(record) - set(fields)):
        raise MalformedEvent(f"a {kind} event has no field {extra[0][:64]!r}")
    return Event(kind, server_round, float(when), record)


def event_of_log_line(line: str) -> Event | None:
    """The event a line of the ServerApp's log carries (after LOG_PREFIX, in whatever Flower puts before it).

    Args:
        line: one line of the ServerApp's log.

    Returns:
        The event, or None for a line without LOG_PREFIX.

    Raises:
        MalformedEvent: the line has LOG_PREFIX and no event after it.
    """
    _, found, rest = line.partition(LOG_PREFIX)
    return parse_event(rest.strip()) if found else None


class EventLog:
    """The ServerApp's writer: each event to `mirror` (as its log line) and, once `write_to` names it, appended to
    the events file. Safe to call from several threads (the round loop and its evaluation thread)."""

    def __init__(self, mirror: Callable[[str], None] = lambda line: None) -> None:
        self.mirror = mirror
        self.path: Path | None = None
        self.lock = threading.Lock()

    def write_to(self, path: Path) -> None:
        """Append every later event to `path` (made if missing), after ending a last line a crash cut short.

        Args:
            path: the events file; its parent folders are created.

        Raises:
            OSError: the file cannot be opened or written.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+b") as events_file:
            events_file.seek(0, os.SEEK_END)
            if events_file.tell() > 0:
                events_file.seek(-1, os.SEEK_END)
                if events_file.read(1) != b"\n":
                    events_file.write(b"\n")
        self.path = path

    def emit(self, kind: str, server_round: int | None = None, **fields: Any) -> None:
        """Write one event, timed now, to the events file (once `write_to` named it) and to the mirror.

        Args:
            kind: the event's type, a key of FIELDS.
            server_round: its round, for the types that have one (>= 0); None for those that have none.
            fields: exactly the fields its type has (FIELDS), each of the kind that says.

        Raises:
            MalformedEvent: it is not what its type says (a bug of the caller's).
        """
        line = Event(kind, server_round, time.time(), fields).json_line()
        with self.lock:
            if self.path is not None:
                # one write on an O_APPEND descriptor: the line lands whole at the end, after any other
                descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(descriptor, f"{line}\n".encode())
                finally:
                    os.close(descriptor)
            self.mirror(f"{LOG_PREFIX}{line}")


def read_events(
    path: Path, start: int = 0, on_malformed: Callable[[MalformedEvent], None] | None = None
) -> Iterator[tuple[int, Event]]:
    """The events of the file's complete lines from byte `start` (a line's start) on, each with the offset after its
    line; the piece after the last newline (a line still being written) is left for a later read.

    Args:
        path: an events file.
        start: where to begin, 0 or the offset after a line.
        on_malformed: gets each line that is no event, which is then skipped; None: such a line raises.

    Yields:
        (the offset just after the event's line, the event), in file order.

    Raises:
        MalformedEvent: a line is no event (the message names the file and the line's offset), without
            `on_malformed`.
        OSError: the file cannot be read.
    """
    for end, event in _read_lines(path, start):
        if isinstance(event, Event):
            yield end, event
        elif on_malformed is None:
            raise event
        else:
            on_malformed(event)


def _read_lines(path: Path, start: int) -> Iterator[tuple[int, Event | MalformedEvent]]:
    """Per complete line from `start` on, the offset after it and its event, or why it holds none."""
    line_start = start
    for line in complete_lines(path, MAX_EVENT_BYTES, start):
        if line.text == b"":  # the end of a line a crash cut short (EventLog.write_to), read from its middle
            line_start = line.end
            continue
        try:
            if line.text is None:
                raise MalformedEvent(f"a line over the {MAX_EVENT_BYTES} bytes an event may have")
            event: Event | MalformedEvent = parse_event(line.text)
        except MalformedEvent as error:
            event = MalformedEvent(f"{path} at byte {line_start}: not an event: {error}")
        yield line.end, event
        line_start = line.end


class EventTail:
    """The events a growing file gets, each once: `read` returns those complete since the last call; a last line
    still being written is read once it ends. `start`: the byte the events of interest begin at (the file's size when
    this start of the ServerApp was submitted); `on_malformed`: as read_events'."""

    def __init__(
        self, path: Path, start: int = 0, on_malformed: Callable[[MalformedEvent], None] | None = None
    ) -> None:
        self.path, self.offset, self.on_malformed = path, start, on_malformed

    def read(self) -> list[Event]:
        """The new events: those whose lines ended since the last call.

        Returns:
            The events, in file order; [] while there is no file.

        Raises:
            MalformedEvent: a new line is no event (without `on_malformed`); the next call reads from that line again.
        """
        events = []
        try:
            for end, event in _read_lines(self.path, self.offset):
                if isinstance(event, Event):
                    events.append(event)
                elif self.on_malformed is None:
                    raise event
                else:
                    self.on_malformed(event)
                self.offset = end
        except FileNotFoundError:
            return []
        return events


def last_start(events: list[Event]) -> list[Event]:
    """The events of the newest start of the ServerApp.

    Args:
        events: a federation's events, in file order.

    Returns:
        The events from the last run_started event on; all of them if none is one.
    """
    starts = [index for index, event in enumerate(events) if event.type == RUN_STARTED]
    return events[starts[-1] :] if starts else events
