"""Start long-running child processes and always stop them all, descendants included.

Flower daemons spawn children of their own (SuperExec, one flwr-clientapp per message), some in new
sessions. Every process we start carries a unique marker in its environment, which its descendants
inherit; stopping signals every live process with that marker, and every process in a session one of
them leads (for descendants started with an environment of their own), so nothing outlives the launcher
even when it is interrupted or one of the processes fails.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from fedbayes.deploy.forkserver import ForkedProcess, ForkServer

MARKER_VARIABLE = "FEDBAYES_PROCESS_GROUP"
PROCESS_NAME_LENGTH = 15  # Linux keeps 15 bytes of a process's name (`ps -o comm`, top)


@dataclass
class ManagedProcess:
    """A process a ProcessGroup started or had forked: its name (its log's, <name>.log), the process, its log file, and
    whether the group stopped it on purpose."""

    name: str
    popen: subprocess.Popen | ForkedProcess  # ForkedProcess: forked by a fork server (deploy/forkserver.py)
    log_path: Path | None  # None: its output goes to our own stdout/stderr
    stopped: bool = False  # we signalled it: its end is no failure

    def log_tail(self, lines: int = 20) -> str:
        """The end of its log, for a message that says why it failed.

        Args:
            lines: how many of the last lines.

        Returns:
            Those lines, newline-separated; a note in brackets where it logs to our output or its log is not there.
        """
        if self.log_path is None:
            return "(its output is above)"
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class ProcessGroup:
    """Context manager owning every process it started; exiting stops them (TERM, then KILL). Each
    process logs to <log_dir>/<name>.log, or, without a log_dir, to our own stdout/stderr."""

    def __init__(self, log_dir: Path | None, env: Mapping[str, str], stop_timeout: float = 15.0) -> None:
        """A group with no process yet.

        Args:
            log_dir: where each process's log goes (made if missing); None: our own stdout and stderr.
            env: the environment the processes get, with this group's marker added (after an enclosing group's).
            stop_timeout: seconds `stop_all` waits after TERM before it KILLs, and then for the KILLed to go.
        """
        self.log_dir = log_dir
        self.marker = uuid.uuid4().hex
        # A group started inside another group's process (`fedbayes client` under a test's federation) keeps the
        # outer marker too, so stopping the outer group reaches its processes even if the middle one is killed.
        inherited = env.get(MARKER_VARIABLE)
        self.env = {**env, MARKER_VARIABLE: f"{inherited}:{self.marker}" if inherited else self.marker}
        self.stop_timeout = stop_timeout
        self.processes: list[ManagedProcess] = []
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self,
        name: str,
        command: Sequence[str],
        cwd: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        pipes: bool = False,
        stdin_pipe: bool = False,
    ) -> ManagedProcess:
        """Start `command` in a session of its own, with this group's environment, logging to <log_dir>/<name>.log.

        Args:
            name: the process's name, and its log's.
            command: the program and its arguments.
            cwd: its working directory; None: ours.
            extra_env: variables it gets besides the group's.
            pipes: its stdin and stdout are text pipes to us (a fork server's requests and answers), its stderr goes to
                the log.
            stdin_pipe: its stdin alone is a (binary) pipe (what it is to do next), its output is logged.

        Returns:
            The started process, not waited for.

        Raises:
            OSError: the program cannot be run, or the log cannot be written.
        """
        log_path = None if self.log_dir is None else self.log_dir / f"{name}.log"
        with open(os.devnull, "wb") if log_path is None else log_path.open("wb") as log_file:
            logged = None if log_path is None else log_file
            popen = subprocess.Popen(
                list(command),
                stdout=subprocess.PIPE if pipes else logged,
                stderr=logged if pipes or log_path is None else subprocess.STDOUT,
                stdin=subprocess.PIPE if pipes or stdin_pipe else subprocess.DEVNULL,
                text=pipes,
                env={**self.env, **(extra_env or {})},
                cwd=cwd,
                start_new_session=True,  # Ctrl-C in the terminal reaches only us; we stop the rest
            )
        return self._add(ManagedProcess(name, popen, log_path))

    def fork(self, name: str, server: ForkServer, argv: list[str], cwd: Path) -> ManagedProcess:
        """A SuperNode with `fedbayes supernode`'s arguments `argv`, forked by `server` (started by this group,
        so the fork carries its marker), logging to <log_dir>/<name>.log.

        Args:
            name: the SuperNode's name, and its log's.
            server: the SuperNodes' fork server (`LocalFederation.start_supernode_forkserver`).
            argv: `fedbayes supernode`'s arguments.
            cwd: the fork's working directory.

        Returns:
            The forked process.

        Raises:
            ValueError: the group has no log directory.
        """
        if self.log_dir is None:
            raise ValueError("a forked SuperNode logs into the group's log directory; this group has none")
        log_path = self.log_dir / f"{name}.log"
        return self._add(ManagedProcess(name, server.fork(name, argv, cwd, log_path), log_path))

    def _add(self, process: ManagedProcess) -> ManagedProcess:
        self.processes.append(process)
        return process

    def members(self) -> list[int]:
        """Pids of live (non-zombie) processes carrying this group's marker.

        Returns:
            The pids, descendants in sessions of their own included where they kept the environment.
        """
        return [pid for pid, _ in _live_processes() if _carries(_environ(pid), MARKER_VARIABLE, self.marker)]

    def stop(self, process: ManagedProcess, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal one process we started (e.g. to restart a SuperNode), and mark it stopped on purpose; one that has
        exited is not signalled.

        Args:
            process: one of this group's processes.
            sig: the signal.
        """
        process.stopped = True
        if process.popen.poll() is None:
            process.popen.send_signal(sig)

    def stop_all(self) -> None:
        # Clients first, so the SuperLink sees them leave; then every marked descendant.
        """TERM every process this group started, the last started first, then every live process that carries its
        marker or is in a session one of them leads; KILL what is left after `stop_timeout` seconds, and wait up to 5 s
        for each started process."""
        signalled = [process.popen.pid for process in reversed(self.processes) if process.popen.poll() is None]
        for process in reversed(self.processes):
            self.stop(process)
        stop_processes_with_env(MARKER_VARIABLE, self.marker, self.stop_timeout, already_signalled=signalled)
        for process in self.processes:
            try:
                process.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop_all()


