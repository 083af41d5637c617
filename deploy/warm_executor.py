"""`fedbayes superexec`: Flower's SuperExec for a SuperNode, but each ClientApp task is a fork of a
process that has already imported torch.

Flower runs every message in a fresh `flwr-clientapp` process. On these 2-core machines that process
spends ~1.2-3 s importing torch and another ~1.2-2 s importing torch._dynamo (every torch.optim
optimizer imports it on construction) before it trains for well under a second; with ten SuperNodes
that start-up is most of a round. This executor imports those libraries once, then forks one child
per task. The child runs Flower's own `run_clientapp` with the task's token, so the protocol, the app
loading from the FAB and the error handling are Flower's; only the process start is cheaper.

Use with `flower-supernode --isolation process`:

    fedbayes superexec --runtime-api-address 127.0.0.1:9094 --insecure --parent-pid <supernode pid>

One process can serve several SuperNodes of the same machine (`fedbayes local --executor shared`): repeat
`--runtime-api-address` and `--parent-pid` in pairs. It preloads once, then forks one poller per SuperNode,
which exits with its SuperNode; the pollers share the preloaded heap instead of each importing torch (an
idle client then adds its SuperNode and the ~50 MiB its poller does not share, see benchmarks/memory.py). Use it
only where the SuperNodes belong to one operator: their ClientApps are forks of one process.

The app's own modules are preloaded as well: the FAB carries only the run config, the code is the installed
`fedbayes` package, so the child finds `fedbayes.client.app` (and every built-in strategy) already imported.
Before the first fork the parent freezes its heap out of the garbage collector (`gc.freeze`), so a child's
collections do not walk, and thereby copy, the parent's millions of objects.

Between asks for a task it waits for its SuperNode's doorbell (deploy/doorbell.py) rather than Flower's fixed
poll interval.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from fedbayes.deploy.doorbell import Doorbell
from fedbayes.deploy.object_pulls import shorten_pull_backoff
from fedbayes.deploy.supernode import time_with_sleep

# Third-party libraries a fedbayes ClientApp needs; importing them here is the whole point. Importing
# torch does not initialise CUDA, so each forked child still sets up its own GPU context.
PRELOAD = ("numpy", "torch", "torch._dynamo", "safetensors.torch", "ivon", "flwr.clientapp",
           "flwr.supernode.runtime.run_clientapp", "fedbayes.client.app")


def preload() -> None:
    """Import what every ClientApp task needs, the built-in strategies included, then freeze the heap so that
    forked children share it instead of copying it page by page."""
    for module in PRELOAD:
        importlib.import_module(module)
    from fedbayes.strategies import get_algorithm

    get_algorithm("fedavg")  # imports every built-in strategy module
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
            _run_task(spec)
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


def _run_task(spec) -> NoReturn:
    """Child side of the fork: run one ClientApp task with Flower's own runner, then exit without
    ever returning into the parent's poll loop."""
    def task() -> None:
        from flwr.supercore.exit import exit_handler
        from flwr.supercore.tls import validate_and_resolve_root_certificates
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        # The parent's exit handlers (close its Runtime API client, terminate *its* children) were
        # copied by fork; they must not run when this task exits.
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

    _exit_after(task)


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime-api-address", required=True, action="append",
                        help="the SuperNode's Runtime API (host:port); repeat it to serve several SuperNodes")
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="plain HTTP to the Runtime API (same host only)")
    tls.add_argument("--root-certificates", help="CA bundle that signed the Runtime API's certificate")
    parser.add_argument("--parent-pid", type=int, action="append",
                        help="exit when this process (the SuperNode) exits; one per --runtime-api-address")


def run(args: argparse.Namespace) -> int:
    addresses, parent_pids = args.runtime_api_address, args.parent_pid or [None] * len(args.runtime_api_address)
    if len(parent_pids) != len(addresses):
        raise SystemExit(f"give one --parent-pid per --runtime-api-address ({len(parent_pids)} for {len(addresses)})")
    preload()
    if len(addresses) == 1:
        serve(addresses[0], parent_pids[0], args)
    return supervise([_fork_poller(address, parent_pid, args) for address, parent_pid in zip(addresses, parent_pids)])


def serve(runtime_api_address: str, parent_pid: int | None, args: argparse.Namespace) -> NoReturn:
    """Flower's SuperExec poll loop for one SuperNode, launching its tasks as forks of this process."""
    # Flower 1.39's SuperExec builds its executor from a fixed factory (subprocess | kubernetes) and
    # has no hook for another; its poll loop, TLS and signal handling are otherwise what we want.
    superexec = importlib.import_module("flwr.supercore.superexec.run_superexec")
    superexec.get_executor = lambda *_args, **_kwargs: ForkExecutor()
    superexec.time = _asking_on_the_bell(runtime_api_address)
    superexec.run_superexec(
        runtime_api_address=runtime_api_address,
        insecure=args.insecure,
        root_certificates_path=args.root_certificates,
        parent_pid=parent_pid,
        runtime_dependency_install=False,
    )
    raise SystemExit(0)  # run_superexec only returns by exiting


def _asking_on_the_bell(runtime_api_address: str):
    """run_superexec's `time`, whose wait between two asks for a task ends when the SuperNode rings
    (deploy/doorbell.py); Flower's `time` if another process already listens for this SuperNode's bell."""
    port = int(runtime_api_address.rsplit(":", 1)[1])
    try:
        bell = Doorbell(port)
    except OSError as error:
        print(f"fedbayes superexec: no doorbell for the SuperNode on port {port} ({error}); polling it instead",
              file=sys.stderr, flush=True)
        return time
    return time_with_sleep(bell.wait)


def _fork_poller(runtime_api_address: str, parent_pid: int | None, args: argparse.Namespace) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _exit_after(lambda: serve(runtime_api_address, parent_pid, args))
    return pid


def supervise(pollers: list[int]) -> int:
    """Wait for the pollers, each of which exits with its SuperNode; pass SIGTERM and SIGINT on to all of them. A
    poller that fails would leave its SuperNode without an executor, so it stops the others and this process with
    exit code 1 (the launcher then reports it); 0 once every poller has ended normally."""
    live = set(pollers)

    def forward(signum, _frame) -> None:
        for pid in live:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed = False
    while live:
        pid, status = os.wait()
        live.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0 and not failed:
            failed = True
            print(f"fedbayes superexec: the poller of one SuperNode (pid {pid}) failed; stopping all", file=sys.stderr)
            forward(signal.SIGTERM, None)
    return int(failed)
