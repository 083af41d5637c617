"""`fedbayes server`: the server side of a federation across machines, as one command on a plain machine.

    fedbayes server --check --certs certs --name fl.example.org --state-dir state
    fedbayes server --certs certs --name fl.example.org --state-dir state [-- SUPERLINK ARGUMENTS]

It runs what docker-compose.yml runs in its `superlink` and `serverapp` services, as two processes of this machine:
the SuperLink (`fedbayes superlink`: TLS with the certificate of `fedbayes pki init`, SuperNode authentication, its
state in a database), whose Fleet API (--fleet-address, 0.0.0.0:9092) is the one port clients need and whose Control
API listens on this machine's 127.0.0.1 only (--control-port, 9093: whoever reaches it controls the federation); and
the warm ServerApp executor (`fedbayes superexec --app serverapp`), whose forks run each submitted run's ServerApp,
its checkpoints under <state-dir>/server-state. The client registry (<state-dir>/clients.json, or --registry) is the
file `fedbayes pki register --registry` writes and a run reads as run config `client-registry`.

Everything it needs of this machine is checked first, each check named (`--check` reports them all and exits): the
certificate (present, signed by the CA, its key beside it, in date, valid for --name and for 127.0.0.1, where the
executor and the operator connect), the client registry (readable, its folder writable), the state directory
(writable), the two ports (free) and the dataset the ServerApp evaluates on (--dataset, --data-root: its test set
there). Then it starts both, waits until they listen and are ready, and prints what to run next: the key
registration, the `flwr` connection, the Flower app and the `fedbayes run` that submits a run.

It stays in the foreground and supervises the two: when one exits, it says which, with its exit code and the last
lines of its log, stops the other and exits non-zero. SIGTERM (systemd) stops both and exits 0; Ctrl-C stops both and
exits 130. The SuperLink's database, the registry and the checkpoints stay, so the same command starts the same
federation again: registered keys keep their node ids, and a resubmitted run resumes from its checkpoint.

Arguments after `--` go to the SuperLink as they are (Flower's `flower-superlink` options), except the ones this
command sets itself, which are refused by name.
"""

from __future__ import annotations

import argparse
import datetime
import errno
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fedbayes.deploy.processes import ManagedProcess, ProcessGroup, console_script, process_env

DEFAULT_STATE_DIR = Path("/var/lib/fedbayes-server")
DEFAULT_FLEET_ADDRESS = "0.0.0.0:9092"
DEFAULT_CONTROL_PORT = 9093
CONTROL_HOST = "127.0.0.1"  # the Control and Runtime API: this machine only
CONNECTION = "fedbayes"  # the `flwr` connection the printed commands name
FIRST_FEDERATION = "first"  # the federation the printed `fedbayes run` starts
# What this command gives the SuperLink itself: the same option after `--` is refused, not silently overridden.
OWN_SUPERLINK_OPTIONS = (
    "--insecure",
    "--ssl-certfile",
    "--ssl-keyfile",
    "--ssl-ca-certfile",
    "--enable-supernode-auth",
    "--database",
    "--isolation",
    "--host",
    "--port",
    "--fleet-api-address",
    "--control-api-address",
)
STARTUP_TIMEOUT = 180.0  # seconds for the SuperLink to listen and the executor to have imported what runs need
SUPERVISE_POLL = 0.5  # seconds between looks at the two processes
LOG_TAIL_LINES = 20
TERMINATED = 143  # the exit status `stop_processes_on_signals` gives SIGTERM (deploy/processes.py)
READY_LINE = "fedbayes superexec: ready"  # deploy/warm_executor.py, once it has imported what a ServerApp needs


