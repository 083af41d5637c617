"""`fedbayes supernode`: Flower's SuperNode loop with its fixed waits shortened, and nothing else changed."""

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
    assert patched.time is supernode.time.time and patched.monotonic is supernode.time.monotonic


def test_it_patches_only_the_flower_it_was_read_in(monkeypatch):
    import flwr
    from flwr.supernode import start_client_internal

    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)  # restored after the test
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