def exit_without_teardown(entry: Callable[[], int | None]) -> NoReturn:
    """Run `entry`, then end the process as Python would (the status it returns or exits with, non-daemon threads
    joined, logging and stdio flushed), but without the interpreter's teardown of every module and object, for
    processes whose work is done by then. After SIGTERM, Flower's SuperNode signs off, stops its servers and raises
    SystemExit quickly; tearing down its ~1,500 modules then takes longer than all of that, on every client's
    way out (docs/results/performance.md has the figures). An exception other than
    SystemExit takes Python's usual path (traceback, exit status 1).

    Args:
        entry: the process's work; what it returns is the exit status (None: 0).
    """
    try:
        returned = entry()
        status = returned if isinstance(returned, int) else 0
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def stop_processes_on_signals() -> None:
    """Make SIGTERM and SIGINT unwind through `with ProcessGroup()` (and `LocalFederation`), which stops every process
    it started. (A background job ignores SIGINT unless told otherwise; SIGTERM would kill us outright.)"""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_processes_with_env(variable: str, value: str, timeout: float, already_signalled: Collection[int] = ()) -> None:
    """TERM every live process whose environment holds variable=value, and every process in a session one
    of them leads, except those `already_signalled` (a second TERM interrupts a process's own shutdown: Flower's
    SuperNode then left its Runtime API server running until the KILL); KILL those left after `timeout` until none
    is left (a dying parent may spawn one more child; on a busy machine a killed process takes a while to go).

    Sessions, because not every descendant keeps the environment it was given: Ray starts its dashboard
    and runtime-env agents without our marker, in the session of the executor that started the simulation.
    Only sessions a marked process leads count, never one it merely belongs to (that may be the user's
    terminal session).

    Args:
        variable: the environment variable (MARKER_VARIABLE).
        value: its value, or one of its ':'-separated markers.
        timeout: seconds to wait after TERM, and then of KILLing.
        already_signalled: pids not to TERM again.
    """
    sessions: set[int] = set()
    for pid in set(_ours(variable, value, sessions)) - set(already_signalled):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _ours(variable, value, sessions) and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + timeout
    while (left := _ours(variable, value, sessions)) and time.monotonic() < deadline:
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)


def _ours(variable: str, value: str, sessions: set[int]) -> list[int]:
    """Live processes marked variable=value or in one of `sessions`, to which it adds the sessions marked
    processes lead (the set outlives its leaders: their sessions' other members keep its id)."""
    live = _live_processes()
    marked = {pid for pid, _ in live if _carries(_environ(pid), variable, value)}
    sessions.update(pid for pid, session in live if pid in marked and session == pid)
    return sorted(marked | {pid for pid, session in live if session in sessions})


def _carries(environ: list[bytes], variable: str, value: str) -> bool:
    """Whether `variable` is `value` in this environment, or a ':'-separated chain of markers holding it."""
    prefix = f"{variable}=".encode()
    return any(entry.startswith(prefix) and value.encode() in entry[len(prefix) :].split(b":") for entry in environ)