class CheckFailed(ValueError):
    """A check found a problem; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class ServerLayout:
    """Where the server keeps what it writes: all under its state directory unless --registry or --log-dir say
    otherwise. Every path is absolute (the printed commands must work from any directory)."""

    state_dir: Path
    registry: Path
    log_dir: Path

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> ServerLayout:
        """The layout `fedbayes server`'s options give.

        Args:
            args: the command line (`add_arguments`): state_dir, registry, log_dir.

        Returns:
            The state directory, the registry (default <state-dir>/clients.json) and the log folder (default
            <state-dir>/logs), each resolved.
        """
        state_dir = args.state_dir.resolve()
        registry = (args.registry or state_dir / "clients.json").resolve()
        return cls(state_dir, registry, (args.log_dir or state_dir / "logs").resolve())

    @property
    def database(self) -> Path:
        """The SuperLink's database (--database): node ids, registered keys, runs."""
        return self.state_dir / "superlink.db"

    @property
    def checkpoints(self) -> Path:
        """The ServerApps' default `server-state-dir` (FEDBAYES_SERVER_STATE_DIR)."""
        return self.state_dir / "server-state"

    @property
    def flwr_home(self) -> Path:
        """Flower's home for the server's processes (the apps they install)."""
        return self.state_dir / "flwr-home"

    @property
    def app(self) -> Path:
        """Where the printed `fedbayes app` writes the Flower app that `fedbayes run` submits."""
        return self.state_dir / "app"


