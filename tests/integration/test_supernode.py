"""`fedbayes supernode`: Flower's SuperNode loop with its fixed waits shortened, and nothing else changed; Flower's
object pulls with a short first back-off (fedbayes.flowerseam.object_pulls)."""

from __future__ import annotations

import os

import pytest


def test_the_doorbell_answers_only_its_supernodes_process_and_reports_a_stranger_once():
    import subprocess
    import sys
    import threading

    from fedbayes.deploy import doorbell

    port = 40000 + (os.getpid() + 1) % 20000
    strangers = []
    bell = doorbell.Doorbell(port, ringer_pid=os.getpid(), on_stranger=strangers.append)
    ring_twice = [sys.executable, "-c", f"from fedbayes.deploy.doorbell import ring; ring({port}); ring({port})"]
    stranger = subprocess.Popen(ring_twice)
    assert stranger.wait() == 0
    assert not bell.answer() and not bell.heard  # both dropped: no ask, and the executor keeps polling
    assert strangers == [stranger.pid]
    assert subprocess.Popen(ring_twice).wait() == 0
    ringer = threading.Thread(target=doorbell.ring, args=(port,))  # the SuperNode's own process, any thread
    ringer.start()
    ringer.join()
    assert bell.answer() and bell.heard
    assert len(strangers) == 1  # reported once, not per ring
    bell.socket.close()


STAND_IN = """
import sys, threading, time
from fedbayes.deploy.doorbell import ring
port = int(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:  # 'ring': once, from a thread of this process; 'loop S': for S seconds, as fast as it can
    if line.startswith("ring"):
        ringer = threading.Thread(target=ring, args=(port,))
        ringer.start()
        ringer.join()
    else:
        end = time.monotonic() + float(line.split()[1])
        while time.monotonic() < end:
            ring(port)
"""  # and it exits when its stdin closes, as a SuperNode that stops


def stand_in(port: int):
    """A process standing in for a SuperNode (or a stranger) that rings `port`'s doorbell when told (`tell`)."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "ready\n"
    return process


def tell(process, line: str) -> None:
    process.stdin.write(line + "\n")
    process.stdin.flush()


def test_the_executor_asks_when_the_bell_rings_and_stops_serving_a_supernode_that_exited(capsys):
    """One loop serves every SuperNode of the machine. Here the SuperNode is a process standing in for one (its
    Runtime API port has nobody listening): asked at once, asked again as soon as it rings from one of its threads
    (not a second later, as for a SuperNode that does not answer), and no longer served once its process has
    exited."""
    import threading
    import time

    from fedbayes.deploy import warm_executor
    from fedbayes.deploy.processes import free_ports

    (port,) = free_ports(1)
    supernode_process = stand_in(port)
    node = warm_executor.ServedRuntime(
        f"127.0.0.1:{port}", supernode_process.pid, insecure=True, root_certificates=None, poll=0.2
    )
    asked, acquire = [], node.client.AcquireTask
    node.client.AcquireTask = lambda request: (asked.append(time.monotonic()), acquire(request))[1]
    threading.Timer(0.5, tell, (supernode_process, "ring")).start()
    threading.Timer(1.6, supernode_process.stdin.close).start()
    started = time.monotonic()
    warm_executor.serve([node])
    supernode_process.wait()
    elapsed = [moment - started for moment in asked]
    assert time.monotonic() - started < 3.0
    assert elapsed[0] < 0.3 and 0.45 < elapsed[1] < 0.8, elapsed  # at once; then on the ring
    assert all(later - earlier > 0.8 for earlier, later in zip(elapsed[1:], elapsed[2:])), elapsed  # 1 s retries
    log = capsys.readouterr().err
    assert log.count(f"the SuperNode at 127.0.0.1:{port} does not answer") == 1
    assert f"the SuperNode at 127.0.0.1:{port} has exited" in log
    assert "rang the doorbell" not in log


@pytest.mark.parametrize("ringer", ["stranger", "supernode"])
def test_a_process_ringing_in_a_loop_does_not_make_the_executor_spin(monkeypatch, capsys, ringer):
    """A process rings the bell as fast as it can for a second. A stranger's rings are dropped (reported once) and
    make no ask; the SuperNode's own make an ask at most every RING_INTERVAL; either way the loop wakes about
    twice per RING_INTERVAL (once to listen again, once to take the rings), not per ring."""
    import select
    import threading
    import time
    from types import SimpleNamespace

    from flwr.proto.runtime_pb2 import AcquireTaskResponse

    from fedbayes.deploy import warm_executor
    from fedbayes.deploy.doorbell import RING_INTERVAL
    from fedbayes.deploy.processes import free_ports

    (port,) = free_ports(1)
    supernode_process, stranger = stand_in(port), stand_in(port)
    # poll=5: no ask is due in this test but the first, so every other ask answers a ring
    node = warm_executor.ServedRuntime(
        f"127.0.0.1:{port}", supernode_process.pid, insecure=True, root_certificates=None, poll=5.0
    )
    asks, wakes = [], []
    node.client.AcquireTask = lambda request: (asks.append(time.monotonic()), AcquireTaskResponse())[1]
    # every other ask is slow to start (a loaded machine): asks, not only answers, must stay RING_INTERVAL apart
    monkeypatch.setattr(node.executor, "reconcile", lambda: time.sleep(0.05 * (len(asks) % 2)))
    monkeypatch.setattr(
        warm_executor,
        "select",
        SimpleNamespace(select=lambda *args: (wakes.append(time.monotonic()), select.select(*args))[1]),
    )
    tell(supernode_process if ringer == "supernode" else stranger, "loop 1.0")
    threading.Timer(1.2, supernode_process.stdin.close).start()
    started = time.monotonic()
    warm_executor.serve([node])
    seconds = time.monotonic() - started
    stranger.stdin.close()
    stranger.wait()
    supernode_process.wait()
    assert len(wakes) <= 4 + 2 * seconds / RING_INTERVAL, (len(wakes), seconds)
    log = capsys.readouterr().err
    if ringer == "stranger":
        assert len(asks) == 1  # the first ask only
        assert log.count("rang the doorbell") == 1
        assert (
            f"process {stranger.pid} rang the doorbell of the SuperNode at 127.0.0.1:{port}, which is process "
            f"{supernode_process.pid}" in log
        )
    else:
        assert 3 <= len(asks) <= 2 + seconds / RING_INTERVAL, (len(asks), seconds)
        assert all(later - earlier >= RING_INTERVAL for earlier, later in zip(asks[1:], asks[2:])), asks
        assert "rang the doorbell" not in log
