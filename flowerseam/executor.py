"""What `fedbayes superexec` (deploy/warm_executor.py) uses of Flower's SuperExec and app runtimes: the Runtime API
client and plugin that acquire a task, the launch results, Flower's own `run_clientapp` and `run_serverapp` run in a
forked child, and one patch, `flush_logs_exactly` (the ServerApp's last log flush). Each function imports Flower
where it is called, as the executor did, so that a fork's imports stay where they were."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from fedbayes.flowerseam.version import flower_is_patched

# What a ClientApp or ServerApp task imports of Flower; the executor imports them before its first fork.
RUNTIME_MODULES = {
    "clientapp": ("flwr.clientapp", "flwr.supernode.runtime.run_clientapp"),
    "serverapp": ("flwr.serverapp", "flwr.superlink.runtime.run_serverapp"),
}


def launch_accepted() -> Any:
    """Flower's LaunchResult for a task the executor started.

    Returns:
        `LaunchResult.accepted()`.
    """
    from flwr.supercore.superexec.executor import LaunchResult

    return LaunchResult.accepted()


def launch_failed(reason: str) -> Any:
    """Flower's LaunchResult for a task the executor refused, with `reason`.

    Args:
        reason: why, for the SuperExec's log.

    Returns:
        `LaunchResult.failed(reason)`.
    """
    from flwr.supercore.superexec.executor import LaunchResult

    return LaunchResult.failed(reason)


def forget_exit_handlers() -> None:
    """In a forked child: drop the exit handlers the parent registered with Flower, which fork copied; they must not
    run when the child's task exits."""
    from flwr.supercore.exit import exit_handler

    exit_handler.registered_exit_handlers.clear()


def root_certificates(path: str | None, insecure: bool) -> bytes | None:
    """The CA bundle at `path` as Flower's runtimes read it (None when insecure).

    Args:
        path: the CA bundle's path, or None.
        insecure: plain HTTP to the Runtime API.

    Returns:
        The bundle's bytes, or None.

    Raises:
        ValueError: Flower's error for a missing or contradictory CA file.
    """
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    return validate_and_resolve_root_certificates(path, insecure)


def run_clientapp_task(connection: dict[str, Any]) -> None:
    """Flower's `flwr-clientapp` for one task, minus its argument parsing.

    Args:
        connection: `run_clientapp`'s keyword arguments (runtime_api_address, token, insecure, certificates, ...).
    """
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    run_clientapp(**connection)


def run_serverapp_task(connection: dict[str, Any]) -> None:
    """Flower's `flwr-serverapp` for one task, minus its argument parsing: the output is mirrored into a queue that
    the ServerApp streams to the SuperLink (`flwr log`, `flwr run --stream`), its last flush `flush_logs_exactly`.

    Args:
        connection: `run_serverapp`'s keyword arguments, as for `run_clientapp_task`.
    """
    from queue import Queue

    from flwr.supercore.logger import mirror_output_to_queue, restore_output
    from flwr.superlink.runtime import run_serverapp

    flush_logs_exactly()
    log_queue: Queue[str | None] = Queue()
    mirror_output_to_queue(log_queue)
    run_serverapp(log_queue=log_queue, **connection)
    restore_output()


def flush_logs_exactly() -> bool:
    """Make the ServerApp's last log flush wait for the uploads, not for a fixed second. Flower's `flush_logs`, called
    before the ServerApp reports its outcome, waits until the log queue is empty and then sleeps 1 s for the last
    upload to finish: a second at the end of every run. Here it ends the uploader instead (the end-of-queue mark
    Flower's `stop_log_uploader` puts later) and waits for its thread, which uploads all it has before it ends, so
    every log line is on the SuperLink before the outcome, as Flower intends. False (and nothing changed) on a
    Flower other than the one this was read in.

    Returns:
        Whether Flower's run_serverapp module was patched.
    """
    runtime: Any = importlib.import_module("flwr.superlink.runtime.run_serverapp")  # the module, not its function
    if not flower_is_patched():
        return False
    uploaders: list[threading.Thread] = []
    start_log_uploader = runtime.start_log_uploader

    def start_and_keep(*args, **kwargs) -> threading.Thread:
        uploaders.append(start_log_uploader(*args, **kwargs))
        return uploaders[-1]

    def flush(log_queue, timeout: float = 3.0) -> bool:
        log_queue.put(None)
        for uploader in uploaders:
            uploader.join(timeout)
        return not any(uploader.is_alive() for uploader in uploaders)

    runtime.start_log_uploader, runtime.flush_logs = start_and_keep, flush
    return True


def runtime_client(address: str, insecure: bool, root_certificates: str | None, timeout: float) -> Any:
    """A client of the Runtime API at `address` as Flower's SuperExec makes one, but without its retry invoker
    (which retries a call for as long as it fails) and with a `timeout` per call.

    Args:
        address: the Runtime API's host:port.
        insecure: plain HTTP.
        root_certificates: the CA bundle's path (TLS), or None.
        timeout: seconds a call may take.

    Returns:
        Flower's RuntimeHttpClient; the caller closes it.
    """
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    return RuntimeHttpClient(
        f"{'http' if insecure else 'https'}://{address}",
        verify=False if insecure else (root_certificates or True),
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        timeout=timeout,
    )


def exec_plugin(address: str, insecure: bool, root_certificates: str | None, executor: Any) -> Any:
    """Flower's own SuperExec plugin, which turns an acquired task into the launch spec `executor` starts.

    Args:
        address: the Runtime API's host:port.
        insecure: plain HTTP.
        root_certificates: the CA bundle's path (TLS), or None.
        executor: an executor in the sense of Flower's Executor (get_eligible_capacity, launch, ...).

    Returns:
        Flower's AutoExecPlugin.
    """
    from flwr.supercore.superexec.plugin import AutoExecPlugin

    return AutoExecPlugin(
        runtime_api_address=address,
        insecure=insecure,
        root_certificates_path=root_certificates,
        runtime_dependency_install=False,
        executor=executor,
    )


def acquire_task_request(supported_task_types: set[str], fab_hashes: set[str]) -> Any:
    """Flower's AcquireTaskRequest for a task of these types.

    Args:
        supported_task_types: the task types the executor takes now.
        fab_hashes: the hashes of the FABs the executor holds (`agentapp_fab_hashes`).

    Returns:
        The request.
    """
    from flwr.proto.runtime_pb2 import AcquireTaskRequest

    return AcquireTaskRequest(supported_task_types=supported_task_types, agentapp_fab_hashes=fab_hashes)


def task_poll_interval() -> float:
    """FLWR_SUPEREXEC_TASK_POLL_INTERVAL, with Flower's own check.

    Returns:
        The seconds between asks for a task (Flower's default where the variable is unset).

    Raises:
        ValueError: the variable is not a valid interval.
    """
    from flwr.supercore.superexec.run_superexec import _get_task_poll_interval

    return _get_task_poll_interval()


def identify_as_serverapp_task(run_id: int, node_id: int, task_id: int) -> None:
    """Give this process the task identity Flower tells a ServerApp process at its start, for a ServerApp run in
    this process (deploy/inprocess.py): Flower's ServerApp code reads it.

    Args:
        run_id: the run's id.
        node_id: the ServerApp's node id.
        task_id: the task's id.
    """
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