@dataclass(frozen=True)
class Check:
    """One named check: `run` returns what it found (one line) or raises CheckFailed."""

    name: str
    run: Callable[[], str]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`fedbayes server`'s options, and the SuperLink's arguments after `--`.

    Args:
        parser: the `server` parser.
    """
    parser.add_argument(
        "--certs",
        type=Path,
        required=True,
        metavar="DIR",
        help="ca.crt, server.pem and server.key, as `fedbayes pki init --out DIR` writes them",
    )
    parser.add_argument(
        "--name",
        required=True,
        help="the host name or IP address clients dial; the certificate must list it (pki init --name/--ip)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"the SuperLink's database, the checkpoints, the client registry and the logs "
        f"(default {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--registry", type=Path, metavar="FILE", help="the client registry (default: <state-dir>/clients.json)"
    )
    parser.add_argument(
        "--fleet-address",
        default=DEFAULT_FLEET_ADDRESS,
        metavar="HOST:PORT",
        help=f"where the Fleet API listens for clients (default {DEFAULT_FLEET_ADDRESS}; open this port to them)",
    )
    parser.add_argument(
        "--control-port",
        type=int,
        default=DEFAULT_CONTROL_PORT,
        metavar="PORT",
        help=f"the Control API's port on {CONTROL_HOST}, for the operator and the ServerApp executor "
        f"(default {DEFAULT_CONTROL_PORT})",
    )
    parser.add_argument(
        "--dataset",
        default="fmnist",
        help="the dataset the runs evaluate on (run config `dataset`): its test set must be on this machine",
    )
    parser.add_argument("--data-root", default="", help="run config `data-root` for --dataset ('' = its default)")
    parser.add_argument("--log-dir", type=Path, help="the two processes' logs (default: <state-dir>/logs)")
    parser.add_argument("--check", action="store_true", help="run every check, report each, and exit")
    parser.add_argument(
        "superlink_args",
        nargs="*",
        metavar="-- SUPERLINK ARGUMENTS",
        help="after `--`: more `flower-superlink` options, passed as they are",
    )


def run(args: argparse.Namespace) -> int:
    """`fedbayes server`: the checks, then the SuperLink and the ServerApp executor until one exits or a signal.

    Args:
        args: the command line (`add_arguments`), with `argv`, the arguments as given (to tell whether `--` was).

    Returns:
        0 after --check found nothing wrong, or after SIGTERM stopped both; 1 after a failed check, or the exit code
        (1 for 0) of the process that exited by itself; 130 after Ctrl-C.

    Raises:
        ValueError: a check failed (without --check: CheckFailed, naming the check), or the arguments after `--` are
            not the SuperLink's to take.
        TimeoutError: the two were not up within STARTUP_TIMEOUT seconds.
    """
    superlink_args = pass_through(args.superlink_args, args.argv)
    layout = ServerLayout.from_arguments(args)
    checks = server_checks(args, layout)
    if args.check:
        return report_checks(checks, args.name)
    for check in checks:
        try:
            check.run()
        except CheckFailed as problem:  # the first problem is the command's error
            raise CheckFailed(f"{check.name}: {problem} (--check reports every check)") from None
    try:
        return serve(args, layout, superlink_args)
    except KeyboardInterrupt:
        say("stopped (Ctrl-C); " + kept_state(layout))
        return 130
    except SystemExit as stop:
        if stop.code != TERMINATED:
            raise
        say("stopped (SIGTERM); " + kept_state(layout))
        return 0


def pass_through(superlink_args: list[str], argv: list[str]) -> list[str]:
    """The SuperLink arguments given after `--`, refused when they came without it (a stray word would be handed to
    Flower) or name an option this command sets.

    Args:
        superlink_args: the positional arguments argparse left for the SuperLink.
        argv: the command line as given.

    Returns:
        A copy of `superlink_args`.

    Raises:
        ValueError: they came without `--`, or one is an option of OWN_SUPERLINK_OPTIONS (also as `--option=value`).
    """
    if superlink_args and "--" not in argv:
        raise ValueError(
            f"unexpected argument(s) {shlex.join(superlink_args)}: arguments for the SuperLink go after `--` "
            "(fedbayes server ... -- --option value)"
        )
    own = [arg for arg in superlink_args if arg.split("=", 1)[0] in OWN_SUPERLINK_OPTIONS]
    if own:
        raise ValueError(
            f"{', '.join(own)} after `--`: fedbayes server sets {'it' if len(own) == 1 else 'them'} itself "
            "(--certs, --state-dir, --fleet-address, --control-port)"
        )
    return list(superlink_args)


# ---- the checks ---------------------------------------------------------------------------------------------------
def server_checks(args: argparse.Namespace, layout: ServerLayout) -> list[Check]:
    """The checks, in the order they are reported.

    Args:
        args: the command line: certs, name, fleet_address, control_port, dataset, data_root.
        layout: where the server writes.

    Returns:
        certificate, registry, state, ports and dataset; each runs when called.
    """
    return [
        Check("certificate", lambda: check_certificates(args.certs, args.name)),
        Check("registry", lambda: check_registry(layout.registry)),
        Check("state", lambda: check_state_dir(layout)),
        Check("ports", lambda: check_ports(args.fleet_address, args.control_port)),
        Check("dataset", lambda: check_dataset(args.dataset, args.data_root)),
    ]


def report_checks(checks: list[Check], name: str) -> int:
    """Run every check and print one line each; 0 if all passed, else 1.

    Args:
        checks: the checks, run in order, each whatever the others found.
        name: the host name clients dial, for the closing line.

    Returns:
        The exit code.
    """
    failed = 0
    for check in checks:
        try:
            print(f"{check.name:<12} {check.run()}", flush=True)
        except CheckFailed as problem:
            failed += 1
            print(f"{check.name:<12} FAILED: {problem}", flush=True)
    if failed:
        print(f"{failed} of {len(checks)} checks failed; nothing was started")
        return 1
    print(f"ok: run the same command without --check to start the server for {name}")
    return 0


def check_certificates(directory: Path, name: str, now: datetime.datetime | None = None) -> str:
    """The SuperLink's certificate in `directory`: present, signed by the CA there, its private key beside it, in
    date, valid for `name` (what clients dial) and for 127.0.0.1 (where the ServerApp executor and the operator's
    `flwr` connect).

    Args:
        directory: --certs: ca.crt, server.pem and server.key.
        name: --name, a host name or IP address (compared without case).
        now: the moment the certificate must be valid at (timezone-aware); None: this machine's clock.

    Returns:
        The line that says so.

    Raises:
        CheckFailed: naming the file and the problem, with what to do about it.
    """
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    from fedbayes.deploy.pki import TlsFiles, certificate_names

    try:
        files = TlsFiles.in_directory(directory)
        ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        certificate = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
        key = serialization.load_pem_private_key(files.server_key.read_bytes(), password=None)
    except FileNotFoundError as error:
        raise CheckFailed(str(error)) from None
    except (OSError, ValueError, TypeError) as error:
        raise CheckFailed(f"{directory}: a certificate or key there cannot be read ({error})") from None
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CheckFailed(
            f"{files.server_cert} is not signed by {files.ca_cert}: the two come from different `pki init` runs; "
            f"issue a new certificate from this CA (`fedbayes pki init --out {directory} --force --name {name}`)"
        ) from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.PEM, public) != certificate.public_key().public_bytes(
        serialization.Encoding.PEM, public
    ):
        raise CheckFailed(f"{files.server_key} is not the key of {files.server_cert}: keep the pair pki init wrote")
    moment = now or datetime.datetime.now(datetime.UTC)
    if not certificate.not_valid_before_utc <= moment <= certificate.not_valid_after_utc:
        raise CheckFailed(
            f"{files.server_cert} is valid {certificate.not_valid_before_utc:%Y-%m-%d} to "
            f"{certificate.not_valid_after_utc:%Y-%m-%d}, and this machine's clock says {moment:%Y-%m-%d %H:%M} UTC: "
            f"set the clock (NTP), or issue a new one (`fedbayes pki init --out {directory} --force --name {name}`)"
        )
    names = certificate_names(certificate)
    missing = [wanted for wanted in (name, CONTROL_HOST) if wanted.lower() not in (n.lower() for n in names)]
    if missing:
        from fedbayes.deploy.fleet_probe import is_ip

        option = "--ip" if is_ip(missing[0]) else "--name"
        raise CheckFailed(
            f"{files.server_cert} is valid for {', '.join(names)}, not for {' or '.join(missing)}: clients' TLS "
            f"would fail; issue one that is (`fedbayes pki init --out {directory} --force {option} {missing[0]}`; "
            "the CA is kept, so clients keep their ca.crt)"
        )
    return (
        f"{files.server_cert}: signed by {files.ca_cert}, key {files.server_key.name}, valid for {name} and "
        f"{CONTROL_HOST} (names: {', '.join(names)}; until {certificate.not_valid_after_utc:%Y-%m-%d})"
    )


def check_registry(registry: Path) -> str:
    """The client registry readable (or not there yet) and its folder writable for `fedbayes pki register`.

    Args:
        registry: the client registry file.

    Returns:
        The line that says how many clients are registered, and which.

    Raises:
        CheckFailed: its folder is not writable, or the file cannot be read or is not a registry.
    """
    from fedbayes.deploy.pki import read_client_registry
    from fedbayes.tasks.preflight import unwritable

    if problem := unwritable(registry.parent, directory=True):
        raise CheckFailed(f"the client registry's folder: {problem}")
    try:
        entries = read_client_registry(registry)
    except ValueError as error:
        raise CheckFailed(str(error)) from None
    except OSError as error:
        raise CheckFailed(f"client registry {registry} cannot be read ({error.strerror or error})") from None
    if not entries:
        return f"{registry}: no client registered yet (`fedbayes pki register --registry {registry}` adds them)"
    return f"{registry}: {len(entries)} client(s) registered ({', '.join(sorted(entries))})"


def check_state_dir(layout: ServerLayout) -> str:
    """The state directory and the log folder writable (or makeable).

    Args:
        layout: where the server writes.

    Returns:
        The line that says so, and whether the SuperLink's database is new or kept from before.

    Raises:
        CheckFailed: naming the option (--state-dir, --log-dir) and the problem.
    """
    from fedbayes.tasks.preflight import unwritable

    for what, folder in (("--state-dir", layout.state_dir), ("--log-dir", layout.log_dir)):
        if problem := unwritable(folder, directory=True):
            raise CheckFailed(f"{what}: {problem}")
    database = "kept from before" if layout.database.exists() else "new"
    return (
        f"{layout.state_dir}: writable (SuperLink database {layout.database.name}: {database}; checkpoints in "
        f"{layout.checkpoints}; logs in {layout.log_dir})"
    )


def check_ports(fleet_address: str, control_port: int) -> str:
    """The Fleet API's address and the Control API's port free on this machine.

    Args:
        fleet_address: --fleet-address, host:port.
        control_port: --control-port, on CONTROL_HOST.

    Returns:
        The line that says both are free.

    Raises:
        CheckFailed: an address that is not host:port, a port outside 1..65535, the same port twice, or an address
            this machine cannot listen on now.
    """
    host, port = split_address(fleet_address, "--fleet-address")
    if not 0 < control_port < 65536:
        raise CheckFailed(f"--control-port {control_port} is not in 1..65535")
    if port == control_port and host in ("0.0.0.0", "::", CONTROL_HOST):
        raise CheckFailed(f"--fleet-address and --control-port both name port {port}: give them two ports")
    for address, what in ((fleet_address, "the Fleet API"), (f"{CONTROL_HOST}:{control_port}", "the Control API")):
        if problem := bind_problem(*split_address(address, what)):
            raise CheckFailed(f"{what} cannot listen on {address}: {problem}")
    return f"{fleet_address} (Fleet API, for clients) and {CONTROL_HOST}:{control_port} (Control API) are free"


def check_dataset(dataset: str, data_root: str) -> str:
    """The test set of `dataset` (under `data_root`) on this machine: what every run's ServerApp evaluates on.

    Args:
        dataset: --dataset, a run config `dataset`.
        data_root: --data-root ("": the dataset's default).

    Returns:
        The line that says where the test set is.

    Raises:
        CheckFailed: the test set is not there (tasks/preflight.py says why).
    """
    from fedbayes.tasks.config import ConfigError, RunSettings
    from fedbayes.tasks.preflight import check_dataset_files

    try:
        check_dataset_files(RunSettings(dataset=dataset, data_root=data_root))
    except ConfigError as error:
        raise CheckFailed(f"--dataset {dataset}: {error}") from None
    if data_root or dataset != "fmnist":
        where = data_root or dataset.removeprefix("npz:")
    else:
        from fedbayes.tasks.datasets import DEBIAN_FMNIST_DIR  # what data-root "" means for fmnist

        where = str(DEBIAN_FMNIST_DIR)
    return f"{dataset} in {where}: the test set the ServerApp evaluates on is there"


def split_address(address: str, what: str) -> tuple[str, int]:
    """`host:port` (IPv6 in brackets) as (host, port).

    Args:
        address: `host:port`.
        what: the option or API it belongs to, for the message.

    Returns:
        The host (without brackets) and the port.

    Raises:
        CheckFailed: no host, or a port that is not a number in 1..65535.
    """
    host, separator, port = address.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CheckFailed(f"{what} {address!r} must be host:port with a port in 1..65535, e.g. 0.0.0.0:9092")
    return host.strip("[]"), int(port)


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on host:port now (in use, no such address, not allowed); None if it could.

    Args:
        host: a host name or IP address of this machine ("0.0.0.0", "::": every address).
        port: the TCP port.

    Returns:
        The reason, one line, or None.
    """
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        return f"{host!r} is no address of this machine ({error.strerror})"
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free for a server
        try:
            probe.bind(address)
        except OSError as error:
            in_use = " (another SuperLink, or another program, is there)" if error.errno == errno.EADDRINUSE else ""
            return f"{error.strerror or error}{in_use}"
    return None


# ---- the processes ------------------------------------------------------------------------------------------------
def superlink_command(args: argparse.Namespace, layout: ServerLayout, extra: list[str]) -> list[str]:
    """`fedbayes superlink` as docker-compose.yml's superlink service runs it, on this machine's paths and ports.

    Args:
        args: the command line: certs, control_port, fleet_address.
        layout: where the database is.
        extra: the SuperLink arguments after `--`, appended.

    Returns:
        The command line.
    """
    certs = args.certs.resolve()
    return [
        console_script("fedbayes"),
        "superlink",
        "--ssl-ca-certfile",
        str(certs / "ca.crt"),
        "--ssl-certfile",
        str(certs / "server.pem"),
        "--ssl-keyfile",
        str(certs / "server.key"),
        "--enable-supernode-auth",
        "--database",
        str(layout.database),
        "--isolation",
        "process",
        "--disable-runtime-dependency-installation",
        "--host",
        CONTROL_HOST,
        "--port",
        str(args.control_port),
        "--fleet-api-address",
        args.fleet_address,
        *extra,
    ]


def executor_command(args: argparse.Namespace, superlink_pid: int) -> list[str]:
    """The warm ServerApp executor (docker-compose.yml's serverapp service) of the SuperLink process
    `superlink_pid`: it stops when that process exits.

    Args:
        args: the command line: certs, control_port.
        superlink_pid: the SuperLink's process id.

    Returns:
        The command line.
    """
    return [
        console_script("fedbayes"),
        "superexec",
        "--app",
        "serverapp",
        "--root-certificates",
        str(args.certs.resolve() / "ca.crt"),
        "--runtime-api-address",
        f"{CONTROL_HOST}:{args.control_port}",
        "--parent-pid",
        str(superlink_pid),
    ]


def serve(args: argparse.Namespace, layout: ServerLayout, superlink_args: list[str]) -> int:
    """Start the SuperLink and its executor, wait until both are up, print what to run next, and supervise them;
    the exit status of the one that exited (1 for 0).

    Args:
        args: the command line.
        layout: where the server writes; its state directory is made.
        superlink_args: the SuperLink arguments after `--` (`pass_through`).

    Returns:
        The exit status.

    Raises:
        TimeoutError: the Fleet API, the Control API or the executor was not up within STARTUP_TIMEOUT seconds.
    """
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    env = {**process_env(layout.flwr_home), "FEDBAYES_SERVER_STATE_DIR": str(layout.checkpoints)}
    with ProcessGroup(layout.log_dir, env) as processes:
        superlink = processes.start("superlink", superlink_command(args, layout, superlink_args))
        executor = processes.start("serverapp-executor", executor_command(args, superlink.popen.pid))
        daemons = [superlink, executor]
        say(f"starting the SuperLink and the ServerApp executor (logs in {layout.log_dir})")
        fleet_host, fleet_port = split_address(args.fleet_address, "--fleet-address")
        waiting = {
            "the Fleet API": lambda: _listens(_dialable(fleet_host), fleet_port),
            "the Control API": lambda: _listens(CONTROL_HOST, args.control_port),
            "the ServerApp executor": lambda: _logged(executor, READY_LINE),
        }
        if (code := wait_until_up(waiting, daemons, STARTUP_TIMEOUT)) is not None:
            return code
        print(next_steps(args, layout), flush=True)
        return supervise(daemons)


def wait_until_up(waiting: dict[str, Callable[[], bool]], daemons: list[ManagedProcess], timeout: float) -> int | None:
    """Wait until every condition of `waiting` holds, looking every SUPERVISE_POLL seconds.

    Args:
        waiting: what is awaited (named, for the message) -> a condition, asked until it holds.
        daemons: the processes that must not exit meanwhile.
        timeout: seconds.

    Returns:
        None when all hold, or the exit status `exited` gives when a daemon exits first.

    Raises:
        TimeoutError: after `timeout` seconds, naming what is not up and the daemons' logs.
    """
    deadline = time.monotonic() + timeout
    while waiting:
        for process in daemons:
            if process.popen.poll() is not None:
                return exited(process)
        waiting = {what: ready for what, ready in waiting.items() if not ready()}
        if waiting and time.monotonic() > deadline:
            raise TimeoutError(
                f"{' and '.join(waiting)} not up within {timeout:.0f} s; their logs: "
                + ", ".join(str(process.log_path) for process in daemons)
            )
        time.sleep(SUPERVISE_POLL)
    return None


def supervise(daemons: list[ManagedProcess]) -> int:
    """Wait until one of `daemons` exits; `exited`'s status for it (the group then stops the others).

    Args:
        daemons: the processes, looked at every SUPERVISE_POLL seconds.

    Returns:
        The exit status.
    """
    while True:
        for process in daemons:
            if process.popen.poll() is not None:
                return exited(process)
        time.sleep(SUPERVISE_POLL)


def exited(process: ManagedProcess) -> int:
    """Say which process exited, with its code (or signal) and its log's last lines; its exit status, 1 for 0 or a
    signal (a daemon that ends by itself has failed).

    Args:
        process: a process that has exited.

    Returns:
        The exit status.
    """
    code = process.popen.poll()
    assert code is not None  # only called once it has exited
    how = f"exited with code {code}" if code >= 0 else f"was killed by {signal.Signals(-code).name}"
    where = f"; the last lines of {process.log_path}:" if process.log_path else ""
    say(f"{DAEMON_NAMES.get(process.name, process.name)} {how}; stopping the other{where}")
    print(process.log_tail(LOG_TAIL_LINES), file=sys.stderr, flush=True)
    return code if code > 0 else 1


DAEMON_NAMES = {"superlink": "the SuperLink", "serverapp-executor": "the ServerApp executor"}


def _listens(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def _dialable(host: str) -> str:
    """The address to look for a listener bound to `host` at: a wildcard is reached on loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _logged(process: ManagedProcess, line: str) -> bool:
    try:
        return process.log_path is not None and line in process.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return False


def next_steps(args: argparse.Namespace, layout: ServerLayout) -> str:
    """What the operator runs next, each command whole, with this server's absolute paths and ports.

    Args:
        args: the command line: certs, control_port, fleet_address, name, dataset, data_root.
        layout: where the server writes.

    Returns:
        The lines, newline-separated.

    Raises:
        ValueError: the client registry is not one `read_client_registry` reads.
    """
    from fedbayes.deploy.pki import read_client_registry

    ca = str(args.certs.resolve() / "ca.crt")
    control = f"{CONTROL_HOST}:{args.control_port}"
    connection = ["fedbayes", "pki", "connection", "--name", CONNECTION, "--superlink", control, "--ca", ca]
    _, fleet_port = split_address(args.fleet_address, "--fleet-address")
    registered = sorted(read_client_registry(layout.registry))
    run_config = " ".join(
        [
            'strategy="bayesadmm"',
            f'federation="{FIRST_FEDERATION}"',
            f"wait-for-clients={len(registered) or 2}",
            f'client-registry="{layout.registry}"',
            f'results-path="{layout.state_dir / FIRST_FEDERATION}.jsonl"',
            *([f'dataset="{args.dataset}"'] if args.dataset != "fmnist" else []),
            *([f'data-root="{args.data_root}"'] if args.data_root else []),
        ]
    )
    register = ["fedbayes", "pki", "register", "--superlink", control, "--ca", ca, "--registry", str(layout.registry)]
    client = ["fedbayes", "client", "--superlink", f"{args.name}:{fleet_port}", "--ca", "ca.crt", "--key", "KEY"]
    export = ["fedbayes", "export", str(layout.checkpoints), "--federation", FIRST_FEDERATION]
    return "\n".join(
        [
            f"fedbayes server: ready. Clients dial {args.name}:{fleet_port} (TLS; registered keys only); the Control "
            f"API {control} is for this machine only. Ctrl-C or SIGTERM stops the server.",
            "Next, in another terminal on this machine:",
            "  1. register each client's public key under its client id (once per client; it prints the node id)"
            + (f"; registered already: {', '.join(registered)}" if registered else "")
            + ":",
            f"       {shlex.join(register)} --client-id CLIENT_ID CLIENT_ID.pub",
            f"  2. once: a `flwr` connection named {CONNECTION} to this SuperLink, and the Flower app:",
            f"       {shlex.join(connection)}",
            "       " + shlex.join(["fedbayes", "app", str(layout.app)]),
            "  3. submit a run; it waits for that many clients (any run-config key can be added; another federation "
            "name starts a new federation, the same one resumes it):",
            "       " + shlex.join(["fedbayes", "run", str(layout.app), CONNECTION, "-c", run_config]),
            "  4. once it has completed, export its posterior:",
            "       " + shlex.join([*export, "--out", f"{FIRST_FEDERATION}.safetensors"]),
            f"Each client machine joins with {Path(ca).name} from you and its own key:",
            f"       {shlex.join(client)} --client-id CLIENT_ID --data DATA.npz --state-dir STATE_DIR",
        ]
    )


def kept_state(layout: ServerLayout) -> str:
    """What stays after the server stops: the SuperLink's database, the registry and the checkpoints.

    Args:
        layout: where the server writes.

    Returns:
        The sentence, naming their paths.
    """
    return (
        f"kept: the SuperLink's database {layout.database}, the client registry {layout.registry} and the "
        f"checkpoints in {layout.checkpoints}; the same command starts this server again"
    )


def say(message: str) -> None:
    """Print a line of this command's own on stderr, prefixed `fedbayes server: `.

    Args:
        message: the line.
    """
    print(f"fedbayes server: {message}", file=sys.stderr, flush=True)
