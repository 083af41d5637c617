"""`fedbayes supernode`: Flower's SuperNode loop with its fixed waits shortened, and nothing else changed; Flower's
object pulls with a short first back-off (deploy/object_pulls.py)."""

from __future__ import annotations

import os

import pytest

from fedbayes.deploy import supernode


def test_the_supernode_loop_polls_instead_of_sleeping_3_s(monkeypatch):
    slept = []
    monkeypatch.setattr(supernode.time, "sleep", slept.append)
    patched = supernode.polling_time(0.2)
    for seconds in (3, 0.5, 1.0, 10):
        patched.sleep(seconds)
    assert slept == [0.2, 0.2, 1.0, 10]


def test_idle_polls_back_off_to_a_second_and_a_message_resets_them(monkeypatch):
    slept = []
    monkeypatch.setattr(supernode.time, "sleep", slept.append)
    patched = supernode.polling_time(0.2)
    for seconds in (3,) * 7 + (0.5, 3, 3):  # idle polls, a message (waiting for its reply), idle again
        patched.sleep(seconds)
    assert slept == pytest.approx([0.2, 0.3, 0.45, 0.675, 1.0, 1.0, 1.0, 0.2, 0.2, 0.3])
    assert patched.time is supernode.time.time and patched.monotonic is supernode.time.monotonic


def test_it_patches_only_the_flower_it_was_read_in(monkeypatch):
    import flwr
    from flwr.supernode import start_client_internal

    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)  # restored after the test
    pull_and_store = start_client_internal._pull_and_store_message
    monkeypatch.setattr(start_client_internal, "_pull_and_store_message", pull_and_store)
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "1")  # Flower's own object-pull back-off, unchanged
    supernode.patch_flower(0.1, runtime_port=9123)
    assert start_client_internal.time.sleep is not supernode.time.sleep
    assert start_client_internal._pull_and_store_message is not pull_and_store
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    with pytest.raises(SystemExit, match="Flower 1.40.0 is installed"):
        supernode.patch_flower(0.1)


@pytest.mark.parametrize("value", ["fast", "0", "5"])
def test_a_bad_poll_interval_is_refused(monkeypatch, value):
    monkeypatch.setenv("FEDBAYES_SUPERNODE_POLL", value)
    with pytest.raises(SystemExit, match="FEDBAYES_SUPERNODE_POLL"):
        supernode.poll_interval()


@pytest.fixture
def pull_defaults():
    """Flower's object-pull keyword defaults, restored after the test."""
    from flwr.supercore.inflatable import inflatable_utils

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    saved = [dict(function.__kwdefaults__) for function in functions]
    yield functions
    for function, defaults in zip(functions, saved):
        function.__kwdefaults__.clear()
        function.__kwdefaults__.update(defaults)


def test_object_pulls_retry_after_the_configured_backoff_not_1_s(monkeypatch, pull_defaults):
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    from fedbayes.deploy import object_pulls

    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "0.01")
    assert object_pulls.shorten_pull_backoff()
    assert [function.__kwdefaults__["initial_backoff"] for function in pull_defaults] == [0.01, 0.01]
    attempts = []

    def pull(object_id):  # unavailable twice, as while its sender still uploads it
        attempts.append(object_id)
        if len(attempts) < 3:
            raise ObjectUnavailableError(object_id)
        return b"content"

    pull_objects = pull_defaults[0]
    assert pull_objects(["a"], pull) == {"a": b"content"} and attempts == ["a"] * 3


def test_object_pulls_are_left_alone_on_another_flower_and_a_bad_backoff_is_refused(monkeypatch, pull_defaults):
    import flwr

    from fedbayes.deploy import object_pulls

    before = [function.__kwdefaults__["initial_backoff"] for function in pull_defaults]
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "0.01")
    assert not object_pulls.shorten_pull_backoff()
    assert [function.__kwdefaults__["initial_backoff"] for function in pull_defaults] == before
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "soon")
    with pytest.raises(ValueError, match="FEDBAYES_PULL_BACKOFF"):
        object_pulls.pull_backoff()


def test_the_doorbell_wakes_its_executor_at_once_and_only_a_heard_bell_slows_the_polls(monkeypatch):
    import threading
    import time

    from fedbayes.deploy import doorbell

    monkeypatch.setattr(doorbell, "HEARD_POLL", 0.6)
    port = 40000 + os.getpid() % 20000
    bell = doorbell.Doorbell(port)
    started = time.monotonic()
    bell.wait(0.2)  # never heard: Flower's poll interval
    assert 0.2 <= time.monotonic() - started < 0.5 and not bell.heard
    threading.Timer(0.1, doorbell.ring, (port,)).start()
    started = time.monotonic()
    bell.wait(5.0)
    assert time.monotonic() - started < 1.0 and bell.heard
    doorbell.ring(port)
    doorbell.ring(port)
    bell.wait(5.0)  # both rings answered by one ask
    started = time.monotonic()
    bell.wait(0.2)  # heard before: waits for the bell, asking every HEARD_POLL in case a ring was lost
    assert time.monotonic() - started >= 0.6
    with pytest.raises(OSError):
        doorbell.Doorbell(port)  # one listener per SuperNode
    doorbell.ring(port + 1)  # nobody listens: nothing happens


def test_the_supernode_rings_when_it_has_taken_a_message_and_reads_its_runtime_port(monkeypatch):
    rung = []
    monkeypatch.setattr(supernode, "ring", rung.append)
    results = iter([None, 7])
    pull_and_store = supernode.ringing(lambda *args, **kwargs: next(results), 9123)
    assert pull_and_store("anything") is None and rung == []  # nothing for this node
    assert pull_and_store("anything") == 7 and rung == [9123]
    assert supernode.runtime_port(["--insecure", "--port", "23456", "--superlink", "x:1"]) == 23456
    assert supernode.runtime_port(["--insecure"]) == 9094  # Flower's default
