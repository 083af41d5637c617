"""`fedbayes superexec`: Flower's SuperExec for the SuperNodes of one machine, but each ClientApp task is a fork
of a process that has already imported torch.

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
from fedbayes.tasks.object_pulls import shorten_pull_backoff

# Third-party libraries a fedbayes ClientApp needs; importing them here is the whole point. Importing
# torch does not initialise CUDA, so each forked child still sets up its own GPU context.
PRELOAD = (
    "numpy",
    "torch",
    "torch._dynamo",
    "safetensors.torch",
    "ivon",
    "flwr.clientapp",
    "flwr.supernode.runtime.run_clientapp",
    "fedbayes.client.app",
)
UNREACHABLE_RETRY = 1.0  # seconds before asking a SuperNode again whose Runtime API did not answer
ASK_TIMEOUT = 5.0  # seconds an ask may take (on this machine's loopback it takes milliseconds)


def preload() -> None:
    """Import what every ClientApp task needs, the built-in strategies included, then freeze the heap so that
    forked children share it instead of copying it page by page."""
    for module in PRELOAD:
        importlib.import_module(module)
    from fedbayes.strategies import BUILTIN

    for algorithm in BUILTIN.values():  # every built-in strategy's client half
        algorithm.client_half()
    shorten_pull_backoff()  # children pull the instruction from the SuperNode, maybe while it still receives it
    gc.collect()
    gc.freeze()


class ForkExecutor:
    """An executor in the sense of `flwr.supercore.superexec.executor.Executor`: one forked child per
    ClientApp task, reaped between task polls and terminated when the SuperExec stops."""

    def __init__(self) -> None:
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types, *, insecure=False, root_certificates_path=None):
        from flwr.supercore.constant import TaskType

        return {TaskType.CLIENT_APP} & set(supported_task_types), set()

    def wait_for_capacity(self, task_type=None, *, fab_hash=None, insecure=False, root_certificates_path=None) -> None:
        """Forking has no capacity gate."""

    def launch(self, spec):
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            return LaunchResult.failed(f"fedbayes superexec runs ClientApp tasks only, not {spec.task_type}")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _exit_after(lambda: _run_task(spec))
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the tasks that have ended, without waiting for the others: a task can hang (one whose run was
        stopped while its SuperNode took the message), and the SuperNode's next message must still start."""
        for pid in list(self.children):
            finished_pid, _ = os.waitpid(pid, os.WNOHANG)
            if finished_pid:
                self.children.discard(pid)

    def close(self) -> None:
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _run_task(spec) -> None:
    """Child side of the fork: run one ClientApp task with Flower's own runner."""
    from flwr.supercore.exit import exit_handler
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    # Exit handlers the parent may have registered were copied by fork; they must not run when this task exits.
    exit_handler.registered_exit_handlers.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    run_clientapp(
        runtime_api_address=spec.runtime_api_address,
        token=spec.token,
        insecure=spec.insecure,
        certificates=validate_and_resolve_root_certificates(spec.root_certificates_path, spec.insecure),
        parent_pid=spec.parent_pid,
        runtime_dependency_install=False,
    )


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


