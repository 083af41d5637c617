"""Patches of Flower's SuperNode loop (flwr/supernode/start_client_internal.py), for `fedbayes supernode`
(deploy/supernode.py, which says why): its idle sleeps shortened (`polling_time`), a stopped run's message dropped
(`dropping_stopped_runs`), an instruction over --max-message-mb refused while it is pulled
(`refusing_oversize_instructions`, `bounding_fleet_calls`), a doorbell rung when it takes a message (`ringing`), a
self-registered node's key on P-256 (`signing_with_p256`). docs/reference/flower-patches.md has each one's upstream
counterpart."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from logging import INFO
from types import SimpleNamespace
from typing import TYPE_CHECKING

from fedbayes.flowerseam.object_pulls import call_bytes_limit, shorten_pull_backoff
from fedbayes.flowerseam.version import require_patched_flower
from fedbayes.tasks.message_limits import MAX_MESSAGE_OPTION, message_bytes_limit

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import ec

FLOWER_WAITS = (3, 0.5)  # the idle sleep between pulls, and the wait for a reply or an object
IDLE_GROWTH, IDLE_CAP = 1.5, 1.0  # idle polls of the SuperLink back off by this factor, up to this many seconds


def polling_time(poll: float) -> SimpleNamespace:
    """The `time` module as Flower's SuperNode loop sees it: its fixed waits become `poll`, nothing else changes,
    except that consecutive idle waits (nothing pulled from the SuperLink) grow by IDLE_GROWTH up to IDLE_CAP
    (or `poll`, if larger). Waiting for a ClientApp's reply (a message was pulled) resets them to `poll`: a node
    asks quickly right after its reply, when the next round's instruction is due, and about once a second while
    the federation has no work for it (ten idle nodes polling 5 times a second used a quarter of a 2-core machine).

    Args:
        poll: seconds; Flower's 3 s idle sleep and 0.5 s reply wait become it.

    Returns:
        The stand-in for the `time` module (`time_with_sleep`).
    """
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
    """The `time` module, but with this `sleep`: handed to one Flower module as its `time`.

    Args:
        sleep: the `sleep(seconds)` to use.

    Returns:
        A namespace of the `time` module's public functions, `sleep` replaced.
    """
    functions = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    return SimpleNamespace(**{**functions, "sleep": sleep})


def ringing(pull_and_store: Callable[..., int | None], ring: Callable[[], None]) -> Callable[..., int | None]:
    """Flower's `_pull_and_store_message`, calling `ring` (the executor's doorbell, deploy/doorbell.py) once it has
    taken a message (it returns the message's run id then).

    Args:
        pull_and_store: Flower's `_pull_and_store_message` (or a patch of it).
        ring: called once for each message taken.

    Returns:
        A function with its signature and answer.
    """

    def pull_store_and_ring(*args, **kwargs) -> int | None:
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            ring()
        return run_id

    return pull_store_and_ring


def dropping_stopped_runs(pull_and_store: Callable[..., int | None]) -> Callable[..., int | None]:
    """Flower's `_pull_and_store_message`, leaving nothing behind of a message whose run the SuperLink says is not
    running (RunNotRunningException) while the SuperNode takes it.

    Flower 1.39 stores the message and creates its ClientApp task before it pulls the message's objects and confirms
    it. A RunNotRunningException there (a BaseException: it passes the cleanup of Flower's `except Exception`) is
    logged as "Run ID ... is not in `RUNNING` status. Ignoring message ...", but the message and its task stay, and
    the loop, given None, does not wait for a reply. The executor still runs the task, and the ClientApp's reply, to
    a run the SuperLink no longer takes, is what the loop pushes after the *next* message it pulls (it waits for any
    one reply, then pulls again; it pushes nothing while it pulls nothing). From then on each of this SuperNode's
    replies goes out one instruction late, and the server drops the client from every round for round-timeout, until
    the SuperNode restarts. A server machine that dies as a SuperNode takes an instruction, then the dead run stopped
    (`flwr stop`, docs/running/checkpoints.md) before the SuperNode's confirmation gets through, does exactly that.

    Here, after such a call: the task created for the message is finished as STOPPED (which also revokes its token,
    so a ClientApp already running it can push nothing), and the message and any reply of its run still waiting to
    be pushed are deleted with their objects: the SuperLink would refuse all of them.

    Args:
        pull_and_store: Flower's `_pull_and_store_message` (or a patch of it), called with keyword arguments.

    Returns:
        A function with its signature and answer.
    """

    from flwr.supercore.run import RunNotRunningException

    def pull_and_store_or_drop(**kwargs) -> int | None:
        state = kwargs["state"]
        taken: list = []  # the message received by this call, and the ids of its run's tasks from before it
        stopped: list[bool] = []

        def receive() -> tuple | None:
            received = kwargs["receive"]()
            if received is not None:
                run_id = received[0].metadata.run_id
                taken[:] = [received[0], {task.task_id for task in state.get_tasks(run_ids=[run_id])}]
            return received

        def noting(call: Callable) -> Callable:
            def call_and_note(*args):
                try:
                    return call(*args)
                except RunNotRunningException:
                    stopped.append(True)  # maybe in one of pull_objects' threads: list.append is atomic
                    raise

            return call_and_note

        watched = ("get_run", "get_fab", "pull_object", "confirm_message_received")
        run_id = pull_and_store(**{**kwargs, "receive": receive, **{name: noting(kwargs[name]) for name in watched}})
        if run_id is None and stopped and taken:
            drop_stopped_message(state, kwargs["object_store"], *taken)
        return run_id

    return pull_and_store_or_drop


def drop_stopped_message(state, object_store, message, tasks_before: set[int]) -> None:
    """Finish the ClientApp task created for `message` (any task of its run not in `tasks_before`) as STOPPED, and
    delete the message and its run's replies not yet pushed, with their objects, from the SuperNode's state.

    Args:
        state: the SuperNode's state.
        object_store: its object store.
        message: the message taken for the run that is not running.
        tasks_before: the ids of the run's tasks from before the message was taken.
    """
    from flwr.common import log
    from flwr.common.constant import Status, SubStatus

    run_id, message_id = message.metadata.run_id, message.metadata.message_id
    tasks = [
        task.task_id
        for task in state.get_tasks(run_ids=[run_id])
        if task.task_id not in tasks_before and task.status.status != Status.FINISHED
    ]
    for task_id in tasks:
        state.finish_task(task_id, sub_status=SubStatus.STOPPED, details=f"run {run_id} is not running")
    replies = [reply.metadata.message_id for reply in state.get_messages(run_ids=[run_id], is_reply=True)]
    state.delete_messages(message_ids=[message_id, *replies])
    for object_id in (message_id, *replies):
        object_store.delete(object_id)
    log(
        INFO,
        "run %s is not running: dropped message %s, its %d task(s) and %d reply(ies) of the run, so that no "
        "ClientApp answers it and this SuperNode's next reply answers its next message",
        run_id,
        message_id,
        len(tasks),
        len(replies),
    )


def refusing_oversize_instructions(
    pull_and_store: Callable[..., int | None], max_message_mb: float
) -> Callable[..., int | None]:
    """Flower's `_pull_and_store_message`, stopping the pull of an instruction once its objects pass
    `message_bytes_limit(max_message_mb)` bytes, and answering it with an error reply that names the limit.

    Flower 1.39 pulls every object of the message it takes into memory, then stores them. Here an object that takes
    the message past the limit raises ObjectPullError, which stops Flower's other pulls; Flower then logs "Failed to
    receive message", drops the message and fails its task. This then stores the error reply that Flower's loop pushes
    next, as it does its own FAB-verification error reply. It does not confirm the message to the SuperLink, as
    Flower does not after a failed pull: the ServerApp may still be pushing the message's objects, and a confirmed
    message's are dropped, which failed that push and ended the run.

    Args:
        pull_and_store: Flower's `_pull_and_store_message` (or a patch of it), called with keyword arguments.
        max_message_mb: the SuperNode's --max-message-mb, in MiB.

    Returns:
        A function with its signature; for a refused instruction it returns the instruction's run id (the error reply
        is then pushed), else Flower's answer.
    """
    from flwr.app import Error, Message
    from flwr.common.constant import ErrorCode
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError
    from flwr.supernode.start_client_internal import _insert_message

    limit = message_bytes_limit(max_message_mb)

    def pull_and_store_bounded(**kwargs) -> int | None:
        taken: list = []  # the message received by this call
        refusal: list[str] = []
        pulled, lock = [0], threading.Lock()  # objects are pulled on several threads

        def receive() -> tuple | None:
            received = kwargs["receive"]()
            if received is not None:
                taken.append(received[0])
            return received

        def pull_counted(run_id: int, object_id: str) -> bytes:
            content = kwargs["pull_object"](run_id, object_id)
            with lock:
                pulled[0] += len(content)
                total = pulled[0]
            if total > limit:
                reason = (
                    f"the SuperNode refused the instruction: it is over {MAX_MESSAGE_OPTION}={max_message_mb:g} "
                    f"({total / 2**20:.1f} MiB of its objects pulled, the rest not)"
                )
                refusal.append(reason)
                raise ObjectPullError(object_id, reason)
            return content

        run_id = pull_and_store(**{**kwargs, "receive": receive, "pull_object": pull_counted})
        if run_id is not None or not refusal or not taken:
            return run_id
        message = taken[0]
        error = Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason=refusal[0])
        _insert_message(Message(error, reply_to=message), kwargs["state"], kwargs["object_store"])
        return message.metadata.run_id  # Flower's loop pushes the error reply next

    return pull_and_store_bounded


def bounding_fleet_calls(start_client_internal, max_message_mb: float) -> None:
    """The SuperNode's channel to the Fleet API carries calls of up to `call_bytes_limit(max_message_mb)` instead
    of 2 GiB - 1: `_init_connection` reads the module's GRPC_MAX_MESSAGE_LENGTH when it connects.

    Args:
        start_client_internal: Flower's `flwr.supernode.start_client_internal` module.
        max_message_mb: the SuperNode's --max-message-mb, in MiB.
    """
    start_client_internal.GRPC_MAX_MESSAGE_LENGTH = call_bytes_limit(max_message_mb)


def p256_key_pair() -> tuple[ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey]:
    """A fresh ECDSA key pair on NIST P-256.

    Returns:
        The private key and its public key.
    """
    from cryptography.hazmat.primitives.asymmetric import ec

    private_key = ec.generate_private_key(ec.SECP256R1())
    return private_key, private_key.public_key()


def signing_with_p256(connection) -> None:
    """A self-registered SuperNode (no --auth-supernode-private-key) makes its key pair with `p256_key_pair`, not
    Flower's `generate_key_pairs` (P-384): the SuperLink verifies the signature of every Fleet call, and P-256's
    verification costs it about a quarter of P-384's. A key the operator gives is used as it is.

    Args:
        connection: Flower's `flwr.client.grpc_rere_client.connection` module, whose `grpc_request_response` makes
            the pair when it is given none.
    """
    connection.generate_key_pairs = p256_key_pair


def patch_supernode(poll: float, ring: Callable[[], None] | None = None, max_message_mb: float | None = None) -> None:
    """Flower's SuperNode loop without its idle sleeps (`polling_time`), dropping a stopped run's message
    (`dropping_stopped_runs`), calling `ring` when it takes a message (if given), refusing an instruction over
    `max_message_mb` (if given), its object pulls' first back-off shortened (`shorten_pull_backoff`), and a
    self-registered node's key on P-256 (`signing_with_p256`).

    Args:
        poll: seconds the loop waits where Flower waits 3 s idle or 0.5 s for a reply.
        ring: called once a message is taken (the executor's doorbell), or None.
        max_message_mb: the bound on an instruction's size, or None for Flower's.

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    from flwr.client.grpc_rere_client import connection
    from flwr.supernode import start_client_internal

    require_patched_flower("fedbayes supernode", "SuperNode loop", "flower-supernode")
    signing_with_p256(connection)
    # a stand-in for the time module, its sleep remapped (polling_time): no ModuleType, but all Flower's loop uses
    start_client_internal.time = polling_time(poll)  # type: ignore[assignment]
    pull_and_store = dropping_stopped_runs(start_client_internal._pull_and_store_message)
    if max_message_mb is not None:
        bounding_fleet_calls(start_client_internal, max_message_mb)
        pull_and_store = refusing_oversize_instructions(pull_and_store, max_message_mb)
    if ring is not None:
        pull_and_store = ringing(pull_and_store, ring)
    start_client_internal._pull_and_store_message = pull_and_store
    shorten_pull_backoff()  # the instruction's objects, pulled while the ServerApp still uploads them


def runtime_port(argv: list[str]) -> int:
    """The Runtime API port `flower-supernode` will serve with these arguments (its `--port`).

    Args:
        argv: `flower-supernode`'s arguments.

    Returns:
        The port; Flower's default without `--port`.

    Raises:
        SystemExit: `--port` is not an integer (argparse's usage error).
    """
    from flwr.supercore.constant import SUPERNODE_UVICORN_DEFAULT_PORT

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    return parser.parse_known_args(argv)[0].port


# What a SuperNode imports of Flower; the SuperNodes' fork server imports them once, before it forks
SUPERNODE_MODULES = ("flwr.supernode.start_client_internal", "flwr.supernode.cli")


def run_flower_supernode(argv: list[str]) -> Callable[[], None]:
    """Flower's `flower-supernode` entry point, set to run with `argv` as its arguments.

    Args:
        argv: the arguments for `flower-supernode`.

    Returns:
        The function that runs it (the caller decides how the process ends).
    """
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    return flower_supernode
