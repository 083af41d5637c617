"""`fedbayes runs`, `fedbayes status` and `fedbayes clients`: what a federation's own files say about it
(tasks/runfiles.py reads them and decides its status), its newest checkpoint, and what a running SuperLink says about
its nodes and runs; as text, or as JSON for programs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbayes.tasks.config import RUN_CONFIG_FILE, RunSettings, keys_of
from fedbayes.tasks.runfiles import (
    FLWR_HOME,
    METRICS,
    InspectError,
    RunFiles,
    client_tallies,
    locate,
    metrics_of,
    read_toml,
    snapshot,
)

RUNS_DIRECTORY = Path("runs")  # where `fedbayes local` makes its workdirs (deploy/launcher.py default_workdir)
REASONS_SHOWN = 3  # distinct refusal reasons the text shows per client (--json has them all)
REASON_WIDTH = 160  # characters of a reason the text shows


# ---- fedbayes runs ---------------------------------------------------------------------------------------------
def find_runs(directory: Path) -> list[Path]:
    """The `fedbayes local` workdirs in `directory` (or `directory` itself, if it is one), by name.

    Args:
        directory: a folder of workdirs, or one workdir (a folder holding the run config file).

    Returns:
        The workdirs, sorted by path.

    Raises:
        InspectError: `directory` is no directory.
    """
    if not directory.is_dir():
        raise InspectError(f"{directory} is no directory (`fedbayes local` makes its workdirs in {RUNS_DIRECTORY}/)")
    if (directory / RUN_CONFIG_FILE).is_file():
        return [directory]
    return sorted(path for path in directory.iterdir() if (path / RUN_CONFIG_FILE).is_file())


def run_summary(workdir: Path) -> dict[str, Any]:
    """One line of `fedbayes runs`: its error (naming the file) where its files cannot be read.

    Args:
        workdir: a `fedbayes local` workdir.

    Returns:
        Its name and path, and either "error" or its federation, strategy, rounds done and planned (None: not
        known), status with why, and the metrics of its last evaluated round (None: none yet).
    """
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
    """`fedbayes runs`' table of `run_summary`s: one line each, `unreadable` for one whose files cannot be read.

    Args:
        summaries: the `run_summary`s, in the order to list them.

    Returns:
        The header and a line per run, aligned; no trailing newline.
    """
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
    """Columns padded to their widest cell, two spaces apart.

    Args:
        lines: rows of cells, all as long as the first.

    Returns:
        The rows, newline-separated, each without trailing spaces.
    """
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

    Args:
        files: the federation's files (`locate`): its state directory and name.

    Returns:
        The checkpoint's view, or None.

    Raises:
        CheckpointError: it is damaged (named, with the field).
        InspectError: its round core state is not what this version writes.
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
    """The checkpoint as the reports give it: its round, file and the rounds kept (None: none yet).

    Args:
        view: the checkpoint (`read_checkpoint`), or None.

    Returns:
        {"round", "path", "kept_rounds"}, or None.
    """
    if view is None:
        return None
    return {"round": view.server_round, "path": str(view.path), "kept_rounds": view.kept_rounds}


# ---- fedbayes status ---------------------------------------------------------------------------------------------
def status_report(files: RunFiles) -> dict[str, Any]:
    """Everything `fedbayes status RUN` says, as its --json prints it.

    Args:
        files: the federation's files (`locate`).

    Returns:
        Its run, federation, strategy, status and why, rounds done and planned, results file, last round, metrics,
        the nodes connected now (running runs only, else None), per-client tallies, checkpoint and tracking.

    Raises:
        InspectError: a file of the run is damaged (named, with why).
        CheckpointError: its newest checkpoint is.
    """
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
            "messages": list(shot.events.tracking),
            "events": str(shot.events.path),
        },
    }
    return report


def connected_nodes(files: RunFiles) -> dict[str, Any]:
    """The nodes a running workdir's SuperLink holds online, asked through its Flower connection; why not, where it
    cannot be asked (a bare state directory's SuperLink: `--superlink`).

    Args:
        files: the federation's files (`locate`).

    Returns:
        {"online": count of online nodes, or None where not known, "note": of how many nodes, or why not known}.
    """
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
    """`fedbayes status RUN` as text, from `status_report`.

    Args:
        report: what `status_report` returned.

    Returns:
        The lines, newline-separated; no trailing newline.
    """
    planned = "?" if report["rounds_planned"] is None else report["rounds_planned"]
    lines = [
        f"run {report['run']}: federation {report['federation']}, strategy {report['strategy']}",
        f"status: {report['status']} ({report['why']})",
        f"round: {report['rounds_done']}/{planned} done; results {report['results'] or 'unknown'}",
    ]
    metrics = report["metrics"]
    if metrics:
        for kind, suffix in (("metrics", ""), ("ensemble", "_ensemble")):
            shown = " | ".join(f"{name} {metrics[name + suffix]:.4f}" for name in METRICS if name + suffix in metrics)
            lines += [f"{kind} (round {metrics['round']}): {shown}"] * bool(shown)
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
    """ "; connected now: N (of M nodes it knows)", or nothing for a run that is not running.

    Args:
        connected: what `connected_nodes` returned, or None.

    Returns:
        The text to end the last round's line with.
    """
    if connected is None:
        return ""
    online = "?" if connected["online"] is None else connected["online"]
    return f"; connected now: {online} ({connected['note']})"


def rounds_text(rounds: Sequence[int]) -> str:
    """Rounds as spans: [1, 2, 3, 5, 7, 8] -> "1-3, 5, 7-8".

    Args:
        rounds: round numbers, in any order, without repeats.

    Returns:
        The spans, ascending; empty for no rounds.
    """
    spans: list[list[int]] = []
    for server_round in sorted(rounds):
        if spans and server_round == spans[-1][1] + 1:
            spans[-1][1] = server_round
        else:
            spans.append([server_round, server_round])
    return ", ".join(f"{first}-{last}" if last > first else str(first) for first, last in spans)


# ---- fedbayes status --superlink -----------------------------------------------------------------------------
def ask_superlink(address: str, ca: str | Path | None) -> dict[str, Any]:
    """What a SuperLink's Control API tells of its nodes and runs, asked as `flwr ls` and `flwr supernode list` ask.

    Args:
        address: the Control API's host:port.
        ca: the federation's CA certificate, for TLS; None: insecure, for a loopback development SuperLink.

    Returns:
        {"superlink": address, "nodes": by node id, each its node_id, status and last_activated_at, "runs": by when
        they were submitted, each `run_json`}.

    Raises:
        RuntimeError: it did not answer (the message says what Flower's client said).
    """
    from fedbayes.flowerseam import control

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "Using SuperLink: ..." line
            client = control.connect_to("fedbayes-status", address, None if ca is None else str(Path(ca).resolve()))
        try:
            nodes = control.list_nodes(client)
            runs = list(control.list_runs(client).values())
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
    """A Flower run (flwr.common.typing.Run) as `fedbayes status --superlink` shows it.

    Args:
        run: the run, as the Control API lists it.

    Returns:
        Its id, status (status:sub_status), details, federation, strategy and rounds (from its run config; None where
        it has none), and when it started running and finished.
    """
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
    """`fedbayes status --superlink` as text, from `ask_superlink`: a table of its nodes and one of its runs.

    Args:
        report: what `ask_superlink` returned.

    Returns:
        A line of counts, then the tables where there are nodes or runs; no trailing newline.
    """
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
    """Everything `fedbayes clients RUN` says, as its --json prints it.

    Args:
        files: the federation's files (`locate`).
        registry: the client registry file; None: the run config's `client-registry`, if any.

    Returns:
        Its run, federation, checkpoint and registry (None: none), per client id (sorted) its node, binding,
        registered node, last seen and accepted rounds, rounds accepted, quarantine and whether it was forgotten;
        the quarantined nodes, and the forget and readmission records (`record_json`).

    Raises:
        InspectError: a file of the run, or the registry, is damaged (named, with why).
        CheckpointError: its newest checkpoint is.
    """
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
    """A core run-config key's declared default (tasks/config.py RunSettings).

    Args:
        name: the key's name; it must be a core key.

    Returns:
        Its default.

    Raises:
        StopIteration: `name` is no core key.
    """
    return next(key.default for key in keys_of(RunSettings) if key.name == name)


def record_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """What `fedbayes clients` tells of a forget's or readmission's record (server/forget/).

    Args:
        record: a forget ledger's record.

    Returns:
        Its client, round, request, asked_by, decided_at, refine_rounds and refine_through_round (None where absent).
    """
    keys = ("client", "round", "request", "asked_by", "decided_at", "refine_rounds", "refine_through_round")
    return {key: record.get(key) for key in keys}


def clients_text(report: Mapping[str, Any]) -> str:
    """`fedbayes clients RUN` as text, from `clients_report`: a table of the clients, then quarantined nodes
    without a client id, forgotten and readmitted ids.

    Args:
        report: what `clients_report` returned.

    Returns:
        The lines, newline-separated; no trailing newline.
    """
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
        through = record["refine_through_round"]
        refine = f", refinement rounds through round {through}" if record["refine_rounds"] else ""
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
    """Its node; one it is not bound to is the node its refused replies came from, marked so.

    Args:
        client: one client of `clients_report`.

    Returns:
        The node id, `<node> (unbound)`, or `-` without one.
    """
    if client["node"] is None:
        return "-"
    return str(client["node"]) if client["bound"] or client["registered_node"] else f"{client['node']} (unbound)"


def expand(spans: Sequence[Sequence[int]]) -> list[int]:
    """[[1, 3], [5, 5]] -> [1, 2, 3, 5].

    Args:
        spans: [first, last] round spans, both ends included.

    Returns:
        Every round of the spans, in their order.
    """
    return [server_round for first, last in spans for server_round in range(first, last + 1)]


# ---- the commands ------------------------------------------------------------------------------------------------
def add_runs_arguments(parser: argparse.ArgumentParser) -> None:
    """`fedbayes runs [DIR] [--json]`.

    Args:
        parser: the `runs` parser; it gets `handler` = `list_runs`.
    """
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
    """`fedbayes status RUN [--federation NAME]` or `fedbayes status --superlink ADDR [--ca FILE]`, `--json`.

    Args:
        parser: the `status` parser; it gets `handler` = `show_status`.
    """
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
    """`fedbayes clients RUN [--federation NAME] [--registry FILE] [--json]`.

    Args:
        parser: the `clients` parser; it gets `handler` = `show_clients`.
    """
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
    """`fedbayes runs`: exits 1 when a workdir's files cannot be read (each named on stderr), after listing all.

    Args:
        args: the command line (`add_runs_arguments`): directory, json.

    Returns:
        The exit code: 0, or 1 where some workdir could not be read.

    Raises:
        InspectError: `directory` is no directory.
    """
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
    """`fedbayes status RUN` or `fedbayes status --superlink ADDR`.

    Args:
        args: the command line (`add_status_arguments`): run, federation, superlink, ca, json.

    Returns:
        0; a failure raises.

    Raises:
        ValueError: both or neither of RUN and --superlink, --federation with --superlink, or --ca without it.
        RuntimeError: the SuperLink did not answer.
        InspectError, CheckpointError: RUN's files, or its checkpoint, cannot be read.
    """
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
    """`fedbayes clients RUN`.

    Args:
        args: the command line (`add_clients_arguments`): run, federation, registry, json.

    Returns:
        0; a failure raises.

    Raises:
        InspectError, CheckpointError: RUN's files, the registry, or its checkpoint, cannot be read.
    """
    report = clients_report(locate(args.run, args.federation), args.registry)
    print(json.dumps(report, indent=2) if args.json else clients_text(report))
    return 0
