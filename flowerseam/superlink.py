"""Patches of Flower's SuperLink, for `fedbayes superlink` (deploy/superlink.py, which says why): its log stream's
interval and its database's lock wait (`patch_log_stream_and_database`), replies bounded at --max-message-mb
(`bound_messages`: `ReplyBound`, `counting_reply_objects`, `holding_back_unfinished_replies`), its in-memory state's
instruction polls indexed by node (`index_instructions_by_node`), the Control API's middlewares passing Runtime API
requests through (`passing_runtime_requests_through`), and gRPC's pending-call limits raised
(`queueing_pending_calls`). docs/reference/flower-patches.md has each one's upstream counterpart."""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fedbayes.flowerseam.messages import assign_message_id
from fedbayes.flowerseam.object_pulls import call_bytes_limit
from fedbayes.flowerseam.version import require_patched_flower
from fedbayes.tasks.message_limits import MAX_MESSAGE_OPTION, message_bytes_limit

WHO, INSTEAD = "fedbayes superlink", "flower-superlink"  # for the version gate's message


@dataclass
class ReplyPush:
    """A reply a SuperNode is pushing (one Flower push session): whose it is, what of it the SuperLink holds."""

    session_id: str
    node_id: int
    reply: Any  # the reply's flwr Metadata, as the SuperNode registered it
    pending: set[str]  # ids of its objects not stored yet
    stored_bytes: int = 0  # of its objects stored or being stored
    refused: bool = False
    stand_in: Any = None  # the error reply (a flwr Message) that stands in for it once refused
    touched: float = field(default_factory=time.monotonic)


