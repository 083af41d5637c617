"""Compute slots (tasks/slots.py): real processes contend for a machine's slots through lock files; the warm
executor never waits for a running task (deploy/warm_executor.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedbayes.deploy import warm_executor
from fedbayes.deploy.launcher import Host, LocalFederation, LocalRun, run_local, with_compute_slots
from fedbayes.deploy.pki import init_pki
from fedbayes.deploy.warm_executor import ForkExecutor
from fedbayes.tasks.slots import SLOTS_ENV, compute_slot
from tests.support import ROOT

HOLDER = """
import sys, time
from fedbayes.tasks.slots import compute_slot
log, hold = sys.argv[1], float(sys.argv[2])
with compute_slot():
    with open(log, "a") as out:
        out.write(f"in {time.monotonic()}\\n")
    time.sleep(hold)
    with open(log, "a") as out:
        out.write(f"out {time.monotonic()}\\n")
"""


def start_holder(slots: Path, count: int, log: Path, hold: float) -> subprocess.Popen:
    env = {**os.environ, SLOTS_ENV: f"{count}:{slots}", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(log), str(hold)], env=env)


def most_at_once(log: Path) -> int:
    events = sorted(
        (float(stamp), 1 if kind == "in" else -1)
        for kind, stamp in (line.split() for line in log.read_text().splitlines())
    )
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def test_at_most_n_clientapps_compute_at_once_and_every_one_gets_its_turn(tmp_path):
    log = tmp_path / "log"
    holders = [start_holder(tmp_path, 2, log, 0.4) for _ in range(5)]
    assert [holder.wait(timeout=60) for holder in holders] == [0] * 5
    assert len(log.read_text().splitlines()) == 10
    assert most_at_once(log) == 2


def test_a_killed_holder_frees_its_slot(tmp_path):
    log = tmp_path / "log"
    stuck = start_holder(tmp_path, 1, log, 600)
    deadline = time.monotonic() + 30
    while not log.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting = start_holder(tmp_path, 1, log, 0)
    time.sleep(1.0)
    assert waiting.poll() is None, "the only slot is held: the second ClientApp waits"
    stuck.kill()  # by its pid: the kernel releases its lock
    stuck.wait()
    assert waiting.wait(timeout=10) == 0
    assert len(log.read_text().splitlines()) == 3


def test_no_slots_no_limit_and_a_bad_value_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(SLOTS_ENV, raising=False)
    with compute_slot(), compute_slot():  # nested: would wait forever if it took a slot
        pass
    for bad in ("0:" + str(tmp_path), "2", f"two:{tmp_path}", f"2:{tmp_path / 'missing'}"):
        monkeypatch.setenv(SLOTS_ENV, bad)
        with pytest.raises(ValueError, match=SLOTS_ENV), compute_slot():
            pass


def test_a_local_federation_has_one_slot_per_core_by_default_and_never_an_enclosing_ones(tmp_path):
    outer = {SLOTS_ENV: "9:/elsewhere", "PATH": "/bin"}
    assert with_compute_slots(outer, tmp_path / "slots", None) == {
        SLOTS_ENV: f"{len(os.sched_getaffinity(0))}:{tmp_path / 'slots'}",
        "PATH": "/bin",
    }
    assert (tmp_path / "slots").is_dir()
    assert with_compute_slots(outer, tmp_path / "slots", 3)[SLOTS_ENV] == f"3:{tmp_path / 'slots'}"
    assert with_compute_slots(outer, tmp_path / "none", 0) == {"PATH": "/bin"}
    with pytest.raises(ValueError, match="--parallel-tasks must be >= 0"):
        LocalFederation(tmp_path / "fed", parallel_tasks=-1)
    with pytest.raises(ValueError, match="--parallel-tasks must be >= 0"):  # before anything is made or started
        run_local(LocalRun(strategy="fedavg", clients=1, rounds=1, workdir=tmp_path / "run", parallel_tasks=-1))
    assert not (tmp_path / "run").exists()
    assert SLOTS_ENV in LocalFederation(tmp_path / "local").processes.env
    # Network namespaces stand for separate machines: they share no cores, so no slots by default.
    tls = init_pki(tmp_path / "pki", ips=["10.9.0.1"])
    hosts = LocalFederation(tmp_path / "hosts", server=Host("10.9.0.1", "lab-server"), tls=tls)
    assert SLOTS_ENV not in hosts.processes.env


def test_the_warm_executor_goes_on_asking_while_a_task_runs_and_reaps_it_once_it_has_ended():
    """A task can hang (its run stopped while its SuperNode took the message): the next must still start."""
    executor = ForkExecutor("flwr-clientapp")
    child = os.fork()
    if child == 0:
        time.sleep(0.5)
        os._exit(0)
    executor.children.add(child)
    started = time.monotonic()
    executor.reconcile()
    assert time.monotonic() - started < 0.3 and executor.children == {child}
    time.sleep(0.8)
    executor.reconcile()
    assert executor.children == set()


def test_the_warm_executor_closes_at_once_when_its_tasks_have_ended_and_waits_for_one_that_has_not(monkeypatch):
    """`fedbayes local`'s exit closes one executor per SuperNode: none may wait once its tasks are gone."""
    ended = os.fork()
    if ended == 0:
        os._exit(0)
    os.waitid(os.P_PID, ended, os.WEXITED | os.WNOWAIT)  # a zombie, not reaped yet
    executor = ForkExecutor("flwr-clientapp")
    executor.children.add(ended)
    sleeps: list[float] = []
    monkeypatch.setattr(warm_executor, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleeps.append))
    executor.close(timeout=10.0)
    assert executor.children == set() and sleeps == []

    monkeypatch.undo()
    stopping = os.fork()
    if stopping == 0:  # takes a while to stop once told
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.3), os._exit(0)))
        time.sleep(30)
        os._exit(1)
    time.sleep(0.2)  # its handler is set
    executor.children.add(stopping)
    executor.close(timeout=10.0)
    assert executor.children == set()  # waited for it and reaped it
