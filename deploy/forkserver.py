"""SuperNodes forked from one process that has imported them, instead of each importing Flower anew.

A SuperNode's start is almost all imports: about 2 CPU-s of Flower's modules (its gRPC and HTTP stacks, its state
stores) before it dials the SuperLink. `fedbayes local` starts ten of them at once on a 2-core machine, so their
imports held both cores for most of its start-up. `fedbayes supernode-forkserver` imports them
once and then forks one SuperNode per request; a fork starts in milliseconds and shares the imported pages, which the
fork server first freezes out of the garbage collector (`gc.freeze`), as the warm executor does, so that an idle
SuperNode's collections do not copy them.

The fork server reads requests from its stdin and answers on its stdout, one JSON object per line:

    {"fork": {"name": N, "argv": [...], "cwd": D, "log": L}}  ->  {"pid": P}   a SuperNode with `fedbayes supernode`'s
                                                                                 arguments, logging to L, in D
    {"poll": P}                                                ->  {"returncode": R}   R null while P runs

It reaps a child only when asked about it, so a pid it handed out is never reused before the launcher has seen that
process end. When its stdin closes (the launcher is gone) it exits; its SuperNodes run on until stopped (they carry
the process group's marker in their environment, deploy/processes.py). A fork runs with the fork server's
environment, so only SuperNodes that need no environment of their own are forked (deploy/launcher.py).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fedbayes.deploy.processes import name_this_process, running
from fedbayes.flowerseam.supernode import SUPERNODE_MODULES

PRELOAD = ("fedbayes.deploy.supernode", *SUPERNODE_MODULES)
EXIT_UNKNOWN = 255  # the returncode of a fork whose fork server died before it could tell


def serve(requests: IO[str], answers: IO[str]) -> None:
    """Import the SuperNode once, then answer requests until `requests` closes.

    Args:
        requests: the request lines (JSON), read until they end.
        answers: where each answer line goes, flushed after each.

    Raises:
        SystemExit: a thread other than this one runs after the imports (a fork would lack it).
    """
    for module in PRELOAD:
        importlib.import_module(module)
    gc.collect()
    gc.freeze()  # a fork's collections then skip the imported objects, whose pages they would otherwise copy
    if threading.active_count() != 1:  # a fork copies only the thread that forks: nothing may run beside it
        raise SystemExit(f"supernode-forkserver: {threading.active_count()} threads after the imports; forks need 1")
    for line in requests:
        request = json.loads(line)
        if "fork" in request:
            answer: dict[str, Any] = {"pid": fork_supernode(**request["fork"])}
        else:
            answer = {"returncode": returncode(request["poll"])}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def fork_supernode(name: str, argv: list[str], cwd: str, log: str) -> int:
    """Fork a SuperNode; its pid. The child never returns here: it ends with os._exit whatever happens.

    Args:
        name: the SuperNode's name in `ps`.
        argv: `fedbayes supernode`'s arguments.
        cwd: its working directory.
        log: the file its stdout and stderr go to (truncated).

    Returns:
        The child's pid (in the fork server).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:
        become(name, cwd, log)
        from fedbayes.deploy.supernode import main

        main(argv)  # ends the process (exit_without_teardown)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(1)


def become(name: str, cwd: str, log: str) -> None:
    """What `subprocess.Popen(..., stdout=log, stderr=STDOUT, stdin=DEVNULL, cwd=cwd, start_new_session=True)` does
    for a new process, done in the fork: its own session, its directory and its output; named `name` in `ps`.

    Args:
        name: the process's name in `ps` (its first 15 characters).
        cwd: its working directory.
        log: the file its stdout and stderr go to (made 0644, truncated).
    """
    os.setsid()
    os.chdir(cwd)
    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.close(nothing)
    name_this_process(name)