def _live_processes() -> list[tuple[int, int]]:
    """(pid, session id) of every process that is not a zombie."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(proc.name))
        if fields and fields[0] != "Z":
            found.append((int(proc.name), int(fields[3])))  # fields after the name: state, ppid, pgrp, session
    return found


def running(pid: int) -> bool:
    """Whether process `pid` exists and is no zombie.

    Args:
        pid: the process id.

    Returns:
        True while it runs (or sleeps); False once it is gone or a zombie.
    """
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the process's name ([] once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def command_line(pid: int) -> list[str]:
    """The arguments process `pid` was started with ([] once it is gone).

    Args:
        pid: the process id.

    Returns:
        Its arguments, decoded (undecodable bytes replaced); [] also where they cannot be read.
    """
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def process_name(pid: int) -> str:
    """Process `pid`'s name as `ps -o comm` shows it: its program's, or what it named itself ("" once it is gone).

    Args:
        pid: the process id.

    Returns:
        At most PROCESS_NAME_LENGTH characters.
    """
    try:
        return Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def is_serverapp(pid: int) -> bool:
    """Whether process `pid` runs a ServerApp: Flower's `flwr-serverapp` script (a script's process is named after
    it) or a warm executor's fork, which names itself so (deploy/warm_executor.py).

    Args:
        pid: the process id.

    Returns:
        False also once it is gone.
    """
    return process_name(pid) == "flwr-serverapp"


def name_this_process(name: str) -> None:
    """Name this process `name` in `ps -o comm` and top (a fork keeps its parent's name otherwise).

    Args:
        name: the new name; only its first PROCESS_NAME_LENGTH characters are kept.
    """
    Path("/proc/self/comm").write_text(name[:PROCESS_NAME_LENGTH])


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


_HANDED_OUT: set[int] = set()  # a port handed out is not handed out again by this process: its server may not be up yet


def free_ports(count: int) -> list[int]:
    """Ports free right now on 127.0.0.1, drawn below the kernel's ephemeral range: between our check and the
    server's bind, the kernel may hand an ephemeral port to any outgoing connection (a hundred SuperNodes dialing
    the SuperLink took a Runtime API port that way), but never one below that range. None is returned twice.

    Args:
        count: how many ports.

    Returns:
        `count` distinct ports, none handed out before by this process.

    Raises:
        RuntimeError: fewer than `count` were free.
    """
    ephemeral_start = _ephemeral_port_start()
    below = range(max(1024, ephemeral_start - 12000), ephemeral_start)
    candidates = random.sample(below, k=len(below))
    sockets: list[socket.socket] = []
    try:
        for port in candidates:
            if len(sockets) == count:
                break
            if port in _HANDED_OUT:
                continue
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sockets.append(sock)
        if len(sockets) < count:
            raise RuntimeError(f"found only {len(sockets)} free ports on 127.0.0.1 below {ephemeral_start}")
        ports = [sock.getsockname()[1] for sock in sockets]
        _HANDED_OUT.update(ports)
        return ports
    finally:
        for sock in sockets:
            sock.close()


def _ephemeral_port_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def console_script(name: str) -> str:
    """A console script (Flower's, ours) from this interpreter's environment.

    Args:
        name: the script's name (fedbayes, flwr, ...).

    Returns:
        Its path: beside this interpreter, else the first on PATH.

    Raises:
        FileNotFoundError: neither has it.
    """
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"'{name}' not found; install the project (make install)")
    return found


def process_env(flwr_home: Path | None) -> dict[str, str]:
    """Our environment for a Flower process: Flower's home (None: the one we have, else Flower's
    default), no telemetry, update checks or runtime installs, one compute thread.

    Args:
        flwr_home: Flower's home for the process; None: FLWR_HOME as we have it, or Flower's default without it.

    Returns:
        A copy of our environment with this interpreter's folder first on PATH, PYTHONPATH's entries made absolute,
        and Flower's and the thread settings set (OMP_NUM_THREADS, FEDBAYES_THREADS and the SuperExec's poll interval
        kept where we have them).
    """
    env = dict(os.environ)
    # Flower daemons start their helpers (flower-superexec, flwr-clientapp) by name from PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Our processes run in their workdir: a relative PYTHONPATH entry (a user's model or strategy module) must
    # mean what it meant where the user typed it.
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(entry).resolve()) for entry in env["PYTHONPATH"].split(os.pathsep) if entry
        )
    if flwr_home is not None:
        env["FLWR_HOME"] = str(flwr_home)
    env.update(
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        # SuperExec asks its SuperNode for a new task every 1 s by default: up to 1 s lost per round.
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL=env.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        FEDBAYES_THREADS=env.get("FEDBAYES_THREADS", "1"),
        PYTHONUNBUFFERED="1",
    )
    return env