class ReplyBound:
    """Which replies the SuperLink is still receiving, and how many bytes of each it holds: an object that would
    take a reply past `message_bytes_limit(max_message_mb)` is refused, and so is every later one of that reply.
    A reply stays held back from the ServerApp until it is whole, or, refused, until its stand-in is handed out.
    A push untouched for `stale_seconds` (Flower's push-session lifetime: Flower refuses its objects by then) is
    forgotten. Thread-safe: the Fleet and Runtime APIs serve calls on several threads."""

    def __init__(self, max_message_mb: float, stale_seconds: float) -> None:
        """A bound that holds no push yet.

        Args:
            max_message_mb: the SuperLink's --max-message-mb, in MiB.
            stale_seconds: after how long untouched a push is forgotten.
        """
        self.max_message_mb = max_message_mb
        self.limit = message_bytes_limit(max_message_mb)
        self.stale_seconds = stale_seconds
        self.lock = threading.Lock()
        # Held while Flower stores a reply's registration and the bound records it, and while Flower answers the
        # ServerApp's ask for replies: else an ask already past `sort` could be handed a reply registered meanwhile.
        self.handover = threading.Lock()
        self.by_session: dict[str, ReplyPush] = {}
        self.by_instruction: dict[str, ReplyPush] = {}

    def started(self, session_id: str, node_id: int, reply: Any, pending: list[str]) -> None:
        """A SuperNode registered `reply` (its Metadata) and is to push the objects `pending`; with none to push it
        is whole already.

        Args:
            session_id: the push session Flower opened for it.
            node_id: the SuperNode's node id.
            reply: the reply's Metadata.
            pending: the ids of the objects it is to push.
        """
        with self.lock:
            self._forget_stale()
            if pending:
                push = ReplyPush(session_id, node_id, reply, set(pending))
                self.by_session[session_id] = push
                self.by_instruction[reply.reply_to_message_id] = push

    def reserve(self, session_id: str, size: int) -> tuple[ReplyPush | None, bool]:
        """Before an object of `size` bytes of push `session_id` is stored: (the push, whether the object is
        refused), counting the object's bytes if not; (None, False) for an object of no reply push held here.

        Args:
            session_id: the object's push session.
            size: the object's bytes.

        Returns:
            The push (None: none held here) and whether the object is refused; a refusal marks the push refused.
        """
        with self.lock:
            push = self.by_session.get(session_id)
            if push is None:
                return None, False
            push.touched = time.monotonic()
            if push.refused or push.stored_bytes + size > self.limit:
                push.refused = True
                return push, True
            push.stored_bytes += size
            return push, False

    def settle(self, push: ReplyPush, object_id: str, size: int, stored: bool) -> None:
        """The object `reserve` let through was stored, or not (its bytes no longer count then). A push with no
        object pending is whole: the ServerApp may take it.

        Args:
            push: what `reserve` returned.
            object_id: the object's id.
            size: the object's bytes, as reserved.
            stored: whether Flower stored it.
        """
        with self.lock:
            if not stored:
                push.stored_bytes -= size
                return
            push.pending.discard(object_id)
            if not push.pending and not push.refused:
                self._forget(push)

    def stand_in(self, push: ReplyPush, error_reply: Any) -> None:
        """The error reply the ServerApp gets in place of refused `push`.

        Args:
            push: a refused push.
            error_reply: the error reply (`refuse_reply`).
        """
        with self.lock:
            push.stand_in = error_reply

    def sort(self, instruction_ids: list[str], run_id: int) -> tuple[list[str], list[Any]]:
        """Of the instructions whose replies the ServerApp of run `run_id` asks for: (those Flower may answer,
        the stand-ins for refused replies, each handed out once). A reply still being pushed is in neither.

        Args:
            instruction_ids: the instructions whose replies are asked for.
            run_id: the asking ServerApp's run.

        Returns:
            The instruction ids Flower may answer, in the given order, and the stand-ins handed out now.
        """
        with self.lock:
            self._forget_stale()
            answerable, stand_ins = [], []
            for instruction_id in instruction_ids:
                push = self.by_instruction.get(instruction_id)
                if push is None or push.reply.run_id != run_id:
                    answerable.append(instruction_id)
                elif push.stand_in is not None:
                    stand_ins.append(push.stand_in)
                    del self.by_instruction[instruction_id]  # its session stays: its later objects are refused
            return answerable, stand_ins

    def refusal(self, push: ReplyPush, size: int) -> str:
        """Why an object of `size` bytes of `push` was refused.

        Args:
            push: the refused push.
            size: the refused object's bytes.

        Returns:
            The reason, one line, naming the node, the bound and the MiB sent.
        """
        arrived = (push.stored_bytes + size) / 2**20
        return (
            f"the SuperLink refused the reply of node {push.node_id}: it is over {MAX_MESSAGE_OPTION}="
            f"{self.max_message_mb:g} ({arrived:.1f} MiB of its objects sent, the rest not taken); the run's "
            f"max-payload-mb must not be above the SuperLink's {MAX_MESSAGE_OPTION}"
        )

    def _forget(self, push: ReplyPush) -> None:
        self.by_session.pop(push.session_id, None)
        if self.by_instruction.get(push.reply.reply_to_message_id) is push:
            del self.by_instruction[push.reply.reply_to_message_id]

    def _forget_stale(self) -> None:
        oldest = time.monotonic() - self.stale_seconds
        for push in [push for push in self.by_session.values() if push.touched < oldest]:
            self._forget(push)


def refuse_reply(state: Any, push: ReplyPush, reason: str) -> Any:
    """Drop what the SuperLink `state` holds of refused `push` (the reply, the instruction it answers, the objects
    stored of it) and store, as Flower stores the error replies it makes for a node, an error reply for that
    instruction naming `reason`; that error reply (a flwr Message).

    Args:
        state: the SuperLink's link state.
        push: the refused push.
        reason: the error's reason (`ReplyBound.refusal`).

    Returns:
        The error reply stored.
    """
    from flwr.app import Error, Metadata
    from flwr.app.message import make_message
    from flwr.common.constant import ErrorCode
    from flwr.supercore.date import now

    reply = push.reply
    state.delete_messages(message_ins_ids={reply.reply_to_message_id})
    state.object_store.delete(reply.message_id)
    metadata = Metadata(
        run_id=reply.run_id,
        message_id="",
        src_node_id=push.node_id,
        dst_node_id=reply.dst_node_id,
        reply_to_message_id=reply.reply_to_message_id,
        group_id=reply.group_id,
        message_type=reply.message_type,
        created_at=now().timestamp(),
        ttl=reply.ttl,
    )
    error_reply = make_message(metadata=metadata, error=Error(code=ErrorCode.REPLY_MESSAGE_UNAVAILABLE, reason=reason))
    assign_message_id(error_reply, error_reply.object_id)  # as Flower names the errors it makes
    state._store_generated_message(error_reply)
    return error_reply


