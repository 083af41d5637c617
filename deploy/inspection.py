"""`fedbayes runs`, `fedbayes status` and `fedbayes clients`: what a federation's own files say about it, and what
a running SuperLink says about its runs and nodes.

A RUN is a `fedbayes local` workdir (its run-config.toml names the server state directory, the federation and the
results file), or a server state directory with `--federation NAME` (where `fedbayes run` and `fedbayes server` keep
a federation: its results file is the one its results-start.json names). Every file is data: each is read through
the bounded readers (tasks/storage.py) and checked, and one that is damaged is named with what is wrong with it,
never a traceback. Nothing is written, and the server lock is never taken.

A run's status is decided from what is on disk (`decide_status`):

- running: a process holds the federation's server lock (<server-state-dir>/<federation>/server.lock, looked up in
  /proc/locks, not taken), or, for a workdir, a live process has the workdir's Flower home (its SuperLink and
  SuperNodes: `fedbayes local` is up, its ServerApp maybe not yet);
- failed: not running, and the newest start's server log (<workdir>/logs*/flwr-run.log) reports
  `fedbayes run failed: <reason>`;
- finished: not running, and the results hold the planned rounds (num-server-rounds, raised by a forget's refinement
  rounds, forget-audit.jsonl);
- stopped: none of these: interrupted (Ctrl-C), killed, or its machine went down before its planned rounds
  (`fedbayes local ... --resume` continues it). Without a run config (a bare state directory) the planned rounds are
  unknown, so a federation neither running nor failed is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedbayes.tasks.config import RUN_CONFIG_FILE, RunSettings, keys_of
from fedbayes.tasks.report import parsed_row, split_federations
from fedbayes.tasks.runlog import failure_reason
from fedbayes.tasks.storage import MAX_LINE_BYTES, MAX_RECORD_BYTES, complete_lines, is_safe_name, read_bounded

RUNS_DIRECTORY = Path("runs")  # where `fedbayes local` makes its workdirs (deploy/launcher.py default_workdir)
MAX_CONFIG_BYTES = 2**20  # a run-config.toml or Flower connection file: a few hundred keys
FLWR_HOME = "flwr-home"  # deploy/launcher.py FLWR_HOME, not imported: the launcher imports the whole client side
LOCK_FILE = "server.lock"  # server/forget.py LOCK_FILE
AUDIT_LOG = "forget-audit.jsonl"  # server/forget.py AUDIT_LOG
RESULTS_START = "results-start.json"  # server/loop.py RESULTS_START
SERVER_LOG = "flwr-run.log"  # the log of `fedbayes run`, which streams the ServerApp's (deploy/launcher.py)
REASONS_SHOWN = 3  # distinct refusal reasons the text shows per client (--json has them all)
REASON_WIDTH = 160  # characters of a reason the text shows
_LOG_MESSAGE = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s+(.*)$")
# A results row's label of a client left out (server/round_core.py node_label, _claimed_label): its id comes first.
_CLIENT_LABEL = re.compile(r"^client '([A-Za-z0-9._-]+)' \(node (\d+)\)")


class InspectError(ValueError):
    """A run's file cannot be read or is not what fedbayes writes there: the message names the file and why."""


def warn(message: str) -> None:
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

    Raises:
        InspectError: RUN is neither, or its run config is damaged.
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
    """A TOML file of ours, bounded; InspectError naming it if it is too large or no TOML."""
    try:
        return tomllib.loads(read_bounded(path, MAX_CONFIG_BYTES, what).decode())
    except (OSError, ValueError) as error:  # FileTooLarge, UnicodeDecodeError and TOMLDecodeError are ValueErrors
        raise InspectError(f"{path}: cannot read {what}: {error}") from None


def read_json_record(path: Path, what: str) -> dict[str, Any] | None:
    """A one-object JSON file of ours (None: there is none); InspectError naming it if it is damaged."""
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
    """The federation's results file and the line its rows start after: what its results-start.json records (the
    ServerApp notes it when it starts), else its run config's results-path from the file's start (None: unknown)."""
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
    federation's where the rounds start again. A line that is no row is left out and `say`d, named by file and line.

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
    """A results row, or why the line holds none: what the report checks (tasks/report.py parsed_row), and the
    fields only these commands read."""
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
    """The last row whose round the server evaluated (`eval-every`)."""
    return next((row for row in reversed(rows) if row.get("accuracy") is not None), None)


