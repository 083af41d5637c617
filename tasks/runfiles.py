"""What a federation's own files say about it, for `fedbayes runs`, `status` and `clients` (deploy/inspection.py).

A RUN is a `fedbayes local` workdir (its run-config.toml names the server state directory, the federation and the
results file), or a server state directory with `--federation NAME` (where `fedbayes run` and `fedbayes server` keep
a federation: its results file is the one its results-start.json names). Every file is data: each is read through
the bounded readers (tasks/storage.py) and checked, and one that is damaged is named with what is wrong with it,
never a traceback. Nothing is written, and the server lock is never taken.

A run's status is decided from what is on disk (`decide_status`):

- running: a process holds the federation's server lock (<server-state-dir>/<federation>/server.lock, looked up in
  /proc/locks, not taken), or, for a workdir, a live process has the workdir's Flower home (its SuperLink and
  SuperNodes: `fedbayes local` is up, its ServerApp maybe not yet);
- failed: not running, and the newest start of its ServerApp ended failed, with a reason (its event stream,
  <server-state-dir>/<federation>/events.jsonl, tasks/events.py);
- finished: not running, and the results hold the planned rounds (num-server-rounds, raised by a forget's refinement
  rounds, forget-audit.jsonl);
- stopped: none of these: interrupted (Ctrl-C), killed, or its machine went down before its planned rounds
  (`fedbayes local ... --resume` continues it). Without a run config (a bare state directory) the planned rounds are
  unknown, so a federation neither running nor failed is stopped.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedbayes.tasks.config import RUN_CONFIG_FILE
from fedbayes.tasks.events import EVENTS_FILE, FAILED, RUN_ENDED, TRACKING, last_start, read_events
from fedbayes.tasks.report import parsed_row, split_federations
from fedbayes.tasks.storage import MAX_LINE_BYTES, MAX_RECORD_BYTES, complete_lines, is_safe_name, read_bounded

MAX_CONFIG_BYTES = 2**20  # a run-config.toml or Flower connection file: a few hundred keys
# The names the server and the launcher give their files; tasks imports neither (tests/unit/test_inspection.py
# checks that the names agree).
FLWR_HOME = "flwr-home"  # deploy/launcher.py FLWR_HOME
LOCK_FILE = "server.lock"  # server/forget/lock.py LOCK_FILE
AUDIT_LOG = "forget-audit.jsonl"  # server/forget/audit.py AUDIT_LOG
RESULTS_START = "results-start.json"  # server/loop.py RESULTS_START
METRICS = ("accuracy", "nll", "ece")  # of the global model; the Bayesian strategies' ensemble's too: <name>_ensemble
# A results row's label of a client left out (server/round_core.py node_label, reply_label): its id comes first.
_CLIENT_LABEL = re.compile(r"^client '([A-Za-z0-9._-]+)' \(node (\d+)\)")


class InspectError(ValueError):
    """A run's file cannot be read or is not what fedbayes writes there: the message names the file and why."""


def warn(message: str) -> None:
    """A file's problem that does not stop the command (a line left out), on stderr.

    Args:
        message: the problem, naming the file; printed after "fedbayes: warning: ".
    """
    print(f"fedbayes: warning: {message}", file=sys.stderr)


# ---- where a run keeps its files ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunFiles:
    """One federation's files: its server state directory and name, and, for a `fedbayes local` workdir, the
    workdir and the run config it was submitted with ({} for a bare state directory)."""

    name: str
    state_dir: Path
    federation: str
    run_config: dict[str, Any]
    workdir: Path | None = None

    @property
    def directory(self) -> Path:
        """<server-state-dir>/<federation>: its checkpoints, lock, results start and forget audit log."""
        return self.state_dir / self.federation


