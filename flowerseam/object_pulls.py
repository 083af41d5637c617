"""Flower's object pulls without their 1 s first back-off, and the ServerApp's bounded by `max-payload-mb`.

A Flower 1.39 message travels as a tree of objects: the sender registers the message, then uploads its objects. A
receiver that asks for an object the sender has not uploaded yet gets "unavailable" and retries after a back-off
that starts at 1 s (`PULL_INITIAL_BACKOFF`) and doubles. On loopback the receiver is that quick every round: the
SuperNode pulls the instruction while the ServerApp still pushes it, the ServerApp pulls a reply while the
SuperNode still pushes it, and each waits a whole second for an upload that finishes a few milliseconds later
(benchmarks/network_vs_inprocess.py, phase `first_reply`). `shorten_pull_backoff` makes the first retry come after
`FEDBAYES_PULL_BACKOFF` seconds (default 0.05), still doubling up to Flower's cap, in the process that calls it:
our SuperNode (deploy/supernode.py), the warm executor's ClientApps (deploy/warm_executor.py) and the ServerApp
(server/loop.py). It changes only two keyword defaults, and only on the Flower it was read in.

`bound_reply_pulls(grid, max_payload_mb)`, called in the ServerApp, makes its grid stop pulling a reply once the
reply's objects pass `max-payload-mb`: Flower's `Grid.pull_messages` pulls a reply's whole object tree before any
check of ours can run (a 200 MiB pad under `max-payload-mb=1` took the ServerApp to 1.67 GB peak RSS; bounded,
0.85 GB, what a small reply costs: benchmarks/oversize_reply.py --in-memory). Flower turns the stop into its own
error reply for that message (code MESSAGE_UNAVAILABLE, our reason appended), which the strategy rejects like any
client error, and the SuperLink drops the reply's objects (a SuperNode still uploading them then fails to, logs
that and goes on). The bound is on the sum of the objects pulled: an object arrives whole before it is counted, so
the ServerApp may still hold the limit plus the objects in flight (FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS, 2), each
at most an array chunk (5 MiB) from an honest Flower sender, but up to the Fleet API's 2 GiB gRPC limit from a
rogue one (or a ConfigRecord, which is one object however large).

It lives in the seam (fedbayes.flowerseam), below both its users (the SuperNode and the ServerApp's round loop), so
the ServerApp need not import fedbayes.deploy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fedbayes.flowerseam.version import flower_is_patched
from fedbayes.tasks.message_limits import OBJECT_OVERHEAD_BYTES, message_bytes_limit, seconds_from_env

DEFAULT_BACKOFF = 0.05


def call_bytes_limit(max_message_mb: float) -> int:
    """The most bytes one gRPC call may carry between a SuperLink and a SuperNode bounding messages at
    `max_message_mb` MiB: one object of such a message, or one array chunk (FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE, which a
    message just over a small limit is cut into), plus OBJECT_OVERHEAD_BYTES; at most gRPC's own 2 GiB - 1 (Flower's
    GRPC_MAX_MESSAGE_LENGTH: a larger message travels as several objects). Above it a call is refused by gRPC before
    anyone reads it; up to it, the object reaches the per-message count that refuses it by name.

    Args:
        max_message_mb: the message bound, in MiB; > 0.

    Returns:
        The bytes.
    """
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.supercore.grpc import GRPC_MAX_MESSAGE_LENGTH

    largest = max(int(max_message_mb * 2**20), FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE) + OBJECT_OVERHEAD_BYTES
    return min(largest, GRPC_MAX_MESSAGE_LENGTH)


def pull_backoff() -> float:
    """The first retry's wait of an object pull: FEDBAYES_PULL_BACKOFF, else DEFAULT_BACKOFF.

    Returns:
        The seconds, in (0, 1].

    Raises:
        ValueError: the variable is no number, or outside (0, 1].
    """
    return seconds_from_env("FEDBAYES_PULL_BACKOFF", DEFAULT_BACKOFF, 1.0)


def shorten_pull_backoff() -> bool:
    """Set the first retry of Flower's object pulls in this process to `pull_backoff()`; False (and nothing
    changed) on a Flower other than the one this was read in.

    Returns:
        Whether Flower's pulls were changed.

    Raises:
        ValueError: FEDBAYES_PULL_BACKOFF is refused (`pull_backoff`).
    """
    from flwr.supercore.inflatable import inflatable_utils

    if not flower_is_patched():
        return False
    backoff = pull_backoff()
    for function in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        defaults = function.__kwdefaults__
        assert defaults is not None  # both take keyword-only arguments (Flower 1.39.0, checked above)
        defaults["initial_backoff"] = backoff
    return True


def bound_reply_pulls(grid, max_payload_mb: float) -> bool:
    """Make `grid` (the ServerApp's, Flower's HttpGrid) stop pulling a reply whose objects pass `max_payload_mb` MiB
    plus OBJECT_OVERHEAD_BYTES, and release that reply on the SuperLink as taking it would have (else the SuperLink
    would keep its objects until the run ends). False (and nothing changed) for another grid (simulation's pulls
    nothing over a network) or a Flower other than the one this was read in. Calling it again replaces the bound.

    Args:
        grid: the ServerApp's grid.
        max_payload_mb: the run's max-payload-mb, in MiB.

    Returns:
        Whether the grid's pulls were bounded.
    """
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.superlink.grid import http_grid

    if not flower_is_patched() or not isinstance(grid, http_grid.HttpGrid):
        return False

    def release(message_id: str) -> None:  # what HttpGrid.pull_messages sends once it has taken a reply
        grid._runtime_client.ConfirmMessageReceived(
            ConfirmMessageReceivedRequest(node=grid.node, run_id=grid.run.run_id, message_object_id=message_id)
        )

    limit = message_bytes_limit(max_payload_mb)
    http_grid.pull_objects = bounded_pulls(inflatable_utils.pull_objects, limit, max_payload_mb, release)
    return True


def bounded_pulls(
    pull_objects: Callable[..., dict[str, bytes]], limit: int, max_payload_mb: float, release: Callable[[str], None]
) -> Callable[..., dict[str, bytes]]:
    """Flower's `pull_objects` for one message (its object ids in post-order: the message's own id last), raising
    ObjectPullError (which stops its other pulls) as soon as the objects pulled for it pass `limit` bytes; that
    message is then `release`d.

    Args:
        pull_objects: Flower's `pull_objects(object_ids, pull_object_fn, **options)`.
        limit: the most bytes of objects one message may have pulled.
        max_payload_mb: the bound in MiB, for the error's message.
        release: `release(message_id)`: tell the SuperLink the message over the bound is taken.

    Returns:
        A function with `pull_objects`' signature; its ObjectPullError names the object and how much was pulled.
    """
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError

    def pull_bounded(object_ids: list[str], pull_object_fn: Callable[[str], bytes], **options) -> dict[str, bytes]:
        pulled, over, lock = [0], threading.Event(), threading.Lock()  # objects are pulled on several threads

        def pull_counted(object_id: str) -> bytes:
            content = pull_object_fn(object_id)
            with lock:
                pulled[0] += len(content)
                total = pulled[0]
            if total > limit:
                over.set()
                raise ObjectPullError(
                    object_id,
                    f"the reply is over max-payload-mb={max_payload_mb:g}: "
                    f"{total / 2**20:.1f} MiB of its objects pulled, the rest not",
                )
            return content

        try:
            return pull_objects(object_ids, pull_counted, **options)
        except ObjectPullError:
            if over.is_set():
                release(object_ids[-1])
            raise

    return pull_bounded