def registering_reply_pushes(push_messages: Callable, bound: ReplyBound) -> Callable:
    """Flower's FleetServicer.PushMessages (a SuperNode registers its reply and is told which objects to push),
    telling `bound` of the reply and the objects it will count.

    Args:
        push_messages: Flower's FleetServicer.PushMessages.
        bound: the reply bound.

    Returns:
        A PushMessages with the same signature and answer.
    """

    def push_messages_registered(servicer, request, context):
        from flwr.common.serde import message_from_proto

        with bound.handover:
            response = push_messages(servicer, request, context)
            reply = message_from_proto(request.messages_list[0]).metadata  # Flower took the first, and only, message
            bound.started(response.session_id, request.node.node_id, reply, list(response.objects_to_push))
        return response

    return push_messages_registered


def counting_reply_objects(push_object: Callable, bound: ReplyBound) -> Callable:
    """Flower's FleetServicer.PushObject (stores one object a SuperNode pushes), refusing, before it is stored, an
    object that takes its reply past `bound`: the reply is refused then (`refuse_reply`) and the call aborted with
    RESOURCE_EXHAUSTED, which the SuperNode logs and gives up the reply for.

    Args:
        push_object: Flower's FleetServicer.PushObject.
        bound: the reply bound.

    Returns:
        A PushObject with the same signature; Flower's answer for the objects it lets through.
    """
    import grpc

    def push_object_counted(servicer, request, context):
        size = len(request.object_content)
        push, refused = bound.reserve(request.session_id, size)
        if push is None:
            return push_object(servicer, request, context)
        if refused:
            reason = bound.refusal(push, size)
            if push.stand_in is None:
                bound.stand_in(push, refuse_reply(servicer.state_factory.state(), push, reason))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        stored = False
        try:
            response = push_object(servicer, request, context)
            stored = response.stored
            return response
        finally:
            bound.settle(push, request.object_id, size, stored)

    return push_object_counted


def holding_back_unfinished_replies(pull_messages: Callable, bound: ReplyBound) -> Callable:
    """Flower's Runtime API `pull_messages` (the ServerApp asks for the replies to its instructions), answering
    only for replies whose objects are all stored, and with the stand-ins of refused ones.

    Args:
        pull_messages: Flower's Runtime API handler `pull_messages(request, state, task)`.
        bound: the reply bound.

    Returns:
        A handler with the same signature; its answer holds the whole replies asked for, then the stand-ins.
    """

    def pull_whole_messages(request, state, task):
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesRequest
        from flwr.supercore.inflatable.inflatable_object import get_object_tree

        with bound.handover:
            answerable, stand_ins = bound.sort(list(request.message_ids), task.run_id)
            response = pull_messages(PullAppMessagesRequest(message_ids=answerable), state, task)
        for error_reply in stand_ins:
            response.messages_list.append(message_to_proto(error_reply))
            response.message_object_trees.append(get_object_tree(error_reply))
        return response

    return pull_whole_messages


def bounding_fleet_calls(max_message_mb: float) -> None:
    """Flower's Fleet API server takes calls of up to `call_bytes_limit(max_message_mb)` instead of 2 GiB - 1:
    `_run_fleet_api_grpc_rere` reads the module's GRPC_MAX_MESSAGE_LENGTH when it creates the server.

    Args:
        max_message_mb: the SuperLink's --max-message-mb, in MiB.
    """
    flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")
    flower_superlink.GRPC_MAX_MESSAGE_LENGTH = call_bytes_limit(max_message_mb)  # type: ignore[attr-defined]


