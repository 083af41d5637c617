"""Stopping what we started reaches every descendant, including one that dropped our marker, and nothing else;
free ports for our servers come from outside the range outgoing connections draw from."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

from fedbayes.deploy.processes import ProcessGroup, free_ports, stop_processes_with_env
from tests.support import ROOT
from tests.support.processes import descendants, processes_with_env

VARIABLE = "FEDBAYES_TEST_MARKER"
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
# A child started with an empty environment, as Ray starts its agents: it no longer carries the marker.
SPAWNS_UNMARKED_CHILD = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen([sys.executable, "
    "'-c', 'import time; time.sleep(600)'], env={}); time.sleep(600)",
]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for_child(pid: int) -> int:
    deadline = time.monotonic() + 60
    while not descendants(pid):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return descendants(pid)[0]


def test_a_descendant_without_the_marker_is_stopped_with_the_session_its_marked_ancestor_leads():
    marker = uuid.uuid4().hex
    leader = subprocess.Popen(SPAWNS_UNMARKED_CHILD, env={**os.environ, VARIABLE: marker}, start_new_session=True)
    child = wait_for_child(leader.pid)
    assert processes_with_env(VARIABLE, marker) == [leader.pid], "the child has no marker"
    stop_processes_with_env(VARIABLE, marker, timeout=10)
    assert leader.wait(timeout=10) != 0
    assert not alive(child)


def test_a_marked_process_in_our_own_session_does_not_take_the_session_with_it():
    marker = uuid.uuid4().hex
    marked = subprocess.Popen(SLEEP, env={**os.environ, VARIABLE: marker})  # our session, not its leader
    bystander = subprocess.Popen(SLEEP)
    try:
        stop_processes_with_env(VARIABLE, marker, timeout=10)
        assert marked.wait(timeout=10) != 0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    """An outgoing connection (a SuperNode dialing the SuperLink) takes its local port from the ephemeral range;
    a Runtime API port from that range could be taken between our check and the SuperNode's bind."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        ephemeral_start = int(ports.read().split()[0])
    ports = [port for _ in range(200) for port in free_ports(1)]  # one at a time, as a federation's SuperNodes
    assert len(set(ports)) == 200 and all(1024 <= port < ephemeral_start for port in ports)
    for port in ports[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    with socket.create_server(("127.0.0.1", ports[0])), socket.create_connection(("127.0.0.1", ports[0])) as client:
        assert client.getsockname()[1] >= ephemeral_start  # the local port the kernel gave an outgoing connection


def test_stopping_a_group_reaches_the_processes_of_a_group_started_inside_it_after_the_middle_one_dies(tmp_path):
    """`fedbayes client` under a test's federation: the outer group's process runs a group of its own, whose
    processes lead their own sessions. If the middle process is killed before it stops them (SIGKILL after the
    stop timeout), the outer group must still reach them: they carry both markers."""
    inner = (
        "import sys, time; sys.path.insert(0, {root!r}); from fedbayes.deploy.processes import ProcessGroup; "
        "import os; group = ProcessGroup(None, dict(os.environ)); "
        "child = group.start('sleeper', [sys.executable, '-c', 'import time; time.sleep(600)']); "
        "open({pid_file!r}, 'w').write(str(child.popen.pid)); time.sleep(600)"
    )
    pid_file = tmp_path / "grandchild.pid"
    with ProcessGroup(None, dict(os.environ)) as outer:
        middle = outer.start("middle", [sys.executable, "-c", inner.format(root=str(ROOT), pid_file=str(pid_file))])
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline, "the inner group did not start its process"
            time.sleep(0.1)
        grandchild = int(pid_file.read_text())
        assert grandchild in outer.members()
        middle.popen.kill()  # dies without stopping its own group
        middle.popen.wait()
        assert alive(grandchild)
    assert not alive(grandchild)


def test_stopping_a_group_sends_each_of_its_processes_one_term(tmp_path):
    """A process of the group gets SIGTERM once: the group's own TERM, not another from the scan for marked
    processes that follows it. A second TERM interrupts a process's shutdown (Flower's SuperNode then left its
    Runtime API server running until the KILL, 15 s later)."""
    log = tmp_path / "terms"
    counts_terms = (
        "import signal, sys, time\n"
        f"log = {str(log)!r}\n"
        "def on_term(*_):\n"
        "    open(log, 'a').write('TERM\\n')\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "open(log, 'w').write('ready\\n')\n"
        "while 'TERM' not in open(log).read():\n"
        "    time.sleep(0.01)\n"
        "time.sleep(1.0)  # a shutdown that takes a while\n"
        "sys.exit(0)\n"
    )
    with ProcessGroup(None, dict(os.environ)) as group:
        process = group.start("counts-terms", [sys.executable, "-c", counts_terms])
        deadline = time.monotonic() + 60
        while not (log.exists() and log.read_text()):
            assert time.monotonic() < deadline, "the process did not start"
            time.sleep(0.05)
    assert process.popen.returncode == 0  # it finished its own shutdown: no KILL
    assert log.read_text().splitlines() == ["ready", "TERM"]
