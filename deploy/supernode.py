"""`fedbayes supernode`: Flower's own SuperNode, without its idle sleeps.

When the SuperLink has no message for it, Flower 1.39's SuperNode sleeps a hard-coded 3 s before it asks again
(`flwr/supernode/start_client_internal.py`, unchanged through 1.42), and it looks for its ClientApp's reply
every 0.5 s. A round's instruction therefore waits up to 3 s before any client starts, and every reply up to
0.5 s: most of a round that trains for a second. This entry point runs the same `flower-supernode` (same CLI,
arguments and behaviour) with those two waits shortened to `FEDBAYES_SUPERNODE_POLL` seconds (default 0.2), by
handing that one Flower module a `time` whose `sleep` maps them. Asking the SuperLink 5 times a second instead
of once every 3 s costs one small gRPC call each. It also shortens the 1 s back-off of its object pulls
(tasks/object_pulls.py), and rings its executor's doorbell when it takes a message (deploy/doorbell.py).

The patch is tied to the code it was read in: any Flower but 1.39.0 is refused rather than patched blindly.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

from fedbayes.deploy.doorbell import ring
from fedbayes.tasks.object_pulls import seconds_from_env, shorten_pull_backoff

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

    return time_with_sleep(sleep)


def time_with_sleep(sleep: Callable[[float], None]) -> SimpleNamespace:
    """The `time` module, but with this `sleep`: handed to one Flower module as its `time`."""
    functions = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    return SimpleNamespace(**{**functions, "sleep": sleep})


def ringing(pull_and_store: Callable[..., int | None], runtime_port: int) -> Callable[..., int | None]:
    """Flower's `_pull_and_store_message`, ringing the executor's doorbell (deploy/doorbell.py) once it has taken
    a message (it returns the message's run id then)."""

    def pull_store_and_ring(*args, **kwargs) -> int | None:
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            ring(runtime_port)
        return run_id

    return pull_store_and_ring


def patch_flower(poll: float, runtime_port: int | None = None) -> None:
    import flwr
    from flwr.supernode import start_client_internal

    if flwr.__version__ != PATCHED_FLOWER:
        raise SystemExit(
            f"fedbayes supernode patches Flower {PATCHED_FLOWER}'s SuperNode loop, but Flower "
            f"{flwr.__version__} is installed; use `flower-supernode` instead"
        )
    # a stand-in for the time module, its sleep remapped (polling_time): no ModuleType, but all Flower's loop uses
    start_client_internal.time = polling_time(poll)  # type: ignore[assignment]
    if runtime_port is not None:
        start_client_internal._pull_and_store_message = ringing(
            start_client_internal._pull_and_store_message, runtime_port
        )
    shorten_pull_backoff()  # the instruction's objects, pulled while the ServerApp still uploads them


def runtime_port(argv: list[str]) -> int:
    """The Runtime API port `flower-supernode` will serve with these arguments (its `--port`)."""
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    return parser.parse_known_args(argv)[0].port


def main(argv: list[str]) -> int:
    """Run `flower-supernode` with `argv` as its arguments."""
    patch_flower(poll_interval(), runtime_port(argv))
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()
    return 0