def bounding_replies(bound: ReplyBound) -> None:
    """Patch Flower's FleetServicer.PushMessages and PushObject and the Runtime API's `pull_messages` to keep `bound`
    (`registering_reply_pushes`, `counting_reply_objects`, `holding_back_unfinished_replies`).

    Args:
        bound: the reply bound.
    """
    from flwr.server.superlink.fleet.grpc_rere.fleet_servicer import FleetServicer
    from flwr.superlink.servicer.runtime import runtime_handlers

    FleetServicer.PushMessages = registering_reply_pushes(FleetServicer.PushMessages, bound)  # type: ignore[method-assign]
    FleetServicer.PushObject = counting_reply_objects(FleetServicer.PushObject, bound)  # type: ignore[method-assign]
    # the Runtime API's router looks the handler up in this module at every request
    runtime_handlers.pull_messages = holding_back_unfinished_replies(runtime_handlers.pull_messages, bound)


def patch_log_stream_and_database(interval: float, busy_timeout_ms: int) -> None:
    """A streamed log looks for new lines and the run's end every `interval` seconds (Flower: 0.5), and a request
    waits up to `busy_timeout_ms` for the SQLite database's lock (Flower: 5000).

    Args:
        interval: seconds between a streamed log's looks.
        busy_timeout_ms: SQLite's busy_timeout pragma.

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    from flwr.supercore import sql_mixin
    from flwr.superlink.servicer.control import control_handlers

    require_patched_flower(WHO, "log stream and database", INSTEAD)
    pragmas: dict[str, str] = dict(sql_mixin.SQLITE_PRAGMAS)
    control_handlers.LOG_STREAM_INTERVAL = interval  # read by _stream_logs at every look
    pragmas["busy_timeout"] = str(busy_timeout_ms)
    # read by _set_sqlite_pragmas at every new connection
    sql_mixin.SQLITE_PRAGMAS = tuple(pragmas.items())  # type: ignore[assignment]


def bound_messages(max_message_mb: float) -> ReplyBound:
    """Bound Flower's Fleet calls and replies at `max_message_mb` (`bounding_fleet_calls`, `bounding_replies`); the
    bound.

    Args:
        max_message_mb: the SuperLink's --max-message-mb, in MiB.

    Returns:
        The bound the patched servicers keep.

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    from flwr.supercore.constant import OBJECT_PUSH_SESSION_TTL_SECONDS

    require_patched_flower(WHO, f"Fleet and Runtime APIs ({MAX_MESSAGE_OPTION})", INSTEAD)
    bound = ReplyBound(max_message_mb, OBJECT_PUSH_SESSION_TTL_SECONDS)
    bounding_fleet_calls(max_message_mb)
    bounding_replies(bound)
    return bound


def index_instructions_by_node() -> None:
    """Every in-memory link state this SuperLink makes (its state without `--database`: `fedbayes local`) answers a
    node's PullMessages from an index of the undelivered instructions by node (fedbayes.flowerseam.simulation_polls
    `OwnMessages`, the one the simulation engine's link state gets), not by walking every stored instruction.

    Flower 1.39's `InMemoryLinkState.get_message_ins` checks every instruction in the store at every node's pull,
    under the state's lock, whichever node it is for, and a round's m instructions stay there until their replies are
    taken: with N nodes polling about once a second, N x m checks a second (docs/results/performance.md, "One
    SuperLink, many nodes"). Which instructions a pull returns, in which order, and their checks and delivery marks
    are Flower's.

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    from flwr.server.superlink.linkstate import InMemoryLinkState

    from fedbayes.flowerseam.simulation_polls import OwnMessages

    require_patched_flower(WHO, "in-memory link state", INSTEAD)
    flowers_init = InMemoryLinkState.__init__

    def init_indexed(state: InMemoryLinkState, *args, **kwargs) -> None:
        flowers_init(state, *args, **kwargs)
        state.get_message_ins = OwnMessages(state).get_message_ins  # type: ignore[method-assign]

    InMemoryLinkState.__init__ = init_indexed  # type: ignore[method-assign,assignment]


def passing_runtime_requests_through() -> None:
    """The Control API's four middlewares hand a request they have nothing to do for straight to the app below them,
    instead of through Starlette's BaseHTTPMiddleware (a task group, memory streams and a cached request per layer).

    Flower 1.39's SuperLink serves its Control and Runtime APIs from one FastAPI app whose every request passes six
    BaseHTTPMiddleware layers. Four are the Control API's: for a Runtime API request (the ServerApp's: each object
    of each instruction pushed and of each reply pulled is one) each only calls the next layer, at that layer's cost
    (docs/results/performance.md, "One SuperLink, many nodes"). Here each skips the request exactly when its own
    `dispatch` would only pass it on: not a Control path (authentication, license: also without a license plugin),
    not a sensitive Control route (no-cache headers), no event log plugin (event log). The error translation and the
    protobuf translation still see every request.

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    from fastapi import Request
    from flwr.superlink.routers.control import middlewares

    def off_control_paths(layer, request: Request) -> bool:
        return not middlewares._is_control_path(request.url.path)

    def not_sensitive(layer, request: Request) -> bool:
        return not middlewares._is_control_sensitive_route(request)

    def no_license_check(layer, request: Request) -> bool:
        return layer._license_plugin is None or off_control_paths(layer, request)

    def no_authentication(layer, request: Request) -> bool:
        return off_control_paths(layer, request) or middlewares._is_control_auth_route(request)

    def no_event_log(layer, request: Request) -> bool:
        return getattr(request.app.state, "control_event_log_plugin", None) is None

    passes = {
        "ControlSensitiveResponseMiddleware": not_sensitive,
        "ControlAuthenticationMiddleware": no_authentication,
        "ControlLicenseMiddleware": no_license_check,
        "ControlEventLogMiddleware": no_event_log,
    }
    require_patched_flower(WHO, "Control API middlewares", INSTEAD)
    for name, passes_through in passes.items():
        layer_class = getattr(middlewares, name)
        layer_class.__call__ = passing_through(layer_class.__call__, passes_through)


