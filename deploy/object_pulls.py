"""Flower's object pulls without their 1 s first back-off.

A Flower 1.39 message travels as a tree of objects: the sender registers the message, then uploads its objects. A
receiver that asks for an object the sender has not uploaded yet gets "unavailable" and retries after a back-off
that starts at 1 s (`PULL_INITIAL_BACKOFF`) and doubles. On loopback the receiver is that quick every round: the
SuperNode pulls the instruction while the ServerApp still pushes it, the ServerApp pulls a reply while the
SuperNode still pushes it, and each waits a whole second for an upload that finishes a few milliseconds later
(benchmarks/network_vs_inprocess.py, phase `first_reply`). `shorten_pull_backoff` makes the first retry come after
`FEDBAYES_PULL_BACKOFF` seconds (default 0.05), still doubling up to Flower's cap, in the process that calls it:
our SuperNode (deploy/supernode.py), the warm executor's ClientApps (deploy/warm_executor.py) and the ServerApp
(server/loop.py). It changes only two keyword defaults, and only on the Flower it was read in.
"""

from __future__ import annotations

import os

PATCHED_FLOWER = "1.39.0"
DEFAULT_BACKOFF = 0.05


def seconds_from_env(name: str, default: float, maximum: float) -> float:
    """The environment variable `name` as seconds in (0, maximum], `default` when unset; ValueError naming it."""
    value = os.environ.get(name, str(default))
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not 0 < seconds <= maximum:
        raise ValueError(f"{name} must be in (0, {maximum:g}] seconds, got {seconds}")
    return seconds


def pull_backoff() -> float:
    return seconds_from_env("FEDBAYES_PULL_BACKOFF", DEFAULT_BACKOFF, 1.0)


def shorten_pull_backoff() -> bool:
    """Set the first retry of Flower's object pulls in this process to `pull_backoff()`; False (and nothing
    changed) on a Flower other than the one this was read in."""
    import flwr
    from flwr.supercore.inflatable import inflatable_utils

    if flwr.__version__ != PATCHED_FLOWER:
        return False
    backoff = pull_backoff()
    for function in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        function.__kwdefaults__["initial_backoff"] = backoff
    return True
