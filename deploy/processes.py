"""Start long-running child processes in their own process groups and always stop them all.

Flower daemons spawn children of their own (SuperExec, one flwr-clientapp per message); giving each
daemon its own process group lets us signal the whole tree, so nothing outlives the launcher even
when it is interrupted or one of the processes fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ManagedProcess:
    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.popen.pid  # start_new_session=True makes the child its group leader

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class ProcessGroup:
    """Context manager owning every process it started; exiting stops them (TERM, then KILL)."""

    def __init__(self, log_dir: Path, env: Mapping[str, str], stop_timeout: float = 15.0) -> None:
        self.log_dir = log_dir
        self.env = dict(env)
        self.stop_timeout = stop_timeout
        self.processes: list[ManagedProcess] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(
        self, name: str, command: Sequence[str], cwd: Path | None = None, extra_env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log_file:
            popen = subprocess.Popen(
                list(command),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**self.env, **(extra_env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        process = ManagedProcess(name, popen, log_path)
        self.processes.append(process)
        return process

    def process_group_ids(self) -> list[int]:
        return [process.pgid for process in self.processes]

    def stop_all(self) -> None:
        # Clients first, so the SuperLink sees them leave; then everything else.
        for process in reversed(self.processes):
            _signal_group(process.pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for process in self.processes:
            while group_alive(process.pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
        for process in self.processes:
            if group_alive(process.pgid):
                _signal_group(process.pgid, signal.SIGKILL)
            try:
                process.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes:
            # Reap group members we did not start ourselves (SuperExec, ClientApps) when they exit.
            deadline = time.monotonic() + 5
            while group_alive(process.pgid) and time.monotonic() < deadline:
                time.sleep(0.1)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop_all()


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists and is not a zombie."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        state, process_group = fields[0], int(fields[2])
        if process_group == pgid and state != "Z":
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def free_ports(count: int) -> list[int]:
    """Ports the kernel hands out as free right now on 127.0.0.1."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_for_port(port: int, timeout: float, process: ManagedProcess) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"{process.name} exited with code {process.popen.returncode}:\n{process.log_tail()}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{process.name} did not listen on 127.0.0.1:{port} within {timeout:.0f} s:\n{process.log_tail()}")