def returncode(pid: int) -> int | None:
    """Popen's returncode of child `pid` (negative: the signal that ended it), reaping it; None while it runs.

    Args:
        pid: a child of this process.

    Returns:
        The exit code (negative: the signal), None while it runs, or EXIT_UNKNOWN for a pid that is no unreaped
        child.
    """
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return EXIT_UNKNOWN  # not ours, or already reaped
    return None if done == 0 else os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> int:
    """`fedbayes supernode-forkserver`: serve requests from stdin until it closes, then end the process.

    Args:
        argv: the arguments after the command: none, or -h/--help.

    Returns:
        0 after the help; otherwise it does not return (os._exit(0) once stdin closes).

    Raises:
        SystemExit: any other argument (with the usage).
    """
    usage = "usage: fedbayes supernode-forkserver: fork SuperNodes on requests read from stdin (deploy/forkserver.py)"
    if argv in (["-h"], ["--help"]):
        print(usage)
        return 0
    if argv:
        raise SystemExit(usage)
    serve(sys.stdin, sys.stdout)
    sys.stderr.flush()
    os._exit(0)  # its SuperNodes may still run; nothing of ours needs tearing down


class ForkServer:
    """The launcher's end of a running `fedbayes supernode-forkserver` (`process`, started with pipes to its stdin
    and stdout). Thread-safe: one request at a time."""

    def __init__(self, process: subprocess.Popen, log_tail: Callable[[], str]) -> None:
        self.process = process
        self.log_tail = log_tail  # its log's last lines, for the error if it fails
        self.lock = threading.Lock()

    def ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Send one request and read its answer.

        Args:
            request: {"fork": {...}} or {"poll": pid}.

        Returns:
            Its answer, or None once it is gone (its pipes broken or closed).
        """
        assert self.process.stdin is not None and self.process.stdout is not None  # started with pipes
        with self.lock:
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
                line = self.process.stdout.readline()
            except (BrokenPipeError, ValueError):  # ValueError: its pipes are closed
                return None
        return json.loads(line) if line else None

    def fork(self, name: str, argv: list[str], cwd: Path, log: Path) -> ForkedProcess:
        """Have it fork a SuperNode.

        Args:
            name: the SuperNode's name in `ps`.
            argv: `fedbayes supernode`'s arguments.
            cwd: its working directory.
            log: the file its output goes to.

        Returns:
            The fork, with the Popen-like interface ManagedProcess needs.

        Raises:
            RuntimeError: the fork server has exited (its exit code and its log's last lines).
        """
        answer = self.ask({"fork": {"name": name, "argv": argv, "cwd": str(cwd), "log": str(log)}})
        if answer is None:
            raise RuntimeError(f"the SuperNode fork server exited with code {self.process.wait()}:\n{self.log_tail()}")
        return ForkedProcess(self, answer["pid"], ["fedbayes", "supernode", *argv])

    def returncode(self, pid: int) -> int | None:
        """Popen's returncode of fork `pid`. The launcher polls every SuperNode five times a second: while the fork
        runs, /proc says so without a request; once it has ended, the fork server reaps it and tells its status.

        Args:
            pid: a fork of this server.

        Returns:
            None while it runs; its exit code (negative: the signal) once it has ended; EXIT_UNKNOWN where the fork
            server is gone or cannot tell.
        """
        if running(pid):
            return None
        answer = self.ask({"poll": pid})
        # None: the fork server is gone, and with it the exit status of its children (orphans now).
        return EXIT_UNKNOWN if answer is None else answer["returncode"]


class ForkedProcess:
    """A forked SuperNode, with the part of subprocess.Popen's interface a ManagedProcess's users need."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]) -> None:
        self.server = server
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Popen.poll: the fork's exit code once it has ended (kept from then on).

        Returns:
            The exit code (negative: the signal), or None while it runs.
        """
        if self.returncode is None:
            self.returncode = self.server.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Popen.wait: until the fork ends, looking every 50 ms.

        Args:
            timeout: seconds; None: no limit.

        Returns:
            The exit code (negative: the signal).

        Raises:
            subprocess.TimeoutExpired: it still runs after `timeout` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.05)
        return code

    def send_signal(self, sig: int) -> None:
        """Popen.send_signal: signal the fork while it runs; nothing once it has ended (its pid may be another's).

        Args:
            sig: the signal.
        """
        if self.poll() is None:  # not reaped: the pid is still this process's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
