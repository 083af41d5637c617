"""`fedbayes server` as real processes on loopback: arguments after `--` reach the SuperLink; when the SuperLink dies
the command says so, stops the executor and exits 1; started again on the same state directory it comes back, and
Ctrl-C stops it and everything it started (exit 130). (The whole page, with clients and a run, across network
namespaces: tests/system/test_system_server.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from fedbayes.deploy.pki import init_pki
from fedbayes.deploy.processes import command_line, free_ports, running
from tests.support.processes import descendants, read_until, start_fedbayes

pytestmark = pytest.mark.integration

READY = "fedbayes server: ready"


def children_running(pids: list[int]) -> list[int]:
    return [pid for pid in pids if running(pid)]


def start_server(tmp_path, certs, *superlink_args: str) -> tuple[subprocess.Popen, str]:
    fleet, control = free_ports(2)
    arguments = ["server", "--certs", str(certs), "--name", "localhost", "--state-dir", str(tmp_path / "state")]
    arguments += ["--fleet-address", f"127.0.0.1:{fleet}", "--control-port", str(control)]
    server = start_fedbayes([*arguments, *(["--", *superlink_args] if superlink_args else [])])
    return server, "".join(read_until(server, lambda line: READY in line))


@pytest.mark.timeout(900)
def test_the_server_supervises_its_processes_and_starts_again_on_its_state(tmp_path):
    certs = tmp_path / "certs"
    init_pki(certs)
    own_log = tmp_path / "superlink-own.log"
    server, started = start_server(tmp_path, certs, "--log-file", str(own_log))
    try:
        daemons = descendants(server.pid)
        superlink = next(pid for pid in daemons if "superlink" in command_line(pid))
        assert own_log.is_file()  # --log-file reached the SuperLink
        os.kill(superlink, signal.SIGKILL)
        output = started + server.communicate(timeout=120)[0]
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 1, output[-3000:]
    assert "fedbayes server: the SuperLink was killed by SIGKILL; stopping the other" in output, output[-3000:]
    deadline = time.monotonic() + 30
    while children_running(daemons) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not children_running(daemons), [command_line(pid) for pid in children_running(daemons)]

    again, started = start_server(tmp_path, certs)  # its database, registry and logs are there from the first
    try:
        daemons = descendants(again.pid)
        again.send_signal(signal.SIGINT)
        output = started + again.communicate(timeout=120)[0]
    finally:
        if again.poll() is None:
            again.kill()
    assert again.returncode == 130, output[-3000:]
    assert "fedbayes server: stopped (Ctrl-C); kept: the SuperLink's database" in output, output[-3000:]
    assert not children_running(daemons), [command_line(pid) for pid in children_running(daemons)]
