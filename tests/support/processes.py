"""Real processes for the integration and system tiers: loopback federations, the `fedbayes` command as a user runs
it, fault injection into one SuperNode's ClientApps, and finding the processes a federation left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbayes.deploy.launcher import CONNECTION, LocalFederation, console_script
from tests.support import ROOT, newest_state

FAULTS = ROOT / "tests" / "support" / "faults"  # its sitecustomize.py is the one fault injector
LOCAL = ["local", "--strategy", "fedavg", "--clients", "2", "--rounds", "1"]  # `fedbayes local`, smallest


# ---- environments -----------------------------------------------------------------------------------------------
def with_pythonpath(folder: Path) -> str:
    """`folder` first on PYTHONPATH, keeping what the environment already had there."""
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def fault_env(fault: str, **variables: str) -> dict[str, str]:
    """Environment for one SuperNode whose ClientApps misbehave as FEDBAYES_FAULT=`fault` says (tests/support/faults:
    nan, raise, stall, rogue; record, which only records), with its `variables` (e.g. FEDBAYES_ROGUE_ATTACK)."""
    return {"PYTHONPATH": with_pythonpath(FAULTS), "FEDBAYES_FAULT": fault, **variables}


def stall_env(rounds: str, marker: Path, release: Path | None = None) -> dict[str, str]:
    """Environment for a client whose ClientApp stops in `rounds` ("1,3"): it touches <marker>-r<round>, then hangs
    for good, or, with `release`, until <release>-r<round> exists."""
    variables = {"FEDBAYES_STALL_ROUNDS": rounds, "FEDBAYES_STALL_MARKER": str(marker)}
    return fault_env("stall", **variables, **({"FEDBAYES_STALL_RELEASE": str(release)} if release else {}))


def wait_for_file(path: Path, failure: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, failure
        time.sleep(0.1)


def wait_for_log_lines(process, prefix: str, timeout: float = 120.0, count: int = 1) -> list[str]:
    """The lines of `process`'s log that start with `prefix`, once there are `count` (it may be still importing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in process.log_path.read_text().splitlines() if line.startswith(prefix)]
        if len(lines) >= count:
            return lines
        assert process.popen.poll() is None, process.log_tail()
        time.sleep(0.2)
    raise AssertionError(f"no line {prefix!r} in {process.log_path} after {timeout:.0f} s:\n{process.log_tail()}")


# ---- processes ----------------------------------------------------------------------------------------------------
def processes_with_env(variable: str, value: str) -> list[int]:
    """Live processes (zombies are not) whose environment holds variable=value."""
    needle = f"{variable}={value}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            zombie = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            if not zombie and needle in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return found


def command_line(pid: int) -> bytes:
    """The process's command line, NUL-separated; empty once it has exited (a process found a moment ago may be gone
    by the time it is read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def processes_of(flwr_home: Path) -> list[int]:
    """Live processes whose environment says they belong to this federation."""
    return processes_with_env("FLWR_HOME", str(flwr_home))


def resident_mib(pid: int, field: str = "VmHWM") -> float:
    """The process's peak resident set (VmHWM), or its resident set now (VmRSS), in MiB; 0 once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith(f"{field}:")), 0.0)


class PeakMemory:
    """While a `with` block runs, samples every 0.1 s the peak resident set of each process `pids()` lists, by what
    `role(pid)` calls it (None: not watched): `peaks` holds each role's largest, read before its processes exit, and
    `first` each role's resident set when first seen (for a fork, mostly the pages it shares with its parent)."""

    def __init__(self, pids: Callable[[], list[int]], role: Callable[[int], str | None]) -> None:
        self.pids, self.role = pids, role
        self.peaks: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(0.1):
            for pid in self.pids():
                if (role := self.role(pid)) is not None:
                    self.first.setdefault(role, resident_mib(pid, "VmRSS"))
                    self.peaks[role] = max(self.peaks.get(role, 0.0), resident_mib(pid))

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.done.set()
        self.thread.join()


# ---- machines that fail ----------------------------------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    """Pids of every live process below `pid` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(proc.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and everything below it, as when its machine loses power. The tree is read before
    anything dies, so children re-parented to init on their parent's death are still hit."""
    for member in [pid, *descendants(pid)]:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