def passing_through(call, passes_through):
    """A BaseHTTPMiddleware's `__call__` that hands an HTTP request for which `passes_through(layer, request)` holds
    to the app below it, unchanged.

    Args:
        call: the layer's own `__call__(layer, scope, receive, send)`.
        passes_through: `passes_through(layer, request)`: whether the layer would only pass the request on.

    Returns:
        The new `__call__`; any other request (and every non-HTTP scope) goes through `call`.
    """
    from fastapi import Request

    async def call_or_pass(layer, scope, receive, send) -> None:
        if scope["type"] == "http" and passes_through(layer, Request(scope)):
            await layer.app(scope, receive, send)
        else:
            await call(layer, scope, receive, send)

    return call_or_pass


PENDING_CALLS_OPTION, PENDING_CALLS_HARD_OPTION = (
    "grpc.server.max_pending_requests",
    "grpc.server.max_pending_requests_hard_limit",
)


def queueing_pending_calls(soft_limit: int, hard_limit: int) -> None:
    """This SuperLink's gRPC servers (the Fleet API's) hold up to `soft_limit` calls that arrived before the server
    could take them, and drop calls only between `soft_limit` and `hard_limit`, instead of gRPC's 1,000 and 3,000.

    gRPC drops (cancels, at random, more often the longer the backlog) the calls that wait for a Python server busy
    with others once more than 1,000 wait. A SuperNode has up to two calls in flight (its pull and its heartbeat),
    so a thousand nodes or more reach that whenever the SuperLink falls behind, and Flower 1.39's SuperNode does not
    retry a CANCELLED call: it exits (docs/results/performance.md, "One SuperLink, many nodes"). A call that waits
    costs a few kilobytes; the SuperLink now answers late instead.

    Args:
        soft_limit: pending calls held before gRPC starts dropping some.
        hard_limit: pending calls past which it drops every new one.

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    import grpc

    require_patched_flower(WHO, "gRPC servers", INSTEAD)
    limits = [(PENDING_CALLS_OPTION, soft_limit), (PENDING_CALLS_HARD_OPTION, hard_limit)]
    grpcs_server = grpc.server

    def server_queueing_calls(*args, options=None, **kwargs) -> grpc.Server:
        return grpcs_server(*args, options=[*(options or ()), *limits], **kwargs)

    grpc.server = server_queueing_calls  # Flower's generic_create_grpc_server makes every server with it


def run_flower_superlink(argv: list[str]) -> Callable[[], None]:
    """Flower's `flower-superlink` entry point, set to run with `argv` as its arguments.

    Args:
        argv: the arguments for `flower-superlink`.

    Returns:
        The function that runs it (the caller decides how the process ends).
    """
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *argv]
    return flower_superlink
