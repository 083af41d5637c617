"""`fedbayes run ARGS...`: Flower's `flwr run ARGS... --stream`, made to fail loudly and to leave nothing behind.

`flwr run --stream` exits 0 whatever became of the run: a ServerApp that raised, a resume its checkpoint refused, a
ServerApp killed (Flower marks that run failed once its heartbeat lapses) all look like success. This command hands
its arguments to `flwr run` unchanged (adding --stream), echoes the streamed log (without colour codes where its
output is no terminal; without the ServerApp's event lines, which it reads: tasks/events.py), then asks the
SuperLink for the run's final status. A stream that ends while the run still goes (Flower's CLI exits 0 when the
SuperLink fails a look at the run's state mid-stream, as its SQLite database locked under load made it) is followed
again with `flwr log RUN_ID --stream`, the lines already shown skipped, up to `REATTACH_LIMIT` times. Anything but
finished:completed exits 1, the reason on the last line: `fedbayes run failed: <reason>` (the reason of the
ServerApp's own `run_ended` event where it sent one, tasks/events.py). It asks in its own process, through Flower's
Control API client (`run_status_here`), which it imports while the run's rounds go: a `flwr ls` process cost about
1.5 CPU-s of imports at the end of every run.

A simulation connection (address ":local:") makes `flwr` start a SuperLink of its own on two fixed
ports and leave it running, shared by every user of the machine. Each `fedbayes run` gives that
SuperLink two free ports instead (unless FLWR_LOCAL_SUPERLINK_HTTP_API_PORT / FLWR_LOCAL_CONTROL_API_PORT
are set), gives it time to start on a busy machine (deploy/patient_flwr.py) and, once the run is over,
stops every process its `flwr run` caused to start (the SuperLink, its executor, the simulation and Ray's
workers) by process id: they inherit a marker in their environment. Nothing it did not start is touched.

`--ray-address ADDRESS` (ours, not `flwr run`'s) runs the simulation's virtual clients on a Ray cluster started
beforehand with `ray start`: Flower 1.39's federation config has no key for Ray's address, and its Ray backend calls
`ray.init()` without one, which then reads RAY_ADDRESS. The address is checked first: one that cannot be reached fails
the command at once, where Ray would retry for a minute and no local Ray is started in its place.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fedbayes.deploy.processes import free_ports, process_env, stop_processes_with_env
from fedbayes.deploy.progress import Progress, RoundEvents
from fedbayes.flowerseam.control import STATUS_CLIENT_MODULES
from fedbayes.tasks.events import FAILED, RUN_ENDED, RUN_STARTED, MalformedEvent, event_of_log_line
from fedbayes.tasks.runlog import RUN_FAILED

MARKER_VARIABLE = "FEDBAYES_SUBMISSION"
LOCAL_SUPERLINK_PORTS = ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")  # Flower 1.39's names
# Ray's driver warns on every start that a future Ray will stop hiding GPUs from actors that asked for none;
# we rely on neither behaviour.
RAY_FUTURE_WARNING = "ignore::FutureWarning:ray._private.worker"
STOP_TIMEOUT = 30.0
PATIENT_FLWR = [
    sys.executable,
    "-m",
    "fedbayes.deploy.patient_flwr",
]  # `flwr`, waiting longer for its simulation SuperLink
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_LOG_STARTS = "Starting logstream for run_id"  # Flower's CLI, before the run's log, in `flwr run` and `flwr log`
RAY_ADDRESS_OPTION = "--ray-address"
RAY_CLIENT_PORT = 10001  # Ray's default port for a `ray://HOST` address without one
RAY_PROBE_TIMEOUT = 10.0  # seconds to wait for the Ray cluster's port to accept a connection
REATTACH_LIMIT = 10  # times the log is followed again before the run is given up on
REATTACH_PAUSE = 1.0  # seconds before following it again
_RUN_ID = re.compile(r'Successfully started run (\d+)|"run-id": "(\d+)"')  # default and --format json output


@dataclass(frozen=True)
class RunStatus:
    """A run's status as its SuperLink reports it (`status[:sub_status]`), and its details."""

    status: str  # pending | starting | running | finished:completed | finished:failed | finished:stopped
    details: str

    @property
    def finished(self) -> bool:
        """Whether the run has ended, however it ended."""
        return self.status.startswith("finished")


@dataclass(frozen=True)
class Streamed:
    """What a stream of a run showed: `flwr`'s exit code, the run id it printed (None: none), the reason of the
    ServerApp's failed `run_ended` event, and how many lines of the run's log were read."""

    returncode: int
    run_id: int | None
    failure: str | None  # the reason of the ServerApp's failed `run_ended` event, if it sent one
    log_lines: int = 0  # lines of the run's log read, event lines too (those after Flower's `Starting logstream` line)