def client_of_label(label: str) -> tuple[str, int | None]:
    """The client a results row's label of a left-out reply names, and its node: its client id, else the label
    (`node 7`, `round`)."""
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
        reasons = [{"reason": reason, "rounds": rounds} for reason, rounds in self.reasons.items()]
        return {**{k: v for k, v in vars(self).items() if k != "reasons"}, "reasons": reasons}


def client_tallies(rows: Iterable[Mapping[str, Any]]) -> dict[str, ClientTally]:
    """Per client (by id; `node N` where the row names no id), what the rows say: its reply was accepted in a round
    that accepted any where it answered (`reply_seconds`) and was not left out (`rejected`); it was seen in each
    round it answered or was left out in."""
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
        refused = {client for client, _ in left_out}
        for client in row.get("reply_seconds", {}):
            if client not in refused:
                tally(client, server_round).accepted += bool(row.get("clients"))
    return dict(sorted(tallies.items()))


# ---- logs and processes ---------------------------------------------------------------------------------------------
def newest_log_dir(workdir: Path) -> Path | None:
    """The logs of the workdir's newest start: logs, or for a resume logs-2, logs-3, ... (deploy/launcher.py)."""
    numbered = []
    for path in workdir.glob("logs*"):
        match = re.fullmatch(r"logs(?:-(\d+))?", path.name)
        if match and path.is_dir() and any(path.iterdir()):
            numbered.append((int(match.group(1) or 1), path))
    return max(numbered)[1] if numbered else None


@dataclass(frozen=True)
class LogFindings:
    """What the server log of a start says: the failure it reported (None: none) and its tracking messages."""

    log: Path | None
    failure: str | None = None
    tracking: tuple[str, ...] = ()


def read_server_log(workdir: Path | None) -> LogFindings:
    """The failure and tracking lines of the newest start's server log (a line over the bound is skipped)."""
    log_dir = newest_log_dir(workdir) if workdir else None
    log = log_dir / SERVER_LOG if log_dir else None
    if log is None or not log.is_file():
        return LogFindings(log)
    failure, tracking = None, []
    try:
        for line in complete_lines(log):
            text = "" if line.text is None else line.text.decode(errors="replace").strip()
            failure = failure_reason(text) or failure
            message = _LOG_MESSAGE.match(text)
            if message and message.group(1).startswith("tracking"):
                tracking.append(message.group(1))
    except OSError as error:
        raise InspectError(f"{log}: cannot read the server log: {error}") from None
    return LogFindings(log, failure, tuple(tracking))


def lock_holders(lock: Path, locks_table: Path = Path("/proc/locks")) -> list[int]:
    """The processes that hold `lock` (an flock), from the kernel's table of locks: nothing is locked to find out."""
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
    """Live processes of this user whose environment says FLWR_HOME=`flwr_home` (a local federation's)."""
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
    """The processes that make the federation running (module docstring)."""
    workdir = [] if files.workdir is None else processes_with_flwr_home((files.workdir / FLWR_HOME).resolve())
    return sorted({*lock_holders(files.directory / LOCK_FILE), *workdir})


# ---- the decision ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Status:
    state: str  # running | failed | finished | stopped
    why: str


def decide_status(processes: Sequence[int], done: int, planned: int | None, failure: str | None) -> Status:
    """The status of a federation whose results hold `done` rounds of `planned` (None: unknown), with `processes`
    live and the newest start's reported `failure` (module docstring)."""
    if processes:
        return Status("running", f"live process {', '.join(map(str, processes))}")
    if failure is not None:
        return Status("failed", failure)
    if planned is not None and done >= planned:
        return Status("finished", f"all {planned} rounds are done")
    of = f"of {planned} " if planned is not None else ""
    return Status(
        "stopped",
        f"no process runs it, after {done} rounds {of}and with no failure reported (interrupted, killed, or its "
        "machine went down)",
    )


def audit_records(files: RunFiles) -> list[dict[str, Any]]:
    """The forget audit log's records (server/forget.py); a line that is none is named and skipped."""
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
    """num-server-rounds, raised to the last round a forget's refinement asked for (server/forget.py rounds_to_run);
    None without a run config."""
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
    log: LogFindings
    records: list[dict[str, Any]]

    @property
    def strategy(self) -> str:
        return str(self.files.run_config.get("strategy", "?"))


