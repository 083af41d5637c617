"""`fedbayes superexec`: Flower's SuperExec for the SuperNodes of one machine (or for a SuperLink), but each ClientApp
(or ServerApp) task is a fork of a process that has already imported torch.

Flower runs every message in a fresh `flwr-clientapp` process. On these 2-core machines that process
spends ~1.2-3 s importing torch and another ~1.2-2 s importing torch._dynamo (every torch.optim
optimizer imports it on construction) before it trains for well under a second; with ten SuperNodes
that start-up is most of a round. This executor imports those libraries once, then forks one child
per task. The child runs Flower's own `run_clientapp` with the task's token, so the protocol, the app
loading from the FAB and the error handling are Flower's; only the process start is cheaper.

Use with `flower-supernode --isolation process`:

    fedbayes superexec --runtime-api-address 127.0.0.1:9094 --insecure --parent-pid <supernode pid>

Repeat `--runtime-api-address` and `--parent-pid` in pairs to serve several SuperNodes of the machine from this
one process (`fedbayes local` does, for every SuperNode it starts together): one loop asks each SuperNode for
work, so an idle client is its SuperNode alone, and the preloaded heap (torch: ~600 MiB RSS) is there once per
machine instead of once per client (benchmarks/memory.py). Serve several SuperNodes only where they belong to
one operator: their ClientApps are forks of one process. With `--parent-pid`, it stops serving a SuperNode when
that process exits (and stops the tasks it forked for it), and exits once it serves none.

The app's own modules are preloaded as well: the FAB carries only the run config, the code is the installed
`fedbayes` package, so the child finds `fedbayes.client.app` (and every built-in strategy) already imported.
Before the first fork the parent freezes its heap out of the garbage collector (`gc.freeze`), so a child's
collections do not walk, and thereby copy, the parent's millions of objects.

With `--app serverapp` it serves a SuperLink started with `--isolation process` instead (`fedbayes local` does):
Flower's SuperLink would start `flower-superexec`, which starts every run's ServerApp as a new `flwr-serverapp`
process, ~5.5 CPU-s of imports (torch, Flower's ServerApp runtime, our strategies) before the first round can be
sent. Here the ServerApp is a fork too, named `flwr-serverapp` in `ps` (as a ClientApp task is named
`flwr-clientapp`), running Flower's own `run_serverapp`. With `--supernodes-from-stdin` the same process serves
this machine's SuperNodes as well, named on its stdin once they have started: `fedbayes local` starts it beside the
SuperLink, so that the imports both sides share (torch) are done once, while everything else starts.

Between asks for a task it waits for the SuperNodes' doorbells (deploy/doorbell.py) rather than Flower's fixed
poll interval, heeding only the rings of each SuperNode's own process (with `--parent-pid`), at most one per
`RING_INTERVAL`.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from fedbayes.deploy.doorbell import HEARD_POLL, Doorbell
from fedbayes.deploy.processes import name_this_process
from fedbayes.flowerseam import executor as flower
from fedbayes.flowerseam.object_pulls import shorten_pull_backoff

# What a fedbayes ClientApp or ServerApp needs; importing it here is the whole point. Importing torch does not
# initialise CUDA, so each forked child still sets up its own GPU context. torch._dynamo (2+ s) is the ClientApps':
# every torch.optim optimizer imports it; of the ServerApps only FedPA's builds one.
SHARED_PRELOAD = ("numpy", "torch", "safetensors.torch")
PRELOAD = {
    "clientapp": (
        *SHARED_PRELOAD,
        "torch._dynamo",
        "ivon",
        *flower.RUNTIME_MODULES["clientapp"],
        "fedbayes.client.app",
    ),
    "serverapp": (*SHARED_PRELOAD, *flower.RUNTIME_MODULES["serverapp"], "fedbayes.server.app"),
}
TASK_TYPE = {"clientapp": "flwr-clientapp", "serverapp": "flwr-serverapp"}  # Flower's TaskType values
UNREACHABLE_RETRY = 1.0  # seconds before asking a SuperNode again whose Runtime API did not answer
ASK_TIMEOUT = 5.0  # seconds an ask may take (on this machine's loopback it takes milliseconds)
CLOSE_TIMEOUT = 10.0  # seconds the executor waits for its tasks to end when it stops (the launcher waits 15)
# Seconds between asks to a SuperLink while a ServerApp forked for it runs (`next_ask_in`): a second run submitted
# meanwhile starts up to this much later.
RUNNING_SERVERAPP_POLL = 2.0


def preload(apps: set[str]) -> None:
    """Import what every task of `apps` ("clientapp", "serverapp") needs, the built-in strategies' halves included,
    then freeze the heap so that forked children share it instead of copying it page by page.

    Args:
        apps: the tasks' kinds, keys of PRELOAD.
    """
    from fedbayes.strategies import BUILTIN

    for app in sorted(apps):
        for module in PRELOAD[app]:
            importlib.import_module(module)
        for algorithm in BUILTIN.values():  # every built-in strategy's half of this side
            algorithm.client_half() if app == "clientapp" else algorithm.server_half()
    shorten_pull_backoff()  # children pull the instruction from the SuperNode, maybe while it still receives it
    gc.collect()
    gc.freeze()


class Preloader:
    """The imports of `apps` not done yet, done on the first call (`preload`), nothing on later ones."""

    def __init__(self, apps: set[str]) -> None:
        self.pending = set(apps)

    def __call__(self) -> None:
        if self.pending:
            preload(self.pending)
            self.pending.clear()


class ForkExecutor:
    """An executor in the sense of `flwr.supercore.superexec.executor.Executor`: one forked child per task of
    one type (`task_type`: Flower's "flwr-clientapp" or "flwr-serverapp"), reaped between task polls and
    terminated when the SuperExec stops. `before_fork` and `after_fork` run in this process around each fork (a
    Preloader: the ClientApps' imports before their first fork, or right after a ServerApp's)."""

    def __init__(
        self,
        task_type: str,
        before_fork: Callable[[], None] = lambda: None,
        after_fork: Callable[[], None] = lambda: None,
    ) -> None:
        """An executor with no task yet.

        Args:
            task_type: the tasks it runs, a value of TASK_TYPE.
            before_fork: run in this process before each fork.
            after_fork: run in this process after each fork.
        """
        self.task_type = task_type
        self.before_fork, self.after_fork = before_fork, after_fork
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types, *, insecure=False, root_certificates_path=None):
        """Flower's Executor hook: the task types it can take now.

        Args:
            supported_task_types: the types the SuperExec's plugin supports.
            insecure: Flower passes it; unused (a fork needs no connection of its own here).
            root_certificates_path: Flower passes it; unused.

        Returns:
            ({this executor's type, if supported}, no FAB hashes: the executor keeps no apps of its own).
        """
        return {task_type for task_type in supported_task_types if task_type == self.task_type}, set()

    def wait_for_capacity(self, task_type=None, *, fab_hash=None, insecure=False, root_certificates_path=None) -> None:
        """Flower's Executor hook; forking has no capacity gate, so it returns at once.

        Args:
            task_type: unused.
            fab_hash: unused.
            insecure: unused.
            root_certificates_path: unused.
        """

    def launch(self, spec):
        """Flower's Executor hook: fork a child that runs the task with Flower's own runner.

        Args:
            spec: Flower's launch spec of the task: its type, Runtime API address, token, TLS settings and parent pid.

        Returns:
            Flower's launch result: accepted once the child is forked; failed for a task of another type.
        """
        if spec.task_type != self.task_type:
            return flower.launch_failed(
                f"this fedbayes superexec runs {self.task_type} tasks only, not {spec.task_type}"
            )
        self.before_fork()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _exit_after(lambda: _run_task(spec))
        self.children.add(pid)
        self.after_fork()
        return flower.launch_accepted()

    def reconcile(self) -> None:
        """Reap the tasks that have ended, without waiting for the others: a task can hang (one whose run was
        stopped while its SuperNode took the message), and the SuperNode's next message must still start."""
        for pid in list(self.children):
            finished_pid, _ = os.waitpid(pid, os.WNOHANG)
            if finished_pid:
                self.children.discard(pid)

    def close(self, timeout: float = 0.0) -> None:
        """TERM the tasks and wait for them, at most `timeout` seconds: when this process stops (CLOSE_TIMEOUT), since a
        task sees it end as its cue to stop at once (Flower's parent monitor), which would cut short a ServerApp's
        own shutdown, where it writes the checkpoint of the round it has just logged. Not when one SuperNode has
        exited: the loop goes on serving the others.

        Args:
            timeout: seconds to wait for the tasks to end; 0: none (ended ones are still reaped).
        """
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        self.reconcile()  # ended tasks cost no wait: a 0.05 s sleep per executor was 0.55 s of a 10-client run's exit
        while self.children and time.monotonic() < deadline:
            time.sleep(0.05)
            self.reconcile()


def _run_task(spec) -> None:
    """Child side of the fork: run one ClientApp or ServerApp task with Flower's own runner, as its
    `flwr-clientapp` or `flwr-serverapp` command would."""
    flower.forget_exit_handlers()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    name_this_process(spec.task_type)
    connection = {
        "runtime_api_address": spec.runtime_api_address,
        "token": spec.token,
        "insecure": spec.insecure,
        "certificates": flower.root_certificates(spec.root_certificates_path, spec.insecure),
        "parent_pid": spec.parent_pid,
        "runtime_dependency_install": False,
    }
    if spec.task_type == TASK_TYPE["serverapp"]:
        flower.run_serverapp_task(connection)
    else:
        flower.run_clientapp_task(connection)


def _exit_after(body: Callable[[], object]) -> NoReturn:
    """In a forked child: run `body`, then leave through os._exit with its exit status (0, a SystemExit's code,
    or 1 for any other exception, printed), never returning into the parent's code."""
    exit_code = 1
    try:
        body()
        exit_code = 0
    except SystemExit as stop:  # Flower's runners end with flwr_exit -> sys.exit
        exit_code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - report anything, then leave through os._exit below
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)


def next_ask_in(poll: float, bell_heard: bool, serverapp_running: bool) -> float:
    """Seconds until the next ask: `poll` (Flower's FLWR_SUPEREXEC_TASK_POLL_INTERVAL), HEARD_POLL once the
    SuperNode's bell has been heard (it rings for each task, deploy/doorbell.py), and RUNNING_SERVERAPP_POLL for a
    SuperLink while a ServerApp forked for it runs. A SuperLink hands out one ServerApp task per run, and no bell
    rings for it, so asking every `poll` while the run's ServerApp runs found nothing: five HTTP requests a second
    through the SuperLink's middleware, which its main thread serves beside the ServerApp's own polls.

    Args:
        poll: Flower's task poll interval, in seconds.
        bell_heard: whether this SuperNode's doorbell has rung.
        serverapp_running: whether a ServerApp forked for this SuperLink still runs.

    Returns:
        The seconds.
    """
    if bell_heard:
        return HEARD_POLL
    return RUNNING_SERVERAPP_POLL if serverapp_running else poll


class ServedRuntime:
    """One SuperNode (or SuperLink, for `app="serverapp"`) this executor serves: its Runtime API, the tasks forked
    for it, its doorbell (a SuperNode's), its process (if given), and when to ask it for work next."""

    def __init__(
        self,
        address: str,
        parent_pid: int | None,
        insecure: bool,
        root_certificates: str | None,
        poll: float,
        app: str = "clientapp",
        executor: ForkExecutor | None = None,
    ) -> None:
        """Make its Runtime API client (no call yet) and, for a SuperNode, its doorbell.

        Args:
            address: its Runtime API, host:port.
            parent_pid: its process, whose exit ends serving it; None: not watched.
            insecure: plain HTTP to the Runtime API.
            root_certificates: the CA bundle of the Runtime API's certificate (with TLS).
            poll: Flower's task poll interval, in seconds.
            app: "clientapp" (a SuperNode) or "serverapp" (a SuperLink).
            executor: the one forking its tasks (default: a ForkExecutor for `app`'s tasks).

        Raises:
            ValueError: Flower refuses the CA file.
            OSError: `parent_pid` is gone.
        """
        self.address, self.poll, self.app = address, poll, app
        self.name = f"the {'SuperNode' if app == 'clientapp' else 'SuperLink'} at {address}"  # for messages
        self.executor = executor or ForkExecutor(TASK_TYPE[app])
        flower.root_certificates(root_certificates, insecure)  # Flower's error for a missing CA file
        # No retry invoker (Flower's retries a call for as long as it fails) and a short timeout: one SuperNode that
        # is not up, or hangs, must not stop this loop from serving the others.
        self.client = flower.runtime_client(address, insecure, root_certificates, ASK_TIMEOUT)
        # Flower's own plugin turns an acquired task into the launch spec our executor forks for.
        self.plugin = flower.exec_plugin(address, insecure, root_certificates, self.executor)
        self.bell = _doorbell(address, parent_pid) if app == "clientapp" else None  # a SuperLink never rings
        self.process = None if parent_pid is None else os.pidfd_open(parent_pid)  # readable once it has exited
        self.next_ask = 0.0
        self.unreachable: str | None = None

    def waitables(self) -> list:
        """What the loop selects on for it: its doorbell while it listens, and its process (readable once it exited).

        Returns:
            The socket and process fd that apply.
        """
        bell = self.bell.socket if self.bell is not None and self.bell.listening() else None
        return [handle for handle in (bell, self.process) if handle is not None]

    def wakes_at(self) -> float:
        """When the loop must look at this SuperNode again without a waitable ready: its next ask, or the end of its
        bell's quiet spell (the bell is then listened to again).

        Returns:
            A time of time.monotonic().
        """
        if self.bell is None or self.bell.listening():
            return self.next_ask
        return min(self.next_ask, self.bell.quiet_until)

    def ask(self) -> None:
        """Ask the SuperNode for a ClientApp task and fork it, if there is one."""
        self.executor.reconcile()
        supported, fab_hashes = self.executor.get_eligible_capacity(set(self.plugin.supported_task_types))
        try:
            reply = self.client.AcquireTask(flower.acquire_task_request(supported, fab_hashes))
        except Exception as error:  # noqa: BLE001 - not up yet, restarting, or gone: the others are still served
            if self.unreachable is None:
                self.unreachable = f"{type(error).__name__}: {error}"
                _say(f"{self.name} does not answer ({self.unreachable}); asking again every {UNREACHABLE_RETRY:g} s")
            self.next_ask = time.monotonic() + UNREACHABLE_RETRY
            return
        finally:
            if self.bell is not None:
                self.bell.hush()
        if self.unreachable is not None:
            _say(f"{self.name} answers again")
            self.unreachable = None
        if reply.HasField("task") and reply.token:
            result = self.plugin.launch_task(token=reply.token, task=reply.task)
            if result.message:
                _say(f"task {reply.task.task_id} of {self.name}: {result.status} {result.message}")
        heard = self.bell is not None and self.bell.heard
        self.next_ask = time.monotonic() + next_ask_in(self.poll, heard, self.serverapp_running())

    def serverapp_running(self) -> bool:
        """Whether this is a SuperLink and a ServerApp forked for it is still running (`reconcile` reaps the ended).

        Returns:
            False for a SuperNode.
        """
        return self.app == "serverapp" and bool(self.executor.children)

    def close(self, timeout: float = 0.0) -> None:
        """Stop its tasks (waiting for them at most `timeout` seconds) and let its resources go.

        Args:
            timeout: seconds to wait for its tasks to end.
        """
        self.executor.close(timeout)
        self.client.close()
        if self.bell is not None:
            self.bell.socket.close()
        if self.process is not None:
            os.close(self.process)


def _doorbell(address: str, parent_pid: int | None) -> Doorbell | None:
    """The doorbell of the SuperNode at `address`, answering only its process (`parent_pid`; anyone's rings if not
    given), or None (we then poll it) if another process listens for it."""
    port = int(address.rsplit(":", 1)[1])

    def report_stranger(pid: int | None) -> None:
        _say(
            f"process {pid} rang the doorbell of the SuperNode at {address}, which is process {parent_pid}; its "
            f"rings, and any other stranger's, are dropped (reported once)"
        )

    try:
        return Doorbell(port, parent_pid, report_stranger)
    except OSError as error:
        _say(f"no doorbell for the SuperNode on port {port} ({error}); polling it instead")
        return None


def serve(nodes: list[ServedRuntime], more: SuperNodeList | None = None) -> None:
    """Ask each SuperNode (or SuperLink) for work when its doorbell rings or its poll is due, fork every task it
    hands out, and stop serving one whose process has exited; serve the SuperNodes `more` names as they come.
    Return once none is left and `more` has ended.

    Args:
        nodes: the SuperNodes and SuperLinks served; those that exit are removed from the list.
        more: SuperNodes named on stdin as they start; None: none.
    """
    while nodes or more is not None:
        now = time.monotonic()
        timeout = max(0.0, min((node.wakes_at() for node in nodes), default=now + HEARD_POLL) - now)
        waitables = [handle for node in nodes for handle in node.waitables()]
        ready, _, _ = select.select(waitables + ([more.fd] if more is not None else []), [], [], timeout)
        if more is not None and more.fd in ready:
            nodes += more.read()
            more = None if more.ended else more
        for node in list(nodes):
            if node.process is not None and node.process in ready:
                _say(f"{node.name} has exited; its tasks are stopped")
                node.close()
                nodes.remove(node)
            elif (
                node.bell is not None and node.bell.socket in ready and node.bell.answer()
            ) or time.monotonic() >= node.next_ask:
                node.ask()


class SuperNodeList:
    """SuperNodes to serve from a file descriptor (our stdin: `fedbayes local` names them once it has started them),
    one `ADDRESS PID` per line, their Runtime APIs plain HTTP on this machine; the list ends with the file.
    `before_fork` runs before each of their ClientApps is forked (the ClientApps' imports, if not done yet)."""

    def __init__(self, fd: int, poll: float, before_fork: Callable[[], None] = lambda: None) -> None:
        """A list that has read nothing yet.

        Args:
            fd: the file descriptor the lines come from.
            poll: Flower's task poll interval, in seconds, for each SuperNode served.
            before_fork: run before each of their ClientApps is forked.
        """
        self.fd, self.poll, self.before_fork = fd, poll, before_fork
        self.pending = b""
        self.ended = False

    def read(self) -> list[ServedRuntime]:
        """The SuperNodes on the lines complete so far (a line that names none is reported and skipped); the last piece
        too once the file has ended (`ended`).

        Returns:
            A ServedRuntime for each, insecure, its process watched.
        """
        chunk = os.read(self.fd, 65536)
        self.ended = not chunk
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        served = []
        for line in [*lines, self.pending] if self.ended else lines:
            try:
                address, pid = line.decode().split()
                executor = ForkExecutor(TASK_TYPE["clientapp"], before_fork=self.before_fork)
                served.append(ServedRuntime(address, int(pid), True, None, self.poll, executor=executor))
                _say(f"serving {served[-1].name} (process {pid})")
            except (ValueError, OSError) as error:  # not `ADDRESS PID`, or a SuperNode that is gone
                if line.strip():
                    _say(f"not serving {line!r} from stdin: {type(error).__name__}: {error}")
        return served


def _say(message: str) -> None:
    print(f"fedbayes superexec: {message}", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`fedbayes superexec`'s options.

    Args:
        parser: the `superexec` parser.
    """
    parser.add_argument(
        "--runtime-api-address",
        required=True,
        action="append",
        help="the SuperNode's Runtime API (host:port); repeat it to serve several SuperNodes",
    )
    parser.add_argument(
        "--app",
        choices=sorted(PRELOAD),
        default="clientapp",
        help="the tasks to run: a SuperNode's ClientApps (default), or a SuperLink's ServerApps (its --port, "
        "with the SuperLink started with --isolation process)",
    )
    parser.add_argument(
        "--supernodes-from-stdin",
        action="store_true",
        help="also serve the SuperNodes named on stdin, one `ADDRESS PID` per line as they start (their Runtime "
        "APIs plain HTTP on this machine), until stdin ends; their ClientApps' modules are preloaded too",
    )
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API (same host only)")
    tls.add_argument("--root-certificates", help="CA bundle that signed the Runtime API's certificate")
    parser.add_argument(
        "--parent-pid",
        type=int,
        action="append",
        help="stop serving a SuperNode when this process (it) exits; one per --runtime-api-address",
    )


def exit_on_term(*_: object) -> NoReturn:
    """SIGTERM: exit through the `finally` that closes the served SuperNodes. Further TERMs are ignored from here on:
    a second one (`fedbayes local` sent two until `ProcessGroup.stop_all` skipped the processes it had signalled)
    would raise SystemExit again inside the interpreter's exit (torch's atexit finalisers), a traceback in the log.

    Args:
        _: the signal handler's arguments (signal number and frame), unused.

    Raises:
        SystemExit: always, with status 0.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def run(args: argparse.Namespace) -> int:
    """`fedbayes superexec`: serve the Runtime APIs named, and those on stdin, until each has exited or SIGTERM.

    Args:
        args: the command line (`add_arguments`).

    Returns:
        0.

    Raises:
        SystemExit: not one --parent-pid per --runtime-api-address, a bad poll interval, CA file or address, or a
            parent process that is gone.
    """
    addresses, parent_pids = args.runtime_api_address, args.parent_pid or [None] * len(args.runtime_api_address)
    if len(parent_pids) != len(addresses):
        raise SystemExit(f"give one --parent-pid per --runtime-api-address ({len(parent_pids)} for {len(addresses)})")
    # With SuperNodes on stdin besides a SuperLink: the ClientApps' own imports (torch._dynamo among them) only after
    # the ServerApp is forked, or before the first ClientApp is, so that they do not hold up the ServerApp's start.
    client_side = Preloader({"clientapp"} - {args.app} if args.supernodes_from_stdin else set())
    try:
        poll = flower.task_poll_interval()  # FLWR_SUPEREXEC_TASK_POLL_INTERVAL, Flower's own check
        nodes = [
            ServedRuntime(
                address,
                pid,
                args.insecure,
                args.root_certificates,
                poll,
                args.app,
                ForkExecutor(TASK_TYPE[args.app], after_fork=client_side),
            )
            for address, pid in zip(addresses, parent_pids)
        ]
    except (ValueError, OSError) as error:  # a bad poll interval, CA file or address; a parent that is gone
        raise SystemExit(f"fedbayes superexec: {type(error).__name__}: {error}") from None
    more = SuperNodeList(sys.stdin.fileno(), poll, before_fork=client_side) if args.supernodes_from_stdin else None
    preload({args.app})
    _say("ready")  # imported what its tasks need (fedbayes local's tests wait for it)
    signal.signal(signal.SIGTERM, exit_on_term)
    try:
        serve(nodes, more)
    except KeyboardInterrupt:
        pass
    finally:
        for node in nodes:
            node.close(CLOSE_TIMEOUT)
    return 0
