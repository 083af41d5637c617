"""`fedbayes supernode`: Flower's SuperNode loop with its fixed waits shortened, and nothing else changed; Flower's
object pulls with a short first back-off (deploy/object_pulls.py)."""

from __future__ import annotations

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
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "1")  # Flower's own object-pull back-off, unchanged
    supernode.patch_flower(0.1)
    assert start_client_internal.time.sleep is not supernode.time.sleep
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