def snapshot(files: RunFiles) -> Snapshot:
    results, first_line = results_location(files)
    rows = read_rows(results, first_line) if results is not None else []
    records = audit_records(files)
    planned = planned_rounds(files, records)
    log = read_server_log(files.workdir)
    done = rows[-1]["round"] if rows else 0
    status = decide_status(live_processes(files), done, planned, log.failure)
    return Snapshot(files, rows, results, status, planned, log, records)


def metrics_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last evaluated round's metrics (the ensemble's too, where the strategy has one)."""
    evaluated = last_evaluated(rows)
    if evaluated is None:
        return None
    names = [name for name in ("accuracy", "nll", "ece") for name in (name, f"{name}_ensemble")]
    return {"round": evaluated["round"], **{name: evaluated[name] for name in names if name in evaluated}}


# ---- fedbayes runs ---------------------------------------------------------------------------------------------
def find_runs(directory: Path) -> list[Path]:
    """The `fedbayes local` workdirs in `directory` (or `directory` itself, if it is one), by name.

    Raises:
        InspectError: `directory` is no directory.
    """
    if not directory.is_dir():
        raise InspectError(f"{directory} is no directory (`fedbayes local` makes its workdirs in {RUNS_DIRECTORY}/)")
    if (directory / RUN_CONFIG_FILE).is_file():
        return [directory]
    return sorted(path for path in directory.iterdir() if (path / RUN_CONFIG_FILE).is_file())


def run_summary(workdir: Path) -> dict[str, Any]:
    """One line of `fedbayes runs`: its error (naming the file) where its files cannot be read."""
    try:
        shot = snapshot(locate(workdir))
    except (InspectError, OSError) as error:
        return {"name": workdir.name, "path": str(workdir), "error": str(error)}
    return {
        "name": workdir.name,
        "path": str(workdir),
        "federation": shot.files.federation,
        "strategy": shot.strategy,
        "rounds_done": shot.rows[-1]["round"] if shot.rows else 0,
        "rounds_planned": shot.planned,
        "status": shot.status.state,
        "why": shot.status.why,
        "metrics": metrics_of(shot.rows),
    }


def runs_table(summaries: Sequence[Mapping[str, Any]]) -> str:
    header = ("run", "strategy", "rounds", "status", "accuracy", "nll")
    lines = []
    for run in summaries:
        if "error" in run:
            lines.append((run["name"], "?", "?", "unreadable", "-", "-"))
            continue
        metrics = run["metrics"] or {}
        lines.append(
            (
                run["name"],
                run["strategy"],
                f"{run['rounds_done']}/{'?' if run['rounds_planned'] is None else run['rounds_planned']}",
                run["status"],
                *(f"{metrics[key]:.4f}" if key in metrics else "-" for key in ("accuracy", "nll")),
            )
        )
    return aligned([header, *lines])


def aligned(lines: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines)


# ---- the checkpoint -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointView:
    """The newest checkpoint: its round and file, the rounds kept, the run config it holds, and the round core's
    state in it (server/round_core.py state_dict): bound ids, accepted rounds, quarantine, forget ledger."""

    server_round: int
    path: Path
    kept_rounds: list[int]
    run_config: dict[str, Any]
    bound: dict[str, int]
    accepted_rounds: dict[str, int]
    quarantined_until: dict[int, int]  # node -> the last round it sits out
    contributed: dict[str, list[list[int]]]
    revoked: list[str]
    records: list[dict[str, Any]]


def read_checkpoint(files: RunFiles) -> CheckpointView | None:
    """The federation's newest checkpoint, every field checked as a resume checks it (server/checkpoint.py); None
    when it has none yet.

    Raises:
        CheckpointError: it is damaged (named, with the field). InspectError: its round core state is not what this
            version writes.
    """
    from fedbayes.server.checkpoint import CheckpointStore
    from fedbayes.server.identity import ForgetLedger
    from fedbayes.server.round_core import CORE_STATE_KEY

    store = CheckpointStore(files.state_dir, files.federation, {})
    kept = store.kept_rounds()
    if not kept:
        return None
    checkpoint, run_config = store.read()
    path = store.round_path(checkpoint.server_round)
    try:
        core = json.loads(checkpoint.strategy_state.metadata[CORE_STATE_KEY])
        ledger = ForgetLedger.from_metadata(core["forget-ledger"]) if "forget-ledger" in core else ForgetLedger()
        return CheckpointView(
            checkpoint.server_round,
            path,
            kept,
            run_config,
            {client: int(node) for client, node in json.loads(core["identities"]).items()},
            {client: int(server_round) for client, server_round in core["accepted_rounds"].items()},
            {int(node): int(last) for node, last in core["quarantine"]["until"].items()},
            ledger.contributed,
            sorted(ledger.revoked),
            list(ledger.records),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise InspectError(
            f"{path}: its round core state ({CORE_STATE_KEY}) is not what this version writes: "
            f"{type(error).__name__}: {error}"
        ) from None


def checkpoint_json(view: CheckpointView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return {"round": view.server_round, "path": str(view.path), "kept_rounds": view.kept_rounds}


# ---- fedbayes status ---------------------------------------------------------------------------------------------
def status_report(files: RunFiles) -> dict[str, Any]:
    """Everything `fedbayes status RUN` says, as its --json prints it."""
    shot = snapshot(files)
    view = read_checkpoint(files)
    strategy = shot.strategy if files.run_config else str((view.run_config if view else {}).get("strategy", "?"))
    last = shot.rows[-1] if shot.rows else None
    tracking = str(files.run_config.get("tracking", "")) if files.run_config else None
    report: dict[str, Any] = {
        "run": files.name,
        "federation": files.federation,
        "strategy": strategy,
        "status": shot.status.state,
        "why": shot.status.why,
        "rounds_done": last["round"] if last else 0,
        "rounds_planned": shot.planned,
        "results": None if shot.results is None else str(shot.results),
        "last_round": None
        if last is None
        else {
            key: last.get(key)
            for key in ("round", "clients", "clients_sent", "clients_rejected", "quarantined", "warnings")
        },
        "metrics": metrics_of(shot.rows),
        "connected": connected_nodes(files) if shot.status.state == "running" else None,
        "clients": [tally.as_json() for tally in client_tallies(shot.rows).values()],
        "checkpoint": checkpoint_json(view),
        "tracking": {
            "target": tracking,
            "messages": list(shot.log.tracking),
            "log": None if shot.log.log is None else str(shot.log.log),
        },
    }
    return report


def connected_nodes(files: RunFiles) -> dict[str, Any]:
    """The nodes a running workdir's SuperLink holds online, asked through its Flower connection; why not, where it
    cannot be asked (a bare state directory's SuperLink: `--superlink`)."""
    config_file = None if files.workdir is None else files.workdir / FLWR_HOME / "config.toml"
    if config_file is None or not config_file.is_file():
        return {"online": None, "note": "not known here: ask the SuperLink (fedbayes status --superlink ADDR)"}
    try:
        connection = read_toml(config_file, "a Flower connection")
        default = connection["superlink"]["default"]
        entry = connection["superlink"][default]
        nodes = ask_superlink(entry["address"], entry.get("root-certificates"))["nodes"]
    except (InspectError, RuntimeError, KeyError, TypeError) as error:
        return {"online": None, "note": f"its SuperLink did not tell: {error}"}
    return {"online": sum(node["status"] == "online" for node in nodes), "note": f"of {len(nodes)} nodes it knows"}


def status_text(report: Mapping[str, Any]) -> str:
    planned = "?" if report["rounds_planned"] is None else report["rounds_planned"]
    lines = [
        f"run {report['run']}: federation {report['federation']}, strategy {report['strategy']}",
        f"status: {report['status']} ({report['why']})",
        f"round: {report['rounds_done']}/{planned} done; results {report['results'] or 'unknown'}",
    ]
    metrics = report["metrics"]
    if metrics:
        shown = " | ".join(f"{name} {value:.4f}" for name, value in metrics.items() if name != "round")
        lines.append(f"metrics (round {metrics['round']}): {shown}")
    last = report["last_round"]
    if last:
        online = connected_text(report["connected"])
        lines.append(
            f"last round {last['round']}: {last['clients']} accepted of {last['clients_sent']} sent work, "
            f"{last['clients_rejected']} left out{online}"
        )
        lines += [f"  quarantined: {', '.join(last['quarantined'])}"] * bool(last.get("quarantined"))
        lines += [f"  warning: {warning}" for warning in last.get("warnings") or ()]
    if report["clients"]:
        lines.append("clients (rounds accepted / left out, and why):")
        for client in report["clients"]:
            lines.append(f"  {client['client']}: {client['accepted']} accepted, {client['refused']} left out")
            for reason in client["reasons"][-REASONS_SHOWN:]:
                text = reason["reason"]
                text = text if len(text) <= REASON_WIDTH else f"{text[: REASON_WIDTH - 3]}..."
                lines.append(f"    rounds {rounds_text(reason['rounds'])}: {text}")
            hidden = len(client["reasons"]) - REASONS_SHOWN
            lines += [f"    ... and {hidden} other reasons (--json lists them all)"] * (hidden > 0)
    checkpoint = report["checkpoint"]
    lines.append(
        f"checkpoint: round {checkpoint['round']}, {checkpoint['path']} (kept rounds "
        f"{rounds_text(checkpoint['kept_rounds'])})"
        if checkpoint
        else "checkpoint: none yet"
    )
    tracking = report["tracking"]
    target = tracking["target"]
    lines.append(f"tracking: {'unknown (no run config)' if target is None else target or 'off'}")
    lines += [f"  {message}" for message in tracking["messages"]]
    return "\n".join(lines)


def connected_text(connected: Mapping[str, Any] | None) -> str:
    """ "; connected now: N (of M nodes it knows)", or nothing for a run that is not running."""
    if connected is None:
        return ""
    online = "?" if connected["online"] is None else connected["online"]
    return f"; connected now: {online} ({connected['note']})"


def rounds_text(rounds: Sequence[int]) -> str:
    """1-3, 5, 7-8."""
    spans: list[list[int]] = []
    for server_round in sorted(rounds):
        if spans and server_round == spans[-1][1] + 1:
            spans[-1][1] = server_round
        else:
            spans.append([server_round, server_round])
    return ", ".join(f"{first}-{last}" if last > first else str(first) for first, last in spans)


# ---- fedbayes status --superlink -----------------------------------------------------------------------------
def ask_superlink(address: str, ca: str | Path | None) -> dict[str, Any]:
    """What a SuperLink's Control API tells of its nodes and runs, asked as `flwr ls` and `flwr supernode list` ask
    (TLS with the CA certificate `ca`; None: insecure, for a loopback development SuperLink).

    Raises:
        RuntimeError: it did not answer (the message says what Flower's client said).
    """
    from flwr.cli.typing import SuperLinkConnection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListNodesRequest, ListRunsRequest  # pylint: disable=no-name-in-module

    connection = SuperLinkConnection(
        name="fedbayes-status",
        address=address,
        root_certificates=None if ca is None else str(Path(ca).resolve()),
        insecure=ca is None,
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "Using SuperLink: ..." line
            client = init_http_client_from_connection(connection)
        try:
            nodes = list(client.ListNodes(ListNodesRequest()).nodes_info)
            runs = [run_from_proto(run) for run in client.ListRuns(ListRunsRequest()).run_dict.values()]
        finally:
            client.close()
    except Exception as error:  # noqa: BLE001 - Flower's client errors (HTTP, TLS, click) as one line
        secure = "with TLS (--ca)" if ca is not None else "insecurely (a TLS SuperLink needs --ca)"
        raise RuntimeError(
            f"the SuperLink's Control API at {address}, asked {secure}, did not answer: {' '.join(str(error).split())}"
        ) from None
    return {
        "superlink": address,
        "nodes": [
            {"node_id": node.node_id, "status": node.status, "last_activated_at": node.last_activated_at}
            for node in sorted(nodes, key=lambda node: node.node_id)
        ],
        "runs": [run_json(run) for run in sorted(runs, key=lambda run: run.pending_at)],
    }


def run_json(run: Any) -> dict[str, Any]:
    """A Flower run (flwr.common.typing.Run) as `fedbayes status --superlink` shows it."""
    status = run.status
    config = dict(run.override_config)
    return {
        "run_id": run.run_id,
        "status": f"{status.status}:{status.sub_status}" if status.sub_status else status.status,
        "details": status.details,
        "federation": config.get("federation"),
        "strategy": config.get("strategy"),
        "num_server_rounds": config.get("num-server-rounds"),
        "running_at": run.running_at,
        "finished_at": run.finished_at,
    }


def superlink_text(report: Mapping[str, Any]) -> str:
    nodes, runs = report["nodes"], report["runs"]
    online = sum(node["status"] == "online" for node in nodes)
    lines = [f"SuperLink {report['superlink']}: {len(nodes)} nodes ({online} online), {len(runs)} runs"]
    if nodes:
        node_rows = [(str(node["node_id"]), node["status"], node["last_activated_at"] or "-") for node in nodes]
        lines.append(aligned([("node", "status", "last activated"), *node_rows]))
    if runs:
        run_rows = [
            (
                str(run["run_id"]),
                run["status"] + (f" ({run['details']})" if run["details"] else ""),
                str(run["federation"] or "-"),
                str(run["strategy"] or "-"),
                str(run["num_server_rounds"] or "-"),
                run["running_at"] or "-",
            )
            for run in runs
        ]
        lines.append(aligned([("run", "status", "federation", "strategy", "rounds", "running since"), *run_rows]))
    return "\n".join(lines)


# ---- fedbayes clients --------------------------------------------------------------------------------------------
def clients_report(files: RunFiles, registry: Path | None = None) -> dict[str, Any]:
    """Everything `fedbayes clients RUN` says, as its --json prints it. `registry`: the client registry file (the
    run config's `client-registry` where not given)."""
    from fedbayes.server.identity import read_registry
    from fedbayes.tasks.config import ConfigError

    shot = snapshot(files)
    view = read_checkpoint(files)
    configured = files.run_config.get("client-registry") or ""
    registry_path = registry or (Path(configured) if configured else None)
    registered: dict[str, int] = {}
    if registry_path is not None:
        configured_max = files.run_config.get("max-clients")
        max_clients = configured_max if type(configured_max) is int else run_config_default("max-clients")
        try:
            registered = read_registry(str(registry_path), max_clients)
        except ConfigError as error:
            raise InspectError(str(error)) from None
    tallies = client_tallies(shot.rows)
    bound = view.bound if view else {}
    accepted = view.accepted_rounds if view else {}
    contributed = view.contributed if view else {}
    revoked = set(view.revoked if view else [])
    until = view.quarantined_until if view else {}
    claimed_nodes = {tally.node: client for client, tally in tallies.items() if tally.node is not None}
    client_of_node = {**claimed_nodes, **{node: client for client, node in {**registered, **bound}.items()}}
    ids = sorted(
        {*registered, *bound, *accepted, *contributed, *revoked}
        | {client for client in tallies if not client.startswith("node ") and client != "round"}
    )
    clients = []
    for client in ids:
        claimed = tallies[client].node if client in tallies else None
        node = bound.get(client, registered.get(client, claimed))
        clients.append(
            {
                "client": client,
                "node": node,
                "bound": client in bound,
                "registered_node": registered.get(client),
                "last_seen_round": tallies[client].last_round if client in tallies else None,
                "last_accepted_round": accepted.get(client),
                "rounds_accepted": sum(last - first + 1 for first, last in contributed.get(client, [])),
                "accepted_rounds": contributed.get(client, []),
                "quarantined_until": until.get(node) if node is not None else None,
                "forgotten": client in revoked,
            }
        )
    records = view.records if view else []
    return {
        "run": files.name,
        "federation": files.federation,
        "checkpoint": checkpoint_json(view),
        "registry": None if registry_path is None else {"path": str(registry_path), "entries": registered},
        "clients": clients,
        "quarantined_nodes": [
            {"node": node, "client": client_of_node.get(node), "until_round": last}
            for node, last in sorted(until.items())
        ],
        "forgotten": [record_json(record) for record in records if record.get("event") == "forgotten"],
        "readmitted": [record_json(record) for record in records if record.get("event") == "readmitted"],
    }


def run_config_default(name: str) -> Any:
    """A core run-config key's declared default (tasks/config.py RunSettings)."""
    return next(key.default for key in keys_of(RunSettings) if key.name == name)


def record_json(record: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("client", "round", "request", "asked_by", "decided_at", "refine_through_round")
    return {key: record.get(key) for key in keys}


def clients_text(report: Mapping[str, Any]) -> str:
    checkpoint = report["checkpoint"]
    lines = [
        f"run {report['run']}: federation {report['federation']}; "
        + (f"as of the checkpoint of round {checkpoint['round']}" if checkpoint else "no checkpoint yet")
    ]
    registry = report["registry"]
    lines.append(
        f"client registry: {registry['path']} ({len(registry['entries'])} ids)"
        if registry
        else "client registry: none (ids are bound to the first node that presents them)"
    )
    if report["clients"]:
        header = ("client", "node", "last seen", "last accepted", "rounds accepted", "quarantined until", "forgotten")
        rows = [
            (
                client["client"],
                node_text(client),
                str(client["last_seen_round"] or "-"),
                str(client["last_accepted_round"] or "-"),
                f"{client['rounds_accepted']} ({rounds_text(expand(client['accepted_rounds'])) or '-'})",
                str(client["quarantined_until"] or "-"),
                "yes" if client["forgotten"] else "no",
            )
            for client in report["clients"]
        ]
        lines.append(aligned([header, *rows]))
    else:
        lines.append("no client has taken part yet")
    unknown = [entry for entry in report["quarantined_nodes"] if entry["client"] is None]
    lines += [
        f"quarantined: node {entry['node']} (no client id) until round {entry['until_round']}" for entry in unknown
    ]
    for record in report["forgotten"]:
        refine = (
            f", refinement through round {record['refine_through_round']}" if record["refine_through_round"] else ""
        )
        lines.append(
            f"forgotten: {record['client']} after round {record['round']} (request {record['request']}, "
            f"asked by {record['asked_by']}{refine})"
        )
    lines += [
        f"readmitted: {record['client']} after round {record['round']} (request {record['request']})"
        for record in report["readmitted"]
    ]
    return "\n".join(lines)


def node_text(client: Mapping[str, Any]) -> str:
    """Its node; one it is not bound to is the node its refused replies came from, marked so."""
    if client["node"] is None:
        return "-"
    return str(client["node"]) if client["bound"] or client["registered_node"] else f"{client['node']} (unbound)"


def expand(spans: Sequence[Sequence[int]]) -> list[int]:
    return [server_round for first, last in spans for server_round in range(first, last + 1)]


# ---- the commands ------------------------------------------------------------------------------------------------
def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "directory",
        nargs="?",
        type=Path,
        default=RUNS_DIRECTORY,
        metavar="DIR",
        help=f"where the workdirs are (default: {RUNS_DIRECTORY}/, where `fedbayes local` makes them), or one workdir",
    )
    _add_json(parser)
    parser.set_defaults(handler=list_runs)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", nargs="?", type=Path, metavar="RUN", help=_RUN_HELP)
    parser.add_argument("--federation", help="the federation's name, when RUN is a server state directory")
    parser.add_argument(
        "--superlink",
        metavar="ADDR",
        help="instead of RUN: ask this SuperLink's Control API (host:port) for its nodes and runs",
    )
    parser.add_argument("--ca", type=Path, help="with --superlink: the federation's CA certificate (TLS)")
    _add_json(parser)
    parser.set_defaults(handler=show_status)


def add_clients_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", type=Path, metavar="RUN", help=_RUN_HELP)
    parser.add_argument("--federation", help="the federation's name, when RUN is a server state directory")
    parser.add_argument(
        "--registry", type=Path, metavar="FILE", help="the client registry (default: the run config's client-registry)"
    )
    _add_json(parser)
    parser.set_defaults(handler=show_clients)


_RUN_HELP = "a `fedbayes local` workdir, or a server state directory with --federation"


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON, for programs")


def list_runs(args: argparse.Namespace) -> int:
    summaries = [run_summary(workdir) for workdir in find_runs(args.directory)]
    for run in summaries:
        if "error" in run:
            print(f"fedbayes: error: {run['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(summaries, indent=2))
    else:
        print(runs_table(summaries) if summaries else f"no `fedbayes local` workdirs in {args.directory}")
    return 1 if any("error" in run for run in summaries) else 0


def show_status(args: argparse.Namespace) -> int:
    if (args.run is None) == (args.superlink is None):
        raise ValueError("name a RUN, or a SuperLink with --superlink ADDR (one of the two)")
    if args.superlink is not None:
        if args.federation:
            raise ValueError("--federation names a federation of RUN's state directory, not a SuperLink's")
        report = ask_superlink(args.superlink, args.ca)
        print(json.dumps(report, indent=2) if args.json else superlink_text(report))
        return 0
    if args.ca is not None:
        raise ValueError("--ca goes with --superlink")
    report = status_report(locate(args.run, args.federation))
    print(json.dumps(report, indent=2) if args.json else status_text(report))
    return 0


def show_clients(args: argparse.Namespace) -> int:
    report = clients_report(locate(args.run, args.federation), args.registry)
    print(json.dumps(report, indent=2) if args.json else clients_text(report))
    return 0