class BreakableFederation(LocalFederation):
    """A LocalFederation whose machines a test can stop or kill: a client restarted, a client or the server machine
    that dies mid-run, a run stopped at once."""

    def kill_superlink(self) -> None:
        """SIGKILL the SuperLink with its ServerApp and executor: the server machine dies mid-run."""
        for daemon in (self.serverapp_superexec, self.superlink):
            if daemon is not None:
                kill_tree(daemon.popen.pid)
                daemon.popen.wait(timeout=30)
        self.superlink_killed = True  # on purpose: `follow` does not take it for a crash

    def stop_supernode(self, index: int, timeout: float = 30.0) -> None:
        """Stop SuperNode `index` (and its superexec) and wait until it is gone, e.g. to restart it."""
        for daemon in (self.supernodes.pop(index), self.superexecs.pop(index, None)):
            if daemon is not None:
                self.processes.stop(daemon)
                daemon.popen.wait(timeout=timeout)

    def kill_supernode(self, index: int) -> None:
        """SIGKILL SuperNode `index`, its superexec and any ClientApp running: the client machine dies."""
        for daemon in (self.supernodes.pop(index), self.superexecs.pop(index, None)):
            if daemon is not None:
                kill_tree(daemon.popen.pid)
                daemon.popen.wait(timeout=30)

    def stop_run(self, run_id: int) -> None:
        """`flwr stop`: the SuperLink marks the run stopped at once (after a ServerApp crash it would
        take Flower's heartbeat timeout, up to 60 s, during which SuperNodes hold the dead run's messages)."""
        subprocess.run(
            self.server.command([console_script("flwr"), "stop", str(run_id), CONNECTION]),
            cwd=self.workdir,
            env=self.processes.env,
            check=True,
            capture_output=True,
            timeout=60,
        )


# ---- loopback federations -----------------------------------------------------------------------------------------
@dataclass
class LoopbackRun:
    rows: list[dict[str, Any]]
    server_log: str
    flwr_home: Path  # to check that no process of the federation outlived it


def run_loopback(
    workdir: Path,
    config: dict[str, Any],
    rounds: int,
    clients: int = 2,
    executor: str = "shared",
    node_env: dict[int, dict[str, str]] | None = None,
    on_row: Callable[[LocalFederation, dict[str, Any]], None] | None = None,
) -> LoopbackRun:
    """A SuperLink and `clients` SuperNodes on loopback, `config` submitted and followed for `rounds` rounds
    (`on_row(federation, row)` after each, e.g. to restart a client), then everything stopped."""
    with BreakableFederation(workdir, executor) as federation:
        for index in range(clients):
            federation.start_supernode(index, clients, extra_env=(node_env or {}).get(index))
        rows = federation.follow(
            Path(config["results-path"]),
            federation.submit(config),
            rounds,
            on_row=lambda row: on_row and on_row(federation, row),
        )
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    return LoopbackRun(rows, server_log, federation.flwr_home)


def restart_client_1_after_round_1(
    store, tmp_path: Path
) -> tuple[dict[int, dict[str, str]], Callable[[LocalFederation, dict[str, Any]], None]]:
    """The `node_env` and `on_row` for run_loopback that restart client-1's SuperNode once round 1's row is out. The
    row is written when round 1's evaluation is done, which runs while round 2 trains: by then client-1 (its state in
    `store`) may have trained and saved round 2 too, and round 3 could go out to the client being stopped. So client-0
    holds round 2 open until client-1 has started again: with min-clients=2, round 3 goes to the restarted client."""
    release = tmp_path / "client-0-go"

    def restart(federation: LocalFederation, row: dict[str, Any]) -> None:
        if row["round"] == 1:
            assert newest_state(store).round in (1, 2)
            federation.stop_supernode(1)
            federation.start_supernode(1, 2)
            Path(f"{release}-r2").touch()

    return {0: stall_env("2", tmp_path / "client-0-in", release)}, restart


# ---- the `fedbayes` command -----------------------------------------------------------------------------------------
@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def last_error_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def cli_env(**extra: str) -> dict[str, str]:
    """Our environment with the `fedbayes`/`flwr` console scripts of this interpreter first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, **extra}


def fedbayes(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> Finished:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "fedbayes.deploy.cli", *args],
        cwd=ROOT,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Finished(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


def start_fedbayes(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """`fedbayes ARGS` in the background, its stdout (stderr folded in) readable line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "fedbayes.deploy.cli", *args],
        cwd=ROOT,
        env=env or cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(process: subprocess.Popen, wanted: Callable[[str], bool]) -> list[str]:
    """Lines of `process`'s output up to and including the first one that is `wanted`; fails if the
    process ends first (pytest's timeout bounds the wait)."""
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line)
        if wanted(line):
            return lines
    process.wait()
    raise AssertionError(f"`fedbayes` ended with code {process.returncode} before the line wanted:\n{''.join(lines)}")


def is_table_row(number: int) -> Callable[[str], bool]:
    """Whether a line is round `number`'s row of the table `fedbayes local` prints."""
    return lambda line: line.split()[:1] == [str(number)]
