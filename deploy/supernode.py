"""`fedbayes supernode`: Flower's own SuperNode, without its idle sleeps.

When the SuperLink has no message for it, Flower 1.39's SuperNode sleeps a hard-coded 3 s before it asks again
(`flwr/supernode/start_client_internal.py`, unchanged through 1.42), and it looks for its ClientApp's reply
every 0.5 s. A round's instruction therefore waits up to 3 s before any client starts, and every reply up to
0.5 s: most of a round that trains for a second. This entry point runs the same `flower-supernode` (same CLI,
arguments and behaviour) with those two waits shortened to `FEDBAYES_SUPERNODE_POLL` seconds (default 0.2), by
handing that one Flower module a `time` whose `sleep` maps them. Asking the SuperLink 5 times a second instead
of once every 3 s costs one small gRPC call each. It also shortens the 1 s back-off of its object pulls
(deploy/object_pulls.py).

The patch is tied to the code it was read in: any Flower but 1.39.0 is refused rather than patched blindly.
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

from fedbayes.deploy.object_pulls import seconds_from_env, shorten_pull_backoff

PATCHED_FLOWER = "1.39.0"
FLOWER_WAITS = (3, 0.5)  # the idle sleep between pulls, and the wait for a reply or an object
DEFAULT_POLL = 0.2


def poll_interval() -> float:
    try:
        return seconds_from_env("FEDBAYES_SUPERNODE_POLL", DEFAULT_POLL, 3.0)
    except ValueError as error:
        raise SystemExit(str(error)) from None


IDLE_GROWTH, IDLE_CAP = 1.5, 1.0  # idle polls of the SuperLink back off by this factor, up to this many seconds


def polling_time(poll: float) -> SimpleNamespace:
    """The `time` module as Flower's SuperNode loop sees it: its fixed waits become `poll`, nothing else changes,
    except that consecutive idle waits (nothing pulled from the SuperLink) grow by IDLE_GROWTH up to IDLE_CAP
    (or `poll`, if larger). Waiting for a ClientApp's reply (a message was pulled) resets them to `poll`: a node
    asks quickly right after its reply, when the next round's instruction is due, and about once a second while
    the federation has no work for it (ten idle nodes polling 5 times a second used a quarter of a 2-core machine)."""
    idle = {"wait": poll}
    idle_wait, reply_wait = FLOWER_WAITS

    def sleep(seconds: float) -> None:
        if seconds == idle_wait:
            time.sleep(idle["wait"])
            idle["wait"] = min(idle["wait"] * IDLE_GROWTH, max(IDLE_CAP, poll))
        elif seconds == reply_wait:
            idle["wait"] = poll
            time.sleep(poll)
        else:
            time.sleep(seconds)

    functions = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    return SimpleNamespace(**{**functions, "sleep": sleep})


def patch_flower(poll: float) -> None:
    import flwr
    from flwr.supernode import start_client_internal

    if flwr.__version__ != PATCHED_FLOWER:
        raise SystemExit(f"fedbayes supernode patches Flower {PATCHED_FLOWER}'s SuperNode loop, but Flower "
                         f"{flwr.__version__} is installed; use `flower-supernode` instead")
    start_client_internal.time = polling_time(poll)
    shorten_pull_backoff()  # the instruction's objects, pulled while the ServerApp still uploads them


def main(argv: list[str]) -> int:
    """Run `flower-supernode` with `argv` as its arguments."""
    patch_flower(poll_interval())
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()
    return 0