class ServedSuperNode:
    """One SuperNode this executor serves: its Runtime API, the tasks forked for it, its doorbell, its process
    (if given), and when to ask it for work next."""

    def __init__(
        self, address: str, parent_pid: int | None, insecure: bool, root_certificates: str | None, poll: float
    ) -> None:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supercore.superexec.plugin import AutoExecPlugin
        from flwr.supercore.tls import validate_and_resolve_root_certificates

        self.address, self.poll = address, poll
        self.executor = ForkExecutor()
        validate_and_resolve_root_certificates(root_certificates, insecure)  # Flower's error for a missing CA file
        # No retry invoker (Flower's retries a call for as long as it fails) and a short timeout: one SuperNode that
        # is not up, or hangs, must not stop this loop from serving the others.
        self.client = RuntimeHttpClient(
            f"{'http' if insecure else 'https'}://{address}",
            verify=False if insecure else (root_certificates or True),
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            timeout=ASK_TIMEOUT,
        )
        # Flower's own plugin turns an acquired task into the launch spec our executor forks for.
        self.plugin = AutoExecPlugin(
            runtime_api_address=address,
            insecure=insecure,
            root_certificates_path=root_certificates,
            runtime_dependency_install=False,
            executor=self.executor,
        )
        self.bell = _doorbell(address, parent_pid)
        self.process = None if parent_pid is None else os.pidfd_open(parent_pid)  # readable once it has exited
        self.next_ask = 0.0
        self.unreachable: str | None = None

    def waitables(self) -> list:
        bell = self.bell.socket if self.bell is not None and self.bell.listening() else None
        return [handle for handle in (bell, self.process) if handle is not None]

    def wakes_at(self) -> float:
        """When the loop must look at this SuperNode again without a waitable ready: its next ask, or the end of its
        bell's quiet spell (the bell is then listened to again)."""
        if self.bell is None or self.bell.listening():
            return self.next_ask
        return min(self.next_ask, self.bell.quiet_until)

    def ask(self) -> None:
        """Ask the SuperNode for a ClientApp task and fork it, if there is one."""
        from flwr.proto.runtime_pb2 import AcquireTaskRequest

        self.executor.reconcile()
        supported, fab_hashes = self.executor.get_eligible_capacity(set(self.plugin.supported_task_types))
        try:
            reply = self.client.AcquireTask(
                AcquireTaskRequest(supported_task_types=supported, agentapp_fab_hashes=fab_hashes)
            )
        except Exception as error:  # noqa: BLE001 - not up yet, restarting, or gone: the others are still served
            if self.unreachable is None:
                self.unreachable = f"{type(error).__name__}: {error}"
                _say(
                    f"the SuperNode at {self.address} does not answer ({self.unreachable}); asking again every "
                    f"{UNREACHABLE_RETRY:g} s"
                )
            self.next_ask = time.monotonic() + UNREACHABLE_RETRY
            return
        finally:
            if self.bell is not None:
                self.bell.hush()
        if self.unreachable is not None:
            _say(f"the SuperNode at {self.address} answers again")
            self.unreachable = None
        if reply.HasField("task") and reply.token:
            result = self.plugin.launch_task(token=reply.token, task=reply.task)
            if result.message:
                _say(f"task {reply.task.task_id} of the SuperNode at {self.address}: {result.status} {result.message}")
        heard = self.bell is not None and self.bell.heard
        self.next_ask = time.monotonic() + (HEARD_POLL if heard else self.poll)

    def close(self) -> None:
        """Stop its tasks and let its resources go."""
        self.executor.close()
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


def serve(nodes: list[ServedSuperNode]) -> None:
    """Ask each SuperNode for work when its doorbell rings or its poll is due, fork every task it hands out, and
    stop serving a SuperNode whose process has exited; return once none is left."""
    while nodes:
        now = time.monotonic()
        timeout = max(0.0, min(node.wakes_at() for node in nodes) - now)
        ready, _, _ = select.select([handle for node in nodes for handle in node.waitables()], [], [], timeout)
        for node in list(nodes):
            if node.process is not None and node.process in ready:
                _say(f"the SuperNode at {node.address} has exited; its tasks are stopped")
                node.close()
                nodes.remove(node)
            elif (
                node.bell is not None and node.bell.socket in ready and node.bell.answer()
            ) or time.monotonic() >= node.next_ask:
                node.ask()


def _say(message: str) -> None:
    print(f"fedbayes superexec: {message}", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime-api-address",
        required=True,
        action="append",
        help="the SuperNode's Runtime API (host:port); repeat it to serve several SuperNodes",
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
    would raise SystemExit again inside the interpreter's exit (torch's atexit finalisers), a traceback in the log."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def run(args: argparse.Namespace) -> int:
    from flwr.supercore.superexec.run_superexec import _get_task_poll_interval

    addresses, parent_pids = args.runtime_api_address, args.parent_pid or [None] * len(args.runtime_api_address)
    if len(parent_pids) != len(addresses):
        raise SystemExit(f"give one --parent-pid per --runtime-api-address ({len(parent_pids)} for {len(addresses)})")
    try:
        poll = _get_task_poll_interval()  # FLWR_SUPEREXEC_TASK_POLL_INTERVAL, Flower's own check
        nodes = [
            ServedSuperNode(address, pid, args.insecure, args.root_certificates, poll)
            for address, pid in zip(addresses, parent_pids)
        ]
    except (ValueError, OSError) as error:  # a bad poll interval, CA file or address; a parent that is gone
        raise SystemExit(f"fedbayes superexec: {type(error).__name__}: {error}") from None
    preload()
    signal.signal(signal.SIGTERM, exit_on_term)
    try:
        serve(nodes)
    except KeyboardInterrupt:
        pass
    finally:
        for node in nodes:
            node.close()
    return 0