def main(argv: Sequence[str]) -> int:
    """`fedbayes run ARGS`: submit with `flwr run ARGS --stream`, echo the stream, and check the run's outcome.

    Args:
        argv: the arguments after `fedbayes run` (`--ray-address` is ours; the rest goes to `flwr run`).

    Returns:
        0 once the run finished:completed; 1 otherwise (or an unreachable Ray cluster), the reason on stderr's last
        line; 130 after Ctrl-C; with -h/--help, `flwr run --help`'s exit code.

    Raises:
        ValueError: `--ray-address` without its address.
        SystemExit: the arguments are not `flwr run`'s (argparse's usage error).
    """
    if {"-h", "--help"} & set(argv):
        print(
            "usage: fedbayes run [--ray-address HOST:PORT] ARGS: `flwr run ARGS --stream` that exits 1, with the "
            "reason on its last line, unless the run completed; and stops the simulation SuperLink it started. "
            "--ray-address: run the simulation's virtual clients on that Ray cluster (ray start --head's address, "
            "ray://HOST[:PORT] or auto), which must be reachable. `flwr run`'s ARGS:\n",
            flush=True,
        )
        return subprocess.call([*PATIENT_FLWR, "run", "--help"], env=process_env(flwr_home=None))
    resume_command = ["fedbayes", "run", *argv]
    ray_address, argv = split_ray_address(argv)
    if ray_address is not None and (unreachable := ray_cluster_problem(ray_address)):
        print(f"{RUN_FAILED}{unreachable}", file=sys.stderr, flush=True)
        return 1
    connection = flwr_run_arguments(argv).superlink
    command = [*PATIENT_FLWR, "run", *argv, *([] if "--stream" in argv else ["--stream"])]
    marker = uuid.uuid4().hex
    env = submission_env(marker)
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    os.environ.update({variable: env[variable] for variable in LOCAL_SUPERLINK_PORTS})  # for run_status_here
    try:
        streamed = stream(command, env, resume_command=resume_command, after_first_round=import_status_client)
        reason = failure(
            streamed,
            lambda run_id: run_status_here(connection, run_id),
            lambda shown: stream(
                [*PATIENT_FLWR, "log", str(shown.run_id), *([connection] if connection else []), "--stream"],
                env,
                resume_command=resume_command,
                shown=shown,
            ),
        )
    except KeyboardInterrupt:
        print(
            "fedbayes run: interrupted; stopping what it started (a run on a remote SuperLink goes on: "
            "`flwr stop <run-id>` ends it)",
            file=sys.stderr,
        )
        return 130
    finally:
        stop_processes_with_env(MARKER_VARIABLE, marker, STOP_TIMEOUT)
    if reason is not None:
        print(f"{RUN_FAILED}{reason}", file=sys.stderr, flush=True)
        return 1
    return 0


