"""SuperNodes forked from the SuperNodes' fork server (deploy/forkserver.py) are processes like those `fedbayes
supernode` starts: their own session, directory, log and exit status, the process group's marker, and they are
stopped with the group, the fork server too. The loopback federations of this tier run on them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedbayes.deploy.forkserver import EXIT_UNKNOWN, ForkServer
from fedbayes.deploy.processes import ProcessGroup, console_script, free_ports, process_env

pytestmark = pytest.mark.integration


def dialing_nowhere() -> list[str]:
    """`fedbayes supernode` arguments of a SuperNode that dials a port nobody serves: it keeps retrying."""
    fleet, runtime = free_ports(2)
    return ["--insecure", "--superlink", f"127.0.0.1:{fleet}", "--port", str(runtime), "--isolation", "process"]


def fork_server(processes: ProcessGroup, cwd: Path) -> ForkServer:
    server = processes.start(
        "supernode-forkserver", [console_script("fedbayes"), "supernode-forkserver"], cwd=cwd, pipes=True
    )
    assert isinstance(server.popen, subprocess.Popen)
    return ForkServer(server.popen, server.log_tail)


def log_says(path: Path, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert time.monotonic() < deadline, f"{path.name} never said {text!r}:\n{path.read_text(errors='replace')}"
        time.sleep(0.1)


def settled_members(processes: ProcessGroup, pids: list[int], timeout: float = 10.0) -> list[int]:
    """The group's marked processes, sorted, once they are exactly `pids` or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (members := sorted(processes.members())) != sorted(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members


def test_a_forked_supernode_is_a_process_of_its_own_and_stops_with_the_group(tmp_path):
    workdir = tmp_path / "fed"
    workdir.mkdir()
    with ProcessGroup(tmp_path / "logs", process_env(None)) as processes:
        server = fork_server(processes, workdir)
        node = processes.fork("supernode-7", server, dialing_nowhere(), workdir)
        log_says(node.log_path, "Starting Flower SuperNode")
        pid = node.popen.pid
        assert node.popen.poll() is None
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "supernode-7"  # what `ps` and top show
        assert os.getsid(pid) == pid  # its own session, as start_new_session gives: Ctrl-C does not reach it
        assert Path(f"/proc/{pid}/cwd").resolve() == workdir.resolve()
        # Both carry the group's marker. So, for a moment, does `file -b python`: Flower's start-up telemetry event
        # calls platform.architecture() even with telemetry off (CI once listed it).
        assert settled_members(processes, [server.process.pid, pid]) == sorted([server.process.pid, pid])
    assert node.popen.poll() is not None
    assert processes.members() == []  # the SuperNode and the fork server stopped


def test_a_forked_supernode_reports_how_it_ended(tmp_path):
    with ProcessGroup(tmp_path / "logs", process_env(None)) as processes:
        server = fork_server(processes, tmp_path)
        refused = processes.fork("supernode-0", server, ["--no-such-option"], tmp_path)
        assert refused.popen.wait(timeout=60) == 2  # argparse's status, as `fedbayes supernode --no-such-option`
        assert "unrecognized arguments: --no-such-option" in refused.log_tail()

        killed = processes.fork("supernode-1", server, dialing_nowhere(), tmp_path)
        log_says(killed.log_path, "Starting Flower SuperNode")
        killed.popen.kill()
        assert killed.popen.wait(timeout=30) == -signal.SIGKILL
        killed.popen.send_signal(signal.SIGTERM)  # once reaped its pid may be another process's: no signal is sent

        running = processes.fork("supernode-2", server, dialing_nowhere(), tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):
            running.popen.wait(timeout=0.5)


def test_supernodes_outlive_a_dead_fork_server_and_still_stop_with_the_group(tmp_path):
    with ProcessGroup(tmp_path / "logs", process_env(None)) as processes:
        server = fork_server(processes, tmp_path)
        node = processes.fork("supernode-0", server, dialing_nowhere(), tmp_path)
        log_says(node.log_path, "Starting Flower SuperNode")
        server.process.kill()
        server.process.wait(timeout=30)
        assert node.popen.poll() is None  # an orphan now, still running
        with pytest.raises(RuntimeError, match="fork server exited with code -9"):
            processes.fork("supernode-1", server, dialing_nowhere(), tmp_path)
    assert node.popen.poll() == EXIT_UNKNOWN  # its status went with the fork server
    assert processes.members() == []


def test_the_fork_server_freezes_what_it_imported_before_it_forks():
    """Frozen out of the garbage collector, the imported objects' pages stay shared with every fork."""
    probe = (
        "import gc, io\n"
        "from fedbayes.deploy.forkserver import serve\n"
        "serve(io.StringIO(''), io.StringIO())\n"
        "print(gc.get_freeze_count())\n"
    )
    frozen = subprocess.run(
        [sys.executable, "-c", probe], env=process_env(None), capture_output=True, text=True, timeout=120, check=True
    )
    assert int(frozen.stdout.split()[-1]) > 100_000
