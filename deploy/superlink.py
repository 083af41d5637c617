"""`fedbayes superlink`: Flower's own SuperLink, whose log stream ends sooner after its run and whose database waits
longer for its lock.

`flwr run --stream` (what `fedbayes run` and so `fedbayes local` wait on) ends when the SuperLink ends the run's log
stream, and Flower 1.39's SuperLink looks for new log lines and for the run's end every 0.5 s
(`LOG_STREAM_INTERVAL`, flwr/superlink/servicer/control/control_handlers.py): every run's command waited 0-0.5 s
after its ServerApp had ended (2026-11-28, 2-core machine: last row -> exit 0.8-1.5 s against the BayesADMM authors'
single process, 0.9-1.0 s). This entry point runs the same `flower-superlink` (same arguments and behaviour) with that
interval at `STREAM_INTERVAL`; a look is two reads of the SuperLink's state, only while a log is streamed. Once Flower
has stopped its servers the process ends without the interpreter's teardown (`exit_without_teardown`).

A SuperLink with `--database FILE` (TLS deployments, compose) keeps its state in SQLite, whose requests wait at most
5 s for the database's write lock (Flower's `busy_timeout` pragma); past that the request fails with "database is
locked", which Flower's SuperLink answers as a 500 (HTTP) or INTERNAL (gRPC). No Flower client retries those: the
ServerApp's poll that got it ended the run (a compose federation on a loaded CI machine, 2026-11-29), the ServerApp's
log uploader thread ends (the run's later lines never reach `flwr log`), and a SuperNode drops the instruction it was
receiving. Here requests wait up to `BUSY_TIMEOUT_MS` instead: a slow disk or a starved process delays the
federation rather than breaking it (tests/integration/test_superlink_busy.py holds the lock 8 s).

The patches are tied to the code they were read in: any Flower but 1.39.0 is refused rather than patched blindly.
"""

from __future__ import annotations

import sys

from fedbayes.deploy.processes import exit_without_teardown

PATCHED_FLOWER = "1.39.0"
STREAM_INTERVAL = 0.1  # seconds between a streamed log's looks for new lines and for the run's end (Flower: 0.5)
BUSY_TIMEOUT_MS = 60_000  # how long a request waits for the SQLite database's lock (Flower: 5000)


def patch_flower(interval: float, busy_timeout_ms: int) -> None:
    import flwr
    from flwr.supercore import sql_mixin
    from flwr.superlink.servicer.control import control_handlers

    pragmas: dict[str, str] = dict(getattr(sql_mixin, "SQLITE_PRAGMAS", ()))
    if (
        flwr.__version__ != PATCHED_FLOWER
        or not hasattr(control_handlers, "LOG_STREAM_INTERVAL")
        or "busy_timeout" not in pragmas
    ):
        raise SystemExit(
            f"fedbayes superlink patches Flower {PATCHED_FLOWER}'s log stream and database, but Flower "
            f"{flwr.__version__} is installed; use `flower-superlink` instead"
        )
    control_handlers.LOG_STREAM_INTERVAL = interval  # read by _stream_logs at every look
    pragmas["busy_timeout"] = str(busy_timeout_ms)
    # read by _set_sqlite_pragmas at every new connection
    sql_mixin.SQLITE_PRAGMAS = tuple(pragmas.items())  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    """Run `flower-superlink` with `argv` as its arguments; the process ends with it (`exit_without_teardown`)."""
    patch_flower(STREAM_INTERVAL, BUSY_TIMEOUT_MS)
    from flwr.superlink.cli import flower_superlink

    index_instructions_by_node()
    passing_runtime_requests_through()
    queueing_pending_calls(*PENDING_CALLS)

    sys.argv = ["flower-superlink", *argv]
    exit_without_teardown(flower_superlink)


def index_instructions_by_node() -> None:
    """Every in-memory link state this SuperLink makes (its state without `--database`: `fedbayes local`) answers a
    node's PullMessages from an index of the undelivered instructions by node (tasks/simulation_polls.py
    `OwnMessages`, the one the simulation engine's link state gets), not by walking every stored instruction.

    Flower 1.39's `InMemoryLinkState.get_message_ins` checks every instruction in the store at every node's pull,
    under the state's lock, whichever node it is for, and a round's m instructions stay there until their replies are
    taken: with N nodes polling about once a second, N x m checks a second (docs/results/performance.md, "One
    SuperLink, many nodes"). Which instructions a pull returns, in which order, and their checks and delivery marks
    are Flower's. SystemExit on a Flower other than the one this was read in."""
    import flwr
    from flwr.server.superlink.linkstate import InMemoryLinkState

    from fedbayes.tasks.simulation_polls import OwnMessages

    if flwr.__version__ != PATCHED_FLOWER or not hasattr(InMemoryLinkState, "get_message_ins"):
        raise SystemExit(
            f"fedbayes superlink patches Flower {PATCHED_FLOWER}'s in-memory link state, but Flower "
            f"{flwr.__version__} is installed; use `flower-superlink` instead"
        )
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
    protobuf translation still see every request. SystemExit on a Flower other than the one this was read in."""
    import flwr
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
    helpers = ("_is_control_path", "_is_control_sensitive_route", "_is_control_auth_route")
    if flwr.__version__ != PATCHED_FLOWER or not all(hasattr(middlewares, name) for name in (*passes, *helpers)):
        raise SystemExit(
            f"fedbayes superlink patches Flower {PATCHED_FLOWER}'s Control API middlewares, but Flower "
            f"{flwr.__version__} is installed; use `flower-superlink` instead"
        )
    for name, passes_through in passes.items():
        layer_class = getattr(middlewares, name)
        layer_class.__call__ = passing_through(layer_class.__call__, passes_through)


def passing_through(call, passes_through):
    """A BaseHTTPMiddleware's `__call__` that hands an HTTP request for which `passes_through(layer, request)` holds
    to the app below it, unchanged."""
    from fastapi import Request

    async def call_or_pass(layer, scope, receive, send) -> None:
        if scope["type"] == "http" and passes_through(layer, Request(scope)):
            await layer.app(scope, receive, send)
        else:
            await call(layer, scope, receive, send)

    return call_or_pass


# calls the Fleet API holds for a busy server before gRPC drops some, and before it drops all (gRPC: 1000, 3000)
PENDING_CALLS = (20_000, 40_000)
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
    costs a few kilobytes; the SuperLink now answers late instead. SystemExit on a Flower other than the one this was
    read in."""
    import flwr
    import grpc
    from flwr.supercore import grpc as flower_grpc

    if flwr.__version__ != PATCHED_FLOWER or not hasattr(flower_grpc, "generic_create_grpc_server"):
        raise SystemExit(
            f"fedbayes superlink patches Flower {PATCHED_FLOWER}'s gRPC servers, but Flower {flwr.__version__} is "
            "installed; use `flower-superlink` instead"
        )
    limits = [(PENDING_CALLS_OPTION, soft_limit), (PENDING_CALLS_HARD_OPTION, hard_limit)]
    grpcs_server = grpc.server

    def server_queueing_calls(*args, options=None, **kwargs) -> grpc.Server:
        return grpcs_server(*args, options=[*(options or ()), *limits], **kwargs)

    grpc.server = server_queueing_calls  # Flower's generic_create_grpc_server makes every server with it
