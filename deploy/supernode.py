"""`fedbayes supernode`: Flower's own SuperNode, without its idle sleeps.

When the SuperLink has no message for it, Flower 1.39's SuperNode sleeps a hard-coded 3 s before it asks again
(`flwr/supernode/start_client_internal.py`, unchanged through 1.42), and it looks for its ClientApp's reply
every 0.5 s. A round's instruction therefore waits up to 3 s before any client starts, and every reply up to
0.5 s: most of a round that trains for a second. This entry point runs the same `flower-supernode` (same CLI,
arguments and behaviour) with those two waits shortened to `FEDBAYES_SUPERNODE_POLL` seconds (default 0.2), by
handing that one Flower module a `time` whose `sleep` maps them. Asking the SuperLink 5 times a second instead
of once every 3 s costs one small gRPC call each. It also shortens the 1 s back-off of its object pulls
(fedbayes.flowerseam.object_pulls), rings its executor's doorbell when it takes a message (deploy/doorbell.py), and
drops what a message leaves behind when its run turns out to be stopped while the SuperNode takes it
(`dropping_stopped_runs`). Once Flower's own graceful shutdown is done, it exits without the interpreter's teardown
(`exit_without_teardown`).

With `--max-message-mb MB` (default: max-payload-mb's default) it refuses an instruction over MB as it receives it:
its Fleet calls carry at most `call_bytes_limit(MB)` (`bounding_fleet_calls`), and an instruction whose objects pass
`message_bytes_limit(MB)` while they are pulled is dropped, the pull stopped, and answered with an error reply naming
the limit (`refusing_oversize_instructions`), as the SuperLink refuses a reply (deploy/superlink.py). Flower's
SuperNode pulls every object of an instruction into memory before its ClientApp could look at its size.

The patches live in fedbayes.flowerseam.supernode, tied to the code they were read in: any Flower but the one
fedbayes.flowerseam.version names is refused rather than patched blindly.
"""

from __future__ import annotations

import functools

from fedbayes.deploy.doorbell import ring
from fedbayes.deploy.processes import exit_without_teardown
from fedbayes.flowerseam.supernode import patch_supernode, run_flower_supernode, runtime_port
from fedbayes.tasks.message_limits import max_message_option, seconds_from_env

DEFAULT_POLL = 0.2


def poll_interval() -> float:
    """The seconds between the SuperNode's polls of its SuperLink: FEDBAYES_SUPERNODE_POLL, else DEFAULT_POLL.

    Returns:
        The seconds, in (0, 3].

    Raises:
        SystemExit: the variable is no number, or outside (0, 3].
    """
    try:
        return seconds_from_env("FEDBAYES_SUPERNODE_POLL", DEFAULT_POLL, 3.0)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def patch_flower(poll: float, runtime_port: int | None = None, max_message_mb: float | None = None) -> None:
    """Flower's SuperNode loop patched (fedbayes.flowerseam.supernode.patch_supernode), ringing the executor's
    doorbell on `runtime_port` (if given) when it takes a message, refusing an instruction over `max_message_mb`
    (if given).

    Args:
        poll: the seconds between the SuperNode's polls (`poll_interval`).
        runtime_port: its Runtime API port, whose doorbell it rings; None: no doorbell.
        max_message_mb: the largest instruction it takes, in MiB; None: Flower's own limit.
    """
    bell = None if runtime_port is None else functools.partial(ring, runtime_port)
    patch_supernode(poll, bell, max_message_mb)


def main(argv: list[str]) -> int:
    """Run `flower-supernode` with `argv`, less our --max-message-mb, as its arguments; the process ends with it
    (`exit_without_teardown`).

    Args:
        argv: `fedbayes supernode`'s arguments: `flower-supernode`'s, and ours (--max-message-mb).

    Returns:
        Nothing: the process ends with the SuperNode.

    Raises:
        SystemExit: a bad --max-message-mb or FEDBAYES_SUPERNODE_POLL, or a Flower other than the one patched.
    """
    max_message_mb, flower_argv = max_message_option(argv)
    patch_flower(poll_interval(), runtime_port(flower_argv), max_message_mb)
    exit_without_teardown(run_flower_supernode(flower_argv))