def split_ray_address(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take `--ray-address ADDRESS` (or `--ray-address=ADDRESS`) out of `fedbayes run`'s arguments.

    Args:
        argv: `fedbayes run`'s arguments.

    Returns:
        The address (None without the option, the last one if given twice) and the arguments for `flwr run`.

    Raises:
        ValueError: the option came last, without its address.
    """
    address, rest = None, []
    arguments = iter(argv)
    for argument in arguments:
        if argument == RAY_ADDRESS_OPTION:
            address = next(arguments, None)
            if address is None:
                raise ValueError(f"{RAY_ADDRESS_OPTION} needs an address: HOST:PORT, ray://HOST[:PORT] or auto")
        elif argument.startswith(f"{RAY_ADDRESS_OPTION}="):
            address = argument.partition("=")[2]
        else:
            rest.append(argument)
    return address, rest


def ray_cluster_problem(address: str, timeout: float = RAY_PROBE_TIMEOUT) -> str | None:
    """Why the Ray cluster at `address` cannot be used, or None when its port accepts a connection.

    Args:
        address: the head's GCS address `HOST:PORT`, a Ray client address `ray://HOST[:PORT]`, or `auto` (a cluster
            that `ray start` started on this machine; Ray itself fails clearly when there is none).
        timeout: seconds to wait for the connection.

    Returns:
        A one-line reason, or None.
    """
    if address == "auto":
        return None
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.partition(":")
    default_port = RAY_CLIENT_PORT if scheme == "ray" else None
    if not host or not (port.isdigit() or (not port and default_port)):
        return f"{RAY_ADDRESS_OPTION} {address!r}: expected HOST:PORT, ray://HOST[:PORT] or auto"
    try:
        socket.create_connection((host, int(port) if port else default_port), timeout=timeout).close()
    except OSError as error:
        return f"cannot reach the Ray cluster at {address} ({error}); is `ray start --head` running there?"
    return None


def flwr_run_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """`flwr run`'s arguments as Flower 1.39 defines them; we need only the connection's name.

    Args:
        argv: `flwr run`'s arguments.

    Returns:
        The parsed arguments: app, superlink (the connection; None: the default one), and the options.

    Raises:
        SystemExit: they do not parse (argparse's usage error).
    """
    parser = argparse.ArgumentParser(prog="fedbayes run", add_help=False)
    parser.add_argument("app", nargs="?", default=".")
    parser.add_argument("superlink", nargs="?")
    parser.add_argument("--federation")
    parser.add_argument("-c", "--run-config", action="append")
    parser.add_argument("--federation-config", action="append")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--format", choices=("default", "json"))
    return parser.parse_args(list(argv))


def submission_env(marker: str) -> dict[str, str]:
    """The environment of the `flwr` processes of one submission.

    Args:
        marker: this submission's marker, which every process it causes to start inherits.

    Returns:
        process_env's environment with MARKER_VARIABLE, free ports for the simulation SuperLink where
        LOCAL_SUPERLINK_PORTS are not set, and Ray's future warning ignored.
    """
    env = process_env(flwr_home=None)
    env[MARKER_VARIABLE] = marker
    unset = [variable for variable in LOCAL_SUPERLINK_PORTS if variable not in env]
    env.update(zip(unset, map(str, free_ports(len(unset)))))
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), RAY_FUTURE_WARNING]))
    return env


def stream(
    command: Sequence[str],
    env: Mapping[str, str],
    resume_command: Sequence[str],
    after_first_round: Callable[[], object] = lambda: None,
    shown: Streamed | None = None,
) -> Streamed:
    """Run `flwr run ... --stream`, echoing its output but for the ServerApp's event lines, and note what those
    events say about the run (tasks/events.py); call `after_first_round` once they report the first round done.

    Args:
        command: the `flwr run` (or, following again, `flwr log`) command line.
        env: its environment (`submission_env`).
        resume_command: the `fedbayes run` command, for the resume hint of a federation the server named.
        after_first_round: called once, when the first round is reported done (not when following again).
        shown: what an earlier stream of the same run showed; `command` then follows its log again from the start,
            and its first `shown.log_lines` lines are skipped. None: a first stream.

    Returns:
        What it showed (the run id and failure reason carried over from `shown`).
    """
    process = subprocess.Popen(
        list(command),
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )  # Ctrl-C reaches us; we stop it
    keep_colour = sys.stdout.isatty()
    run_id, reported = (shown.run_id, shown.failure) if shown else (None, None)
    to_skip = shown.log_lines if shown else 0
    log_lines: int | None = None  # counted from Flower's `Starting logstream` line on
    rounds_seen = shown is not None
    rounds = RoundEvents()
    assert process.stdout is not None  # stdout=PIPE
    with Progress() as progress:  # a live line on a terminal, fed by the ServerApp's round events (deploy/progress.py)
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            plain = _ANSI_ESCAPE.sub("", line)
            if log_lines is not None:
                log_lines += 1
            elif _LOG_STARTS in plain:
                log_lines = 0
            if shown and (log_lines is None or log_lines <= to_skip):  # `flwr log`'s preamble, or shown already
                continue
            try:
                event = event_of_log_line(plain)
            except MalformedEvent as error:
                progress.print(f"fedbayes run: warning: a ServerApp event line left out: {error}")
                continue
            if event is None:
                progress.print(line if keep_colour else plain)
                run_id = run_id or _run_id(plain)
                continue
            if done := rounds.feed(event):
                progress.round_done(done)
                if not rounds_seen:
                    rounds_seen = True
                    after_first_round()
            if event.type == RUN_ENDED and event.fields["outcome"] == FAILED:
                reported = event.fields["reason"] or reported
            if event.type == RUN_STARTED and event.fields["named_by_server"]:
                name = event.fields["federation"]
                resume = shlex.join([*resume_command, "-c", f'federation="{name}"'])
                progress.print(f"fedbayes: federation {name}; to resume it after an interruption: {resume}")
    returncode = process.wait()
    return Streamed(returncode, run_id, reported, max(log_lines or 0, to_skip))


def failure(
    streamed: Streamed,
    status_of: Callable[[int], RunStatus],
    follow_again: Callable[[Streamed], Streamed],
) -> str | None:
    """Why the run did not complete, or None if it did.

    Args:
        streamed: what the first stream showed.
        status_of: `status_of(run_id)`: the run's status at its SuperLink.
        follow_again: `follow_again(shown)`: the run's log streamed again, past what `shown` showed, while the run is
            unfinished (at most REATTACH_LIMIT times).

    Returns:
        A one-line reason, or None when the run is finished:completed.

    Raises:
        RuntimeError: `status_of` found no status.
    """
    for attempt in range(REATTACH_LIMIT + 1):
        if streamed.returncode != 0:
            return streamed.failure or f"flwr run exited with code {streamed.returncode} (its message is above)"
        if streamed.run_id is None:
            return "flwr run printed no run id"
        status = status_of(streamed.run_id)
        if status.finished or attempt == REATTACH_LIMIT:
            break
        print(
            f"fedbayes run: the SuperLink's log stream ended while run {streamed.run_id} is {status.status}; "
            "following it again",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(REATTACH_PAUSE)
        streamed = follow_again(streamed)
    if status.status == "finished:completed":
        return None
    return streamed.failure or f"run {streamed.run_id} is {status.status} ({status.details})"


def import_status_client() -> None:
    """Import what run_status_here needs in a thread of its own, while the run goes on (about 1.5 CPU-s, which would
    otherwise come at the run's end). An import that fails here fails again, with its message, in run_status_here."""

    def quietly() -> None:
        try:
            for module in STATUS_CLIENT_MODULES:
                importlib.import_module(module)
        except Exception:  # noqa: BLE001, S110 - raised again where the status is asked
            pass

    threading.Thread(target=quietly, name="import-status-client", daemon=True).start()


def run_status_here(connection: str | None, run_id: int) -> RunStatus:
    """The run's status as its SuperLink reports it, asked from this process the way `flwr ls --run-id N` asks
    (Flower 1.39's Control API client; patient with a simulation SuperLink as deploy/patient_flwr.py is).

    Args:
        connection: the connection's name in FLWR_HOME's config; None: the default one.
        run_id: the run.

    Returns:
        Its status and details.

    Raises:
        RuntimeError: the SuperLink gave no status, or has no such run.
    """
    from fedbayes.deploy.patient_flwr import be_patient  # Flower's CLI reads its ports at import: not before main's
    from fedbayes.flowerseam import control

    be_patient()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "Using SuperLink: ..." line: the run's output is over
            client = control.connect(connection)
        try:
            runs = control.list_runs(client, run_id)
        finally:
            client.close()
    except Exception as error:  # noqa: BLE001 - Flower's CLI errors (click, HTTP) as one line
        raise RuntimeError(f"the SuperLink gave no status for run {run_id}: {_one_line(str(error))}") from error
    if run_id not in runs:
        raise RuntimeError(f"the SuperLink has no run {run_id}")
    status = runs[run_id].status
    return RunStatus(f"{status.status}:{status.sub_status}" if status.sub_status else status.status, status.details)


def run_status(flwr: Sequence[str], connection: str | None, run_id: int, env: Mapping[str, str]) -> RunStatus:
    """The run's status as its SuperLink reports it (`flwr ls --run-id N --format json`).

    Args:
        flwr: the command that runs Flower's CLI (with a prefix such as `ip netns exec NS` where needed).
        connection: the connection's name; None: the default one.
        run_id: the run.
        env: the environment `flwr` runs in (its FLWR_HOME).

    Returns:
        Its status and details.

    Raises:
        RuntimeError: `flwr ls` printed no JSON or reported no success.
        subprocess.TimeoutExpired: it took longer than 120 s.
    """
    command = [*flwr, "ls", *([connection] if connection else []), "--run-id", str(run_id), "--format", "json"]
    result = subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=120)
    try:
        answer = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(
            f"`flwr ls` gave no status for run {run_id} (exit code {result.returncode}): "
            f"{_one_line(result.stdout + result.stderr)}"
        ) from None
    if not answer.get("success"):
        raise RuntimeError(f"`flwr ls` has no status for run {run_id}: {_one_line(answer.get('error-message', ''))}")
    run = answer["runs"][0]
    return RunStatus(run["status"], run["status-details"])


def _run_id(line: str) -> int | None:
    match = _RUN_ID.search(line)
    return int(match.group(1) or match.group(2)) if match else None


def _one_line(text: str) -> str:
    return " ".join(text.split())