def locate(run: Path, federation: str | None = None) -> RunFiles:
    """The files of RUN: a `fedbayes local` workdir, or with `federation` a server state directory holding it.

    Args:
        run: a workdir, or a server state directory.
        federation: the federation in the state directory `run`; None (or empty) when `run` is a workdir.

    Returns:
        The federation's name (the workdir's for a workdir), state directory and federation, and, for a workdir, the
        workdir and its run config.

    Raises:
        InspectError: `federation` is no safe name or no directory in `run`, `run` is no workdir, or its run config is
            damaged or names no server-state-dir or federation.
    """
    if federation:
        if not is_safe_name(federation):
            raise InspectError(f"--federation {federation[:64]!r} is no federation name ([A-Za-z0-9._-]+)")
        if not (run / federation).is_dir():
            raise InspectError(f"{run / federation} is no directory: {run} holds no federation {federation!r}")
        return RunFiles(federation, run, federation, {})
    config_file = run / RUN_CONFIG_FILE
    if not config_file.is_file():
        raise InspectError(
            f"{run} is not a `fedbayes local` workdir (it has no {RUN_CONFIG_FILE}); for a server state directory, "
            "name the federation with --federation"
        )
    config = read_toml(config_file, "a run config")
    for key in ("server-state-dir", "federation"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise InspectError(f"{config_file} names no {key} (`fedbayes local` writes it)")
    return RunFiles(run.name, Path(config["server-state-dir"]), config["federation"], config, run)


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file of ours, read no further than MAX_CONFIG_BYTES.

    Args:
        path: the file.
        what: what it is, for the message ("a run config").

    Returns:
        The parsed table.

    Raises:
        InspectError: naming the file, if it cannot be read, is too large, or is no UTF-8 TOML.
    """
    try:
        return tomllib.loads(read_bounded(path, MAX_CONFIG_BYTES, what).decode())
    except (OSError, ValueError) as error:  # FileTooLarge, UnicodeDecodeError and TOMLDecodeError are ValueErrors
        raise InspectError(f"{path}: cannot read {what}: {error}") from None


def read_json_record(path: Path, what: str) -> dict[str, Any] | None:
    """A one-object JSON file of ours, read no further than MAX_RECORD_BYTES.

    Args:
        path: the file.
        what: what it is, for the message ("a results start record").

    Returns:
        The object, or None when there is no such file.

    Raises:
        InspectError: naming the file, if it cannot be read, is too large, is no JSON, or is no JSON object.
    """
    try:
        record = json.loads(read_bounded(path, MAX_RECORD_BYTES, what))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as error:
        raise InspectError(f"{path}: cannot read {what}: {error}") from None
    if not isinstance(record, dict):
        raise InspectError(f"{path}: {what} is a JSON {type(record).__name__}, not an object")
    return record


# ---- results rows -------------------------------------------------------------------------------------------------
def results_location(files: RunFiles) -> tuple[Path | None, int]:
    """The federation's results file and the line its rows start after.

    Args:
        files: the federation's files.

    Returns:
        What its results-start.json records (the ServerApp notes it when it starts); else its run config's
        results-path (or a workdir's results.jsonl) from the file's start; (None, 0) when it is not known.

    Raises:
        InspectError: results-start.json is damaged or holds no path and first_line >= 0.
    """
    start_file = files.directory / RESULTS_START
    start = read_json_record(start_file, "a results start record")
    if start is not None:
        path, first_line = start.get("path"), start.get("first_line")
        if not isinstance(path, str) or type(first_line) is not int or first_line < 0:
            raise InspectError(f"{start_file}: not a results start record (a path and a first_line >= 0)")
        return Path(path), first_line
    configured = files.run_config.get("results-path")
    if isinstance(configured, str) and configured:
        return Path(configured), 0
    return (files.workdir / "results.jsonl", 0) if files.workdir else (None, 0)


def read_rows(path: Path, first_line: int = 0, say: Callable[[str], None] = warn) -> list[dict[str, Any]]:
    """The federation's rows: those after the file's first `first_line` lines (an earlier federation's), the last
    federation's where the rounds start again.

    Args:
        path: the results file (JSON lines); one that does not exist holds no rows.
        first_line: the lines to skip, >= 0.
        say: told, naming file and line, of each line that is no row (which is left out); default: warn.

    Returns:
        The rows, in file order; empty for a missing file.

    Raises:
        InspectError: the file cannot be read, or none of its lines is a row.
    """
    rows, unusable = [], 0
    try:
        for line in complete_lines(path):
            if line.number <= first_line or (line.text is not None and not line.text.strip()):
                continue
            row = row_or_problem(line.text)
            if isinstance(row, str):
                unusable += 1
                say(f"{path}:{line.number}: {row}; left out")
            else:
                rows.append(row)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise InspectError(f"{path}: cannot read the results: {error}") from None
    if unusable and not rows:
        raise InspectError(f"{path}: none of its {unusable} lines is a results row (each is named above)")
    federations = split_federations(rows)
    return federations[-1] if federations else []


def row_or_problem(text: bytes | None) -> dict[str, Any] | str:
    """A results row, or why the line holds none: what the report checks (tasks/report.py parsed_row), and the fields
    only these commands read.

    Args:
        text: one line of a results file without its newline, or None for a line over MAX_LINE_BYTES.

    Returns:
        The row, or the problem in words (too long, no JSON object, a field of the wrong type).
    """
    if text is None:
        return f"over {MAX_LINE_BYTES} bytes, longer than any results row"
    row = parsed_row(text.decode(errors="replace"))
    if isinstance(row, str):
        return row
    checks: dict[str, tuple[Callable[[Any], bool], str]] = {
        "rejected": (
            lambda value: isinstance(value, dict) and all(isinstance(v, str) for v in value.values()),
            "an object of reasons",
        ),
        "reply_seconds": (lambda value: isinstance(value, dict), "an object of seconds"),
        "warnings": (lambda value: isinstance(value, list) and all(isinstance(v, str) for v in value), "a list"),
    }
    for key, (usable, what) in checks.items():
        if key in row and not usable(row[key]):
            return f"field {key!r} is not {what}"
    return row


def last_evaluated(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The last row whose round the server evaluated (`eval-every`).

    Args:
        rows: results rows, in round order.

    Returns:
        The last row with an accuracy, or None when no round was evaluated.
    """
    return next((row for row in reversed(rows) if row.get("accuracy") is not None), None)


def client_of_label(label: str) -> tuple[str, int | None]:
    """The client a results row's label of a left-out reply names, and its node.

    Args:
        label: a key of a row's `rejected`: "client 'ID' (node N) ...", "node N", or another label ("round").

    Returns:
        The client id and node of a client label; else the label itself and the node of "node N" (None for others).
    """
    match = _CLIENT_LABEL.match(label)
    if match:
        return match.group(1), int(match.group(2))
    node = re.fullmatch(r"node (\d+)", label)
    return label, int(node.group(1)) if node else None


@dataclass
class ClientTally:
    """One client's rounds in the results: accepted, left out (refused, silent or absent) with each reason's rounds,
    and the last round it answered or was left out in."""

    client: str
    node: int | None = None  # the node it answered from, as the rows name it (a refused id's claimed node too)
    accepted: int = 0
    refused: int = 0
    last_round: int = 0
    reasons: dict[str, list[int]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The tally as `fedbayes clients --json` prints it.

        Returns:
            Its fields, the reasons as a list of {"reason", "rounds"} objects.
        """
        reasons = [{"reason": reason, "rounds": rounds} for reason, rounds in self.reasons.items()]
        return {**{k: v for k, v in vars(self).items() if k != "reasons"}, "reasons": reasons}


def client_tallies(rows: Iterable[Mapping[str, Any]]) -> dict[str, ClientTally]:
    """Per client, what the rows say: its reply was accepted in a round that accepted any where it answered
    (`reply_seconds`) and was not left out (`rejected`); it was seen in each round it answered or was left out in.

    Args:
        rows: results rows, checked (row_or_problem).

    Returns:
        Client id (`node N` where the row names no id) -> its tally, sorted by id.
    """
    tallies: dict[str, ClientTally] = {}

    def tally(client: str, server_round: int) -> ClientTally:
        entry = tallies.setdefault(client, ClientTally(client))
        entry.last_round = max(entry.last_round, server_round)
        return entry

    for row in rows:
        server_round = row["round"]
        left_out = {client_of_label(label): reason for label, reason in row.get("rejected", {}).items()}
        for (client, node), reason in left_out.items():
            entry = tally(client, server_round)
            entry.node = node if node is not None else entry.node
            entry.refused += 1
            entry.reasons.setdefault(reason, []).append(server_round)
        # a reply is timed under its node's client id, or as `node N` where its node is bound to none
        refused = {client for client, _ in left_out} | {f"node {node}" for _, node in left_out if node is not None}
        for client in row.get("reply_seconds", {}):
            if client not in refused:
                tally(client, server_round).accepted += bool(row.get("clients"))
    return dict(sorted(tallies.items()))


# ---- events and processes ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EventFindings:
    """What the events of the newest start of the ServerApp say (tasks/events.py): the failure it ended with (None:
    none) and its tracking notices."""

    path: Path
    failure: str | None = None
    tracking: tuple[str, ...] = ()


def read_run_events(files: RunFiles) -> EventFindings:
    """The failure and tracking notices of the federation's newest start, from its events file (a line that is no
    event is named and left out).

    Args:
        files: the federation's files.

    Returns:
        The events file's path, the newest start's failure reason (None: it did not end failed) and its tracking
        notices; neither for a federation without an events file.

    Raises:
        InspectError: the file cannot be read.
    """
    path = files.directory / EVENTS_FILE
    try:
        events = [event for _, event in read_events(path, on_malformed=lambda error: warn(f"{error}; left out"))]
    except FileNotFoundError:
        return EventFindings(path)
    except OSError as error:
        raise InspectError(f"{path}: cannot read the events: {error}") from None
    newest = last_start(events)
    ended = [event.fields for event in newest if event.type == RUN_ENDED]
    failure = None
    if ended and ended[-1]["outcome"] == FAILED:
        failure = ended[-1]["reason"] or "the ServerApp gave no reason"
    tracking = tuple(event.fields["message"] for event in newest if event.type == TRACKING)
    return EventFindings(path, failure, tracking)


def lock_holders(lock: Path, locks_table: Path = Path("/proc/locks")) -> list[int]:
    """The processes that hold `lock` (an flock), from the kernel's table of locks: nothing is locked to find out.

    Args:
        lock: the lock file.
        locks_table: the kernel's table of locks (/proc/locks format), read no further than 64 MiB.

    Returns:
        The holders' process ids, sorted; none when the lock file or table is missing or unreadable for permission.
    """
    try:
        stat = os.stat(lock)
        table = read_bounded(locks_table, 64 * 2**20, "the kernel's table of locks").decode()
    except (FileNotFoundError, PermissionError):
        return []
    file_id = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    holders = []
    for line in table.splitlines():
        fields = line.split()  # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF" ("->" marks a waiter)
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file_id and fields[4].isdigit():
            holders.append(int(fields[4]))
    return sorted(set(holders))


def processes_with_flwr_home(flwr_home: Path) -> list[int]:
    """Live processes of this user whose environment says FLWR_HOME=`flwr_home` (a local federation's).

    Args:
        flwr_home: the Flower home, resolved, as the launcher set it.

    Returns:
        Their process ids, sorted; zombies and processes whose environment cannot be read are left out.
    """
    needle = f"FLWR_HOME={flwr_home}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
                continue
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except (OSError, IndexError):  # gone meanwhile, or another user's
            continue
    return sorted(found)


def live_processes(files: RunFiles) -> list[int]:
    """The processes that make the federation running (module docstring).

    Args:
        files: the federation's files.

    Returns:
        The ids of the holders of its server lock and, for a workdir, of the processes with its Flower home, sorted.
    """
    workdir = [] if files.workdir is None else processes_with_flwr_home((files.workdir / FLWR_HOME).resolve())
    return sorted({*lock_holders(files.directory / LOCK_FILE), *workdir})


# ---- the decision ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Status:
    state: str  # running | failed | finished | stopped
    why: str


def decide_status(processes: Sequence[int], done: int, planned: int | None, failure: str | None) -> Status:
    """The status of a federation, from what its files say (module docstring).

    Args:
        processes: the live processes that make it running (live_processes).
        done: the last round its results hold, 0 for none.
        planned: the rounds it is to run (planned_rounds); None: unknown.
        failure: the reason its newest start ended failed; None: it did not.

    Returns:
        "running", "failed", "finished" or "stopped" in that order of precedence, with why in words.
    """
    if processes:
        return Status("running", f"live process {', '.join(map(str, processes))}")
    if failure is not None:
        return Status("failed", failure)
    if planned is not None and done >= planned:
        return Status("finished", f"all {planned} rounds are done")
    done_of = (
        f"{done} of {planned} rounds done" if planned is not None else f"{done} rounds done (of a number not known)"
    )
    return Status(
        "stopped",
        f"no process runs it; {done_of}, and no failure reported: interrupted, killed, or its machine went down",
    )


def audit_records(files: RunFiles) -> list[dict[str, Any]]:
    """The forget audit log's records (server/forget/); a line that is none is named and skipped.

    Args:
        files: the federation's files.

    Returns:
        The JSON objects of the log, in order; none for a federation without one.

    Raises:
        InspectError: the log cannot be read.
    """
    path = files.directory / AUDIT_LOG
    records = []
    try:
        for line in complete_lines(path):
            try:
                record = json.loads(line.text) if line.text is not None else None
            except (ValueError, RecursionError):
                record = None
            if isinstance(record, dict):
                records.append(record)
            else:
                warn(f"{path}:{line.number}: not a forget audit record; left out")
    except FileNotFoundError:
        return []
    except OSError as error:
        raise InspectError(f"{path}: cannot read the forget audit log: {error}") from None
    return records


def planned_rounds(files: RunFiles, records: Sequence[Mapping[str, Any]]) -> int | None:
    """num-server-rounds, raised to the last round a forget's refinement asked for (server/forget/settling.py
    rounds_to_run).

    Args:
        files: the federation's files; its run config gives num-server-rounds.
        records: its forget audit records (audit_records).

    Returns:
        The rounds the federation is to run, or None without a run config (or an integer num-server-rounds in it).
    """
    configured = files.run_config.get("num-server-rounds")
    if type(configured) is not int:
        return None
    refined = [
        record["refine_through_round"]
        for record in records
        if record.get("event") == "forgotten" and type(record.get("refine_through_round")) is int
    ]
    return max([configured, *refined])


@dataclass(frozen=True)
class Snapshot:
    """What a federation's files say, read once for any of the three commands."""

    files: RunFiles
    rows: list[dict[str, Any]]
    results: Path | None
    status: Status
    planned: int | None
    events: EventFindings
    records: list[dict[str, Any]]

    @property
    def strategy(self) -> str:
        return str(self.files.run_config.get("strategy", "?"))


def snapshot(files: RunFiles) -> Snapshot:
    """Read the federation's rows, audit log and events, and decide its status.

    Args:
        files: the federation's files (locate).

    Returns:
        The files, rows, results path, status, planned rounds, events and audit records.

    Raises:
        InspectError: one of those files is damaged (named, with why).
    """
    results, first_line = results_location(files)
    rows = read_rows(results, first_line) if results is not None else []
    records = audit_records(files)
    planned = planned_rounds(files, records)
    events = read_run_events(files)
    done = rows[-1]["round"] if rows else 0
    status = decide_status(live_processes(files), done, planned, events.failure)
    return Snapshot(files, rows, results, status, planned, events, records)


def metrics_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last evaluated round's metrics (the ensemble's too, where the strategy has one).

    Args:
        rows: results rows, in round order.

    Returns:
        "round" and each of METRICS (and <metric>_ensemble) the row holds, or None when no round was evaluated.
    """
    evaluated = last_evaluated(rows)
    if evaluated is None:
        return None
    names = [f"{name}{kind}" for kind in ("", "_ensemble") for name in METRICS]
    return {"round": evaluated["round"], **{name: evaluated[name] for name in names if name in evaluated}}
