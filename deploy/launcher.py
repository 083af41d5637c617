"""`fedbayes local`: a real federation on this machine, one OS process per party, gRPC on loopback.

Starts a SuperLink and K SuperNodes (each with its own `client-id` and partition), submits the app
with `fedbayes run` (deploy/flwr_run.py), prints one table row per round as the ServerApp writes it, and
stops every process it started (also on Ctrl-C or when one of them fails). Insecure by design: loopback
only. What the run needs of this machine is checked before anything starts (tasks/preflight.py); a run
that fails, ends early or loses its ServerApp raises RunFailed, one line. Its workdir is never emptied:
a new federation needs a new or empty one, and `resume` continues the federation a workdir holds.

The same LocalFederation also runs a secured federation across hosts (TLS + SuperNode authentication,
deploy/pki.py), where a host is this machine or a Linux network namespace with its own IP standing in
for another machine (tests/system/test_system_netns.py). Without TLS it refuses anything but 127.0.0.1.

ClientApps run, by default, as forks of one warm `fedbayes superexec` (deploy/warm_executor.py) that serves every
SuperNode on this machine's loopback (`executor="shared"`: an idle client is its SuperNode alone). It starts beside
the SuperLink, whose ServerApp it forks as well (the SuperLink runs with `--isolation process`), and is told the
SuperNodes on its stdin when the run is submitted, and of any started later (a restarted client) as they start. A
SuperNode it cannot serve (with an environment of its own, or on another host) gets a warm executor of its own, as
every SuperNode does with `executor="fork"`, where the ServerApp's warm executor serves the SuperLink alone (so it
does where the server is another host). `executor="subprocess"` keeps Flower's stock path: a fresh `flwr-clientapp`
process per message and a fresh `flwr-serverapp` per run. Whatever the executor, at most `parallel_tasks` ClientApps
compute at once (default: this machine's cores, tasks/slots.py, lock files in <workdir>/flwr-home/compute-slots;
none when the hosts are network namespaces standing for separate machines).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedbayes.deploy.client import node_config, superexec_command, supernode_arguments
from fedbayes.deploy.flower_app import toml_value, write_app
from fedbayes.deploy.flwr_run import RunStatus, run_status
from fedbayes.deploy.forkserver import ForkServer
from fedbayes.deploy.pki import TlsFiles, connection_config, register_supernode
from fedbayes.deploy.processes import (
    ManagedProcess,
    ProcessGroup,
    console_script,
    free_ports,
    is_serverapp,
    process_env,
)
from fedbayes.deploy.progress import Progress, RoundDone
from fedbayes.deploy.runfile import write_run_file
from fedbayes.strategies import run_settings
from fedbayes.tasks.config import RUN_CONFIG_FILE, RunSettings, keys_of
from fedbayes.tasks.events import EVENTS_FILE, FAILED, RUN_ENDED, TRACKING, Event, EventTail
from fedbayes.tasks.message_limits import MAX_MESSAGE_OPTION
from fedbayes.tasks.preflight import unwritable
from fedbayes.tasks.runlog import RUN_FAILED, RunFailed, failure_reason
from fedbayes.tasks.slots import SLOTS_ENV
from fedbayes.tasks.storage import complete_lines

APP = "app"  # the Flower app `fedbayes local` writes into its workdir (deploy/flower_app.py)
CONNECTION = "fedbayes-local"
FLWR_HOME = "flwr-home"  # Flower's home in a workdir; its presence marks a workdir that holds a federation
STARTUP_TIMEOUT = 60.0
EXECUTORS = ("shared", "fork", "subprocess")
# The table's metric columns (row key, heading, width): the global model's, and those a Bayesian strategy's evaluation
# adds over its posterior samples (server/evaluation.py).
METRIC_COLUMNS = (("accuracy", "accuracy", 8), ("nll", "nll", 7), ("ece", "ece", 7))
ENSEMBLE_COLUMNS = (("accuracy_ensemble", "ens_acc", 8), ("nll_ensemble", "ens_nll", 7), ("ece_ensemble", "ens_ece", 7))
LEFT_OUT_REASON_CHARS = 120  # of each left-out client's reason in a row of the table
STRING_KEYS = frozenset(key.name for key in keys_of(RunSettings) if key.type is str)  # `--set` keeps them as typed


@dataclass(frozen=True)
class Host:
    """Where a process runs: this machine, or a network namespace (`ip netns`) standing in for another
    machine that reaches the others at `address`."""

    address: str = "127.0.0.1"
    netns: str | None = None

    def command(self, argv: list[str]) -> list[str]:
        """The command line that runs `argv` on this host: as it is on this machine,
        inside `ip netns exec` in a namespace.

        Args:
            argv: the program and its arguments.

        Returns:
            A new list; `argv` itself is not changed.
        """
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def port_open(self, address: str, port: int) -> bool:
        """Whether something listens on `address`:`port` as seen from this host.

        Args:
            address: the IP address to connect to, as this host reaches it.
            port: the TCP port.

        Returns:
            True when a TCP connection (bash's /dev/tcp) succeeds within 10 s.

        Raises:
            subprocess.TimeoutExpired: the probe took longer than 10 s.
        """
        probe = ["bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]
        return subprocess.run(self.command(probe), capture_output=True, timeout=10).returncode == 0


LOOPBACK = Host()


LOCAL_POLL_INTERVAL = 0.1  # seconds between the ServerApp's polls for replies in a local federation


@dataclass
class LocalRun:
    """What `fedbayes local` runs: the strategy, K clients and the rounds, the run config's data and seed, where it
    writes, and how its ClientApps execute (`executor`, one of EXECUTORS; `parallel_tasks`)."""

    strategy: str
    clients: int
    rounds: int
    dataset: str = "fmnist"
    fraction: float = 1.0
    split: str = "iid"
    seed: int = 0
    results: Path | None = None
    workdir: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)  # --set key=value
    quiet: bool = False
    executor: str = "shared"
    parallel_tasks: int | None = None  # ClientApps computing at once; None: the machine's cores, 0: no limit
    resume: bool = False  # continue the federation held by `workdir` (it must hold one)
    resume_hint: str = ""  # the command that would resume this run, printed at its start

    def run_config(self, workdir: Path, results: Path) -> dict[str, Any]:
        """The run config the federation is submitted with: the run's core keys, then the `--set` overrides over them.

        Args:
            workdir: the federation's workdir; its name is the federation's.
            results: the results file (JSON lines) the ServerApp appends its rows to.

        Returns:
            A new dict of run-config keys (hyphenated) to values.
        """
        config = {
            "strategy": self.strategy,
            "num-server-rounds": self.rounds,
            "dataset": self.dataset,
            "fraction": self.fraction,
            "split": self.split,
            "seed": self.seed,
            "results-path": str(results),
            "federation": workdir.name,
            "wait-for-clients": self.clients,
        }
        config.update(self.overrides)
        return config


def check_run_config(run_config: dict[str, Any], clients: int, new_federation: bool = True) -> RunSettings:
    """Refuse, before any process starts, what the ServerApp or the clients would refuse after the
    federation's start-up: an unknown key, a bad value, an unknown strategy, and what tasks/preflight.py
    checks against this machine (tasks.config.ConfigError, a ValueError, names the key). The run's settings.

    Args:
        run_config: the run config to be submitted (the strategy's defaults fill the keys it leaves out).
        clients: the number of clients K the federation starts.
        new_federation: whether the run starts a new federation, whose results file must then be new or empty under
            results-exists "refuse" (False: a resume).

    Returns:
        The run's settings, parsed and checked.

    Raises:
        ValueError: an unknown key or strategy, a bad value, or a preflight check that fails (tasks.config.ConfigError
            among them).
    """
    from fedbayes.server.preflight import preflight
    from fedbayes.strategies import default_run_config

    defaults = default_run_config(str(run_config.get("strategy", "")))
    settings = run_settings({**defaults, **run_config})
    preflight(settings, clients, new_federation)
    return settings


def check_workdir(workdir: Path, resume: bool) -> None:
    """A new federation needs a new or empty workdir; --resume one that holds a federation. An existing
    workdir is never emptied: it may hold the server's checkpoints and the clients' state. Either way this
    user must be able to write in it (or make it).

    Args:
        workdir: the federation's workdir.
        resume: whether the run continues the federation `workdir` holds.

    Raises:
        ValueError: `resume` and `workdir` holds no federation; not `resume` and it holds one, or exists and is not an
            empty directory; or this user cannot write in it (or make it).
    """
    holds_federation = (workdir / FLWR_HOME).is_dir()
    if resume and not holds_federation:
        raise ValueError(f"--resume: {workdir} holds no federation to resume (no {FLWR_HOME}/ in it)")
    if not resume and holds_federation:
        raise ValueError(
            f"--workdir {workdir} already holds federation {workdir.name!r}; add --resume to continue it, "
            "or choose another --workdir (nothing was deleted)"
        )
    if not resume and workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise ValueError(
            f"--workdir {workdir} exists and is not an empty directory; choose a new or empty one (nothing was deleted)"
        )
    if problem := unwritable(workdir, directory=True):
        raise ValueError(f"--workdir: {problem}")


def run_local(spec: LocalRun) -> list[dict[str, Any]]:
    """Run the federation to completion and return its per-round results; RunFailed if it does not complete.

    Args:
        spec: the run; its workdir defaults to a new `default_workdir`, its results file to <workdir>/results.jsonl.

    Returns:
        One row per round (the results file's JSON objects), in round order.

    Raises:
        ValueError: fewer than one client or round, a bad `parallel_tasks` or executor, an unusable workdir, or a run
            config `check_run_config` refuses.
        RunFailed: the run failed, its ServerApp died, or it ended before `spec.rounds` rounds.
        RuntimeError: the SuperLink, a SuperNode or an executor exited during the run, or the SuperLink exited while
            it started.
        TimeoutError: the SuperLink did not listen within STARTUP_TIMEOUT seconds.
    """
    if spec.clients < 1 or spec.rounds < 1:
        raise ValueError("--clients and --rounds must be >= 1")
    check_parallel_tasks(spec.parallel_tasks)
    workdir = (spec.workdir or default_workdir(spec.strategy)).resolve()
    results = (spec.results or workdir / "results.jsonl").resolve()
    check_workdir(workdir, spec.resume)
    settings = check_run_config(spec.run_config(workdir, results), spec.clients, new_federation=not spec.resume)
    say = (lambda *a: None) if spec.quiet else (lambda *a: print(*a, flush=True))
    say(
        "WARNING: fedbayes local runs INSECURE (no TLS, no node authentication) on 127.0.0.1 only. "
        "Use the deploy/ path for anything that crosses a network."
    )
    if not spec.resume and settings.results_exists == "replace":
        results.unlink(missing_ok=True)  # asked for; before the run, so that no earlier row is read as this run's
    # A new federation's rows start after the lines the file holds (appended to: results-exists=append; a resume
    # writes its rows again from its checkpoint's round on, and they are read by round).
    earlier_lines = 0 if spec.resume else _line_count(results)
    local = LocalFederation(
        workdir,
        spec.executor,
        parallel_tasks=spec.parallel_tasks,
        preload_supernodes=True,
        max_message_mb=settings.max_payload_mb,
    )  # makes the workdir, starts nothing yet
    # What `--resume WORKDIR` reads (the options and run config, resolved), there before any process that could fail
    write_run_file(workdir, spec)
    with local as federation:
        for index in range(spec.clients):
            federation.start_supernode(index, spec.clients)
        submit = federation.submit(spec.run_config(workdir, results))
        say(
            f"SuperLink 127.0.0.1:{federation.fleet_port} (gRPC) + {spec.clients} SuperNodes; "
            f"logs in {federation.log_dir}"
        )
        if spec.resume_hint:
            say(f"federation {workdir.name} in {workdir}; to resume it after an interruption: {spec.resume_hint}")
        if spec.quiet:
            return federation.follow(results, submit, spec.rounds, on_row=lambda row: None, skip_lines=earlier_lines)
        table = RoundTable()
        with Progress() as progress:  # a live line on a terminal (deploy/progress.py)
            return federation.follow(
                results,
                submit,
                spec.rounds,
                on_row=lambda row: show_row(progress, row, spec.rounds, table),
                skip_lines=earlier_lines,
                on_notice=lambda notice: progress.print(f"tracking: {notice}"),
            )


def default_workdir(strategy: str) -> Path:
    """runs/<date>-<time>-<strategy>: a new one for every run, so that a run that names no workdir starts a
    new federation.

    Args:
        strategy: the run's strategy (a name or `module:attribute`); characters other than letters, digits, `.`, `_`
            and `-` become `-`.

    Returns:
        A path relative to the working directory, named after this second's local time; not created.
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "-", strategy)  # a workdir's name is its federation's: "mod:attr" -> "mod-attr"
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


class LocalFederation:
    """A SuperLink plus SuperNodes started on demand; everything stops on exit.

    By default all on 127.0.0.1 and insecure. With `tls` the SuperLink serves TLS (its Fleet API on
    `server.address`, its Control API on the server host's 127.0.0.1, where the operator's `flwr` runs)
    and, with `node_auth`, accepts only SuperNodes whose public key was registered; it then keeps its
    state in a database, so a client's node id stays the same across SuperNode and SuperLink restarts.
    """

    def __init__(
        self,
        workdir: Path,
        executor: str = "shared",
        server: Host = LOOPBACK,
        tls: TlsFiles | None = None,
        node_auth: bool = False,
        parallel_tasks: int | None = None,
        preload_supernodes: bool = False,
        max_message_mb: float | None = None,
    ) -> None:
        """`preload_supernodes`: start the SuperNodes' fork server beside the SuperLink, not with the first SuperNode
        (for a caller about to start SuperNodes on this machine's loopback). `max_message_mb`: the largest reply the
        SuperLink takes and instruction the SuperNodes take (`--max-message-mb`; None: their default, max-payload-mb's
        default); a run whose max-payload-mb is larger has its larger messages refused by them.

        Args:
            workdir: the federation's workdir; made (with its flwr-home) if it does not exist, never emptied.
            executor: how ClientApps run, one of EXECUTORS.
            server: the SuperLink's host.
            tls: the PKI files; needed for a server host other than this machine's loopback or with `node_auth`.
            node_auth: accept only SuperNodes whose public key was registered (`register`).
            parallel_tasks: ClientApps computing at once (None: this machine's cores, or no limit with a server host
                other than loopback; 0: no limit).
            preload_supernodes: see above.
            max_message_mb: see above, in MiB.

        Raises:
            ValueError: an unknown `executor`, a negative `parallel_tasks`, or no `tls` where it is needed.
        """
        if executor not in EXECUTORS:
            raise ValueError(f"ClientApp executor must be one of {EXECUTORS}, got {executor!r}")
        check_parallel_tasks(parallel_tasks)
        if parallel_tasks is None and server != LOOPBACK:
            parallel_tasks = 0  # hosts that stand for separate machines share no cores, so no compute slots
        if tls is None and (server != LOOPBACK or node_auth):
            raise ValueError("a federation beyond 127.0.0.1, or with node authentication, needs TLS (deploy/pki.py)")
        self.executor = executor
        self.server = server
        self.tls = tls
        self.node_auth = node_auth
        self.workdir = workdir
        self.log_dir = _unused_log_dir(workdir)
        self.flwr_home = workdir / FLWR_HOME
        self.flwr_home.mkdir(parents=True, exist_ok=True)  # an existing workdir is used as it is, never emptied
        self.control_port, self.fleet_port = free_ports(2)
        (self.flwr_home / "config.toml").write_text(
            connection_config(CONNECTION, f"127.0.0.1:{self.control_port}", tls.ca_cert if tls else None)
        )
        self.processes = ProcessGroup(
            self.log_dir,
            with_compute_slots(process_env(self.flwr_home), self.flwr_home / "compute-slots", parallel_tasks),
        )
        self.supernodes: dict[int, ManagedProcess] = {}
        self.superexecs: dict[int, ManagedProcess] = {}
        self.runtime_ports: dict[int, int] = {}
        self.shared_superexec: ManagedProcess | None = None
        self.serverapp_superexec: ManagedProcess | None = None  # the warm executor of the SuperLink's ServerApps
        # SuperNodes the shared executor will serve once it starts; None when it has (or with another executor)
        self.awaiting_shared: set[int] | None = set() if executor == "shared" else None
        self.preload_supernodes = preload_supernodes
        self.supernode_forks: ForkServer | None = None
        self.message_limit = [] if max_message_mb is None else [MAX_MESSAGE_OPTION, repr(float(max_message_mb))]

    def __enter__(self) -> LocalFederation:
        try:
            if self.preload_supernodes:
                self.start_supernode_forkserver()  # its imports on one core while the SuperLink starts on another
            self.start_superlink()
        except BaseException:
            self.processes.stop_all()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.processes.stop_all()

    @property
    def fleet_address(self) -> str:
        return f"{self.server.address}:{self.fleet_port}"

    def start_superlink(self) -> ManagedProcess:
        """Start the SuperLink (and, unless `executor="subprocess"`, the ServerApps' warm executor beside it) and wait
        until its Control and Fleet APIs listen.

        Returns:
            The SuperLink's process.

        Raises:
            RuntimeError: the SuperLink exited before it listened.
            TimeoutError: it did not listen within STARTUP_TIMEOUT seconds.
        """
        if self.tls is None:
            security = ["--insecure"]
        else:
            security = [
                "--ssl-ca-certfile",
                str(self.tls.ca_cert),
                "--ssl-certfile",
                str(self.tls.server_cert),
                "--ssl-keyfile",
                str(self.tls.server_key),
                "--database",
                str(self.workdir / "superlink.db"),
            ]
            security += ["--enable-supernode-auth"] if self.node_auth else []
        self.superlink_killed = False  # stopped on purpose (a test's dead server machine): `follow` goes on
        isolation = "subprocess" if self.executor == "subprocess" else "process"
        self.superlink = self.processes.start(
            "superlink",
            self.server.command(
                [
                    console_script("fedbayes"),
                    "superlink",
                    *security,
                    *self.message_limit,
                    "--isolation",
                    isolation,
                    "--disable-runtime-dependency-installation",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.control_port),
                    "--fleet-api-address",
                    self.fleet_address,
                ]
            ),
            cwd=self.workdir,
        )
        # its imports while the SuperLink starts
        self.serverapp_superexec = self.start_serverapp_superexec() if isolation == "process" else None
        self._wait_for_port("127.0.0.1", self.control_port)
        self._wait_for_port(self.server.address, self.fleet_port)
        return self.superlink

    def start_serverapp_superexec(self) -> ManagedProcess:
        """The warm executor whose forks run this SuperLink's ServerApps (on the server's host, beside it); it
        serves the SuperLink until it exits. With the shared executor on this machine's loopback it is the shared
        executor as well: it preloads the ClientApps' modules too, while the SuperLink and the SuperNodes start,
        and serves the SuperNodes `start_shared_superexec` names on its stdin.

        Returns:
            Its process, named superexec-shared where it serves the SuperNodes too, else superexec-serverapp.
        """
        shares = self.awaiting_shared is not None and self.server == LOOPBACK
        security = ["--insecure"] if self.tls is None else ["--root-certificates", str(self.tls.ca_cert)]
        command = [
            console_script("fedbayes"),
            "superexec",
            "--app",
            "serverapp",
            *security,
            "--runtime-api-address",
            f"127.0.0.1:{self.control_port}",
            "--parent-pid",
            str(self.superlink.popen.pid),
            *(["--supernodes-from-stdin"] if shares else []),
        ]
        name = "superexec-shared" if shares else "superexec-serverapp"
        return self.processes.start(name, self.server.command(command), cwd=self.workdir, stdin_pipe=shares)

    def _wait_for_port(self, address: str, port: int) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.server.port_open(address, port):
            if self.superlink.popen.poll() is not None:
                raise RuntimeError(
                    f"the SuperLink exited with code {self.superlink.popen.returncode}:\n{self.superlink.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the SuperLink did not listen on {address}:{port} within {STARTUP_TIMEOUT:.0f} s:\n"
                    f"{self.superlink.log_tail()}"
                )
            time.sleep(0.1)

    def register(self, public_key: Path) -> int | None:
        """Let the SuperNode holding this key's private half in (node authentication); its node id.

        Args:
            public_key: the SuperNode's public key file (deploy/pki.py).

        Returns:
            The node id the SuperLink bound to the key (the same one for a key it holds already).

        Raises:
            RuntimeError: the SuperLink refused the key, or the node id of a key it holds could not be read.
        """
        return register_supernode(
            public_key, CONNECTION, self.processes.env, self.server.command([]), console_script("flwr")
        )

    def start_supernode(
        self,
        index: int,
        num_partitions: int,
        extra_env: dict[str, str] | None = None,
        host: Host = LOOPBACK,
        auth_key: Path | None = None,
    ) -> ManagedProcess:
        """SuperNode `client-<index>` holding partition `index` on `host`, with its own Runtime API port. On this
        machine's loopback and with the federation's environment, it is forked from the SuperNodes' fork server
        (deploy/forkserver.py), else started as a process of its own. The shared executor (`start_shared_superexec`)
        serves it if it can: a SuperNode on this machine's loopback, with the federation's environment, started
        before that executor. Otherwise (and always with the fork executor) a warm `fedbayes superexec` of its own
        starts next to it on its host.

        Args:
            index: the client's index: its id is `client-<index>`, its partition `index` of `num_partitions`.
            num_partitions: how many partitions the training set is split into (the federation's K).
            extra_env: environment variables the SuperNode (and its own executor) gets besides the federation's; any
                makes it a process of its own with an executor of its own.
            host: where it runs.
            auth_key: its private key, needed with node authentication.

        Returns:
            The SuperNode's process (forked or started); it is not waited for.

        Raises:
            ValueError: the federation authenticates SuperNodes and `auth_key` is None.
        """
        if self.node_auth and auth_key is None:
            raise ValueError("this federation authenticates SuperNodes: pass the client's private key")
        (port,) = free_ports(1)
        config = node_config(f"client-{index}", self.workdir / "client-state", partition=(index, num_partitions))
        isolation = "subprocess" if self.executor == "subprocess" else "process"
        tls = None if self.tls is None else self.tls.ca_cert
        arguments = [
            *supernode_arguments(self.fleet_address, config, port, tls, auth_key, isolation),
            *self.message_limit,
        ]
        name = f"supernode-{index}"
        if host == LOOPBACK and not extra_env:
            node = self.processes.fork(name, self.start_supernode_forkserver(), arguments, self.workdir)
        else:
            command = [console_script("fedbayes"), "supernode", *arguments]
            node = self.processes.start(name, host.command(command), cwd=self.workdir, extra_env=extra_env)
        self.supernodes[index] = node
        self.runtime_ports[index] = port
        shareable = host == LOOPBACK and not extra_env
        if self.awaiting_shared is not None and shareable:
            self.awaiting_shared.add(index)
        elif shareable and self.tell_shared_superexec([(port, node.popen.pid)]):
            pass  # the SuperLink's executor serves it too, already warm
        elif self.executor != "subprocess":
            self.superexecs[index] = self.processes.start(
                f"superexec-{index}",
                host.command(superexec_command(console_script("fedbayes"), (port, node.popen.pid))),
                cwd=self.workdir,
                extra_env=extra_env,
            )
        return node

    def start_supernode_forkserver(self) -> ForkServer:
        """The fork server this federation's loopback SuperNodes are forked from, started if it is not running.

        Returns:
            The running fork server.
        """
        if self.supernode_forks is None or self.supernode_forks.process.poll() is not None:
            server = self.processes.start(
                "supernode-forkserver",
                [console_script("fedbayes"), "supernode-forkserver"],
                cwd=self.workdir,
                pipes=True,
            )
            assert isinstance(server.popen, subprocess.Popen)  # started, not forked
            self.supernode_forks = ForkServer(server.popen, server.log_tail)
        return self.supernode_forks

    def start_shared_superexec(self) -> None:
        """With the shared executor: one warm `fedbayes superexec` on this machine for the SuperNodes started so far
        that have no executor of their own. A SuperNode started after this call is served by it too where it is the
        SuperLink's (`tell_shared_superexec`), else it gets one of its own."""
        if self.awaiting_shared is None:  # not the shared executor, or it has been told its SuperNodes already
            return
        awaiting, self.awaiting_shared = self.awaiting_shared, None
        served = [
            (self.runtime_ports[index], self.supernodes[index].popen.pid)
            for index in sorted(awaiting)
            if index in self.supernodes
        ]  # not one stopped meanwhile
        if self.serverapp_superexec is not None and self.serverapp_superexec.name == "superexec-shared":
            self.tell_shared_superexec(served)  # the SuperLink's, reading SuperNodes from its stdin
            return
        if not served:
            return
        self.shared_superexec = self.processes.start(
            "superexec-shared", superexec_command(console_script("fedbayes"), *served), cwd=self.workdir
        )

    def tell_shared_superexec(self, served: list[tuple[int, int]]) -> bool:
        """Name SuperNodes (Runtime API port, process id) on this machine's loopback to the SuperLink's executor,
        once it is the shared one and has been told the first ones (at submission); whether it was told. Its stdin
        stays open: a SuperNode started later (a restarted client) is served by it too, without a cold executor.

        Args:
            served: (Runtime API port, SuperNode process id) per SuperNode.

        Returns:
            False when the SuperLink's executor is not the shared one, has not been told its first SuperNodes yet, or
                has
            exited; else True.
        """
        shared = self.serverapp_superexec
        if self.awaiting_shared is not None or shared is None or shared.name != "superexec-shared":
            return False
        assert isinstance(shared.popen, subprocess.Popen) and shared.popen.stdin is not None
        try:
            shared.popen.stdin.write(b"".join(f"127.0.0.1:{port} {pid}\n".encode() for port, pid in served))
            shared.popen.stdin.flush()
        except BrokenPipeError:  # it has exited: `follow` reports why
            return False
        if served:
            self.shared_superexec = shared
        return True

    def submit(self, run_config: dict[str, Any]) -> ManagedProcess:
        """`flwr run` the app with these run-config overrides; returns the streaming CLI process.

        Server checkpoints go under the workdir unless the overrides say otherwise: a local federation
        must never resume from another one's checkpoint in the user-wide default directory. Without node
        authentication a restarted SuperNode gets a new node id, so client ids may move to a new node once
        the old one has left (`client-identity=reconnect`); with it a node id is a key, and ids stay bound.
        The shared executor, if not started yet, starts now for the SuperNodes started so far.

        Args:
            run_config: the run config (`LocalRun.run_config`); it must name the `federation`.

        Returns:
            The `fedbayes run` process, started and not waited for.
        """
        self.start_shared_superexec()
        identity = "bound" if self.node_auth else "reconnect"
        # The ServerApp polls the SuperLink for replies every 0.1 s rather than the run config's default 0.5 s:
        # on loopback a poll is a cheap local call, and the default half-second wait ended every round.
        run_config = {
            "server-state-dir": str(self.workdir / "server-state"),
            "client-identity": identity,
            "poll-interval": LOCAL_POLL_INTERVAL,
            **run_config,
        }
        # the ServerApp's event stream (tasks/events.py): this submission's events are those after what it holds now
        self.events = self._event_tail(Path(run_config["server-state-dir"]) / str(run_config["federation"]))
        overrides = self.workdir / RUN_CONFIG_FILE
        overrides.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items()))
        app = write_app(self.workdir / APP, str(run_config.get("strategy", "")))
        # `fedbayes run` (deploy/flwr_run.py): `flwr run --stream` that exits non-zero, with the reason on its
        # last line, unless the run completed.
        return self.processes.start(
            "flwr-run",
            self.server.command(
                [console_script("fedbayes"), "run", str(app), CONNECTION, "--stream", "-c", str(overrides)]
            ),
            cwd=self.workdir,
        )

    @staticmethod
    def _event_tail(federation_dir: Path) -> EventTail:
        path = federation_dir / EVENTS_FILE
        start = path.stat().st_size if path.exists() else 0
        return EventTail(
            path, start, on_malformed=lambda error: print(f"fedbayes: warning: {error}; left out", file=sys.stderr)
        )

    def run_id(self, submit: ManagedProcess, timeout: float = 30.0) -> int:
        """The Flower run id a `submit` started (the CLI prints it when it starts streaming).

        Args:
            submit: the process `submit` returned.
            timeout: how long to wait for the id, in seconds.

        Returns:
            The run id.

        Raises:
            TimeoutError: the CLI's log named no run id within `timeout`.
        """
        assert submit.log_path is not None  # a federation's processes log into its workdir
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"run_id `(\d+)`", submit.log_path.read_text(errors="replace"))
            if match:
                return int(match.group(1))
            time.sleep(0.1)
        raise TimeoutError(f"no run id in {submit.log_path} after {timeout:.0f} s:\n{submit.log_tail()}")

    def run_status(self, run_id: int) -> RunStatus:
        """The run's status as the SuperLink reports it (`flwr ls`, on the server's host).

        Args:
            run_id: the Flower run id (`run_id`).

        Returns:
            Its status and details.

        Raises:
            RuntimeError: `flwr ls` gave no status for the run.
        """
        return run_status(self.server.command([console_script("flwr")]), CONNECTION, run_id, self.processes.env)

    def serverapp_pids(self) -> set[int]:
        """Live ServerApp processes of this federation (the SuperLink's executor starts one per run).

        Returns:
            Their process ids, among the processes this federation started and their descendants.
        """
        return {pid for pid in self.processes.members() if is_serverapp(pid)}

    def follow(
        self,
        results: Path,
        submit: ManagedProcess,
        rounds: int,
        on_row: Callable[[dict[str, Any]], None],
        skip_lines: int = 0,
        on_notice: Callable[[str], None] = lambda notice: None,
    ) -> list[dict[str, Any]]:
        """Hand each round's results to `on_row` as the ServerApp appends them after the file's first
        `skip_lines` lines (an earlier run's), and each tracking notice of its event stream (tasks/events.py) to
        `on_notice`; return the rows when the submission ends. Raise RuntimeError when the SuperLink or a
        SuperNode dies, RunFailed when the run fails, its ServerApp dies or it ends before `rounds` rounds. A
        submission stopped on purpose (ProcessGroup.stop) just ends the following.

        Args:
            results: the results file the ServerApp appends its rows to (JSON lines).
            submit: the `fedbayes run` process `submit` returned.
            rounds: the rounds the run is to complete.
            on_row: called once per round, with its first row, in the order the rows come.
            skip_lines: the results file's lines before this run's rows.
            on_notice: called with each tracking notice's message.

        Returns:
            The last row of each round, in round order.

        Raises:
            RuntimeError: the SuperLink, a SuperNode or an executor exited during the run.
            RunFailed: the submission exited non-zero (the reason from the run's events or its last line), ended before
                `rounds` rounds, or the ServerApp died without reporting an outcome.
        """
        rows: dict[int, dict[str, Any]] = {}  # by round: a resumed run writes again the rounds after its checkpoint
        serverapp = _ServerAppWatch(self, submit)
        ended: list[Event] = []  # the run's run_ended event, once it came
        while True:
            finished = submit.popen.poll() is not None
            for row in _read_rows(results, skip_lines):
                if row["round"] not in rows:
                    on_row(row)
                rows[row["round"]] = row
            for event in self.events.read():  # after the rows: a row is written before its tracking can fail
                if event.type == TRACKING:
                    on_notice(event.fields["message"])
                ended += [event] if event.type == RUN_ENDED else []
            # Checked before `finished`: a dying SuperLink also ends `flwr run`, and that is no normal end.
            self._raise_for_exited_daemons()
            if finished:
                in_order = [rows[number] for number in sorted(rows)]
                if not submit.stopped:
                    self._check_outcome(submit, len(in_order), rounds, ended[-1] if ended else None)
                return in_order
            if len(rows) < rounds:  # after its last row the ServerApp ends by itself: no need to ask why it is gone
                try:
                    serverapp.check()
                except RuntimeError:
                    self._raise_for_exited_daemons()  # a SuperLink that died meanwhile is the reason, not `flwr ls`'s
                    raise
            time.sleep(0.2)

    def _raise_for_exited_daemons(self) -> None:
        """RuntimeError naming the first of the SuperLink (unless killed on purpose), the SuperNodes and the
        executors that has exited, with its log's tail; nothing while all run."""
        superlink = [] if self.superlink_killed else [self.superlink]
        shared = [] if self.shared_superexec is None else [self.shared_superexec]
        for daemon in (*superlink, *self.supernodes.values(), *self.superexecs.values(), *shared):
            if daemon.popen.poll() is not None:
                raise RuntimeError(
                    f"{daemon.name} exited with code {daemon.popen.returncode} during the run:\n{daemon.log_tail()}"
                )

    @staticmethod
    def _submission_failure(submit: ManagedProcess) -> str:
        """The reason `fedbayes run` gave on its last such line (one that starts `fedbayes run failed: `; the
        ServerApp's lines start with their level), or its exit code where it gave none."""
        assert submit.log_path is not None  # a federation's processes log into its workdir
        lines = submit.log_path.read_text(errors="replace").splitlines()
        own = next((line for line in reversed(lines) if line.startswith(RUN_FAILED)), None)
        reason = failure_reason(own) if own is not None else None
        return reason or f"`fedbayes run` exited with code {submit.popen.returncode}"

    def _check_outcome(self, submit: ManagedProcess, rounds_done: int, rounds: int, ended: Event | None) -> None:
        """RunFailed unless the submission completed its `rounds`: why, from the ServerApp's run_ended event
        (`ended`), else from `fedbayes run`'s last line (`fedbayes run failed: <reason>`, deploy/flwr_run.py)."""
        if submit.popen.returncode != 0:
            reason = ended.fields["reason"] if ended is not None and ended.fields["outcome"] == FAILED else None
            reason = reason or self._submission_failure(submit)
            raise RunFailed(f"{reason} (logs in {self.log_dir})")
        if rounds_done < rounds:
            raise RunFailed(f"the run ended after {rounds_done} of {rounds} rounds (logs in {self.log_dir})")


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, typed value): the string itself for a core key whose values are strings (`hidden=100` is
    one layer of 100, not a number), else bools, ints, floats, else the string. Keys are spelled with hyphens
    (`proximal-mu`); `proximal_mu` means the same.

    Args:
        text: one `--set` argument, `key=value`.

    Returns:
        The hyphenated key and its value.

    Raises:
        ValueError: `text` has no `=` or an empty key.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key = key.replace("_", "-")
    if key in STRING_KEYS:
        return key, raw
    if raw in ("true", "false"):
        return key, raw == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def table_header(ensemble: bool = False) -> str:
    """The header of the table of rounds (`format_row`), with the ensemble's columns or without.

    Args:
        ensemble: with the columns of the ensemble's metrics.

    Returns:
        One line, without a newline.
    """
    columns = METRIC_COLUMNS + (ENSEMBLE_COLUMNS if ensemble else ())
    return f" round  {'  '.join(f'{heading:>{width}}' for _, heading, width in columns)}  clients  round_s   wall_s"


TABLE_HEADER = table_header()


def format_row(row: dict[str, Any], ensemble: bool | None = None) -> str:
    """A row of `table_header(ensemble)`'s table (`ensemble` None: with the ensemble's columns where the row has its
    metrics): `-` for the metrics of a round the server did not evaluate (`eval-every`), how many test examples a
    round evaluated on part of the test set (`eval-fraction`) used, and the clients the round left out, with why.

    Args:
        row: a round's row of the results file (its round, metrics, clients, clients_sent, round_seconds and
            wall_seconds, and where present eval_fraction, eval_examples and rejected).
        ensemble: whether the table has the ensemble's columns; None: whether the row has them.

    Returns:
        One line, without a newline.
    """
    if ensemble is None:
        ensemble = "accuracy_ensemble" in row
    columns = METRIC_COLUMNS + (ENSEMBLE_COLUMNS if ensemble else ())
    metrics = "  ".join(
        f"{row[key]:{width}.4f}" if row.get(key) is not None else f"{'-':>{width}}" for key, _, width in columns
    )
    clients = f"{row['clients']}/{row['clients_sent']}"
    line = f"{row['round']:>6}  {metrics}  {clients:>7}  {row['round_seconds']:>7.1f}  {row['wall_seconds']:>7.1f}"
    if 0 < row.get("eval_fraction", 1.0) < 1:
        line += f"  (on {row['eval_examples']} test examples)"
    if left_out := row.get("rejected"):
        line += f"  ({left_out_note(left_out)})"
    return line


def left_out_note(rejected: dict[str, str]) -> str:
    """`2 left out: client-1: <reason>; node 7: <reason>`: each client the round's row lists (server/round_core.py),
    by its id where its label names one, in order, and the start of why (LEFT_OUT_REASON_CHARS).

    Args:
        rejected: a row's `rejected`: client label -> why it was left out; not empty.

    Returns:
        One line.
    """
    reasons = []
    for label, reason in sorted(rejected.items()):
        client = re.fullmatch(r"client '([^']*)' \(node \d+\)", label)
        short = reason if len(reason) <= LEFT_OUT_REASON_CHARS else f"{reason[: LEFT_OUT_REASON_CHARS - 3]}..."
        reasons.append(f"{client.group(1) if client else label}: {short}")
    return f"{len(rejected)} left out: {'; '.join(reasons)}"


class RoundTable:
    """The table of rounds `fedbayes local` prints: its header with the first row, with the ensemble's columns when
    that row has the ensemble's metrics (a Bayesian strategy's evaluated round). Where the first row brings none (its
    round not evaluated, `eval-every`) and a later one does, the header is printed again there, with them."""

    def __init__(self) -> None:
        self.ensemble: bool | None = None  # None: no row yet

    def lines(self, row: dict[str, Any]) -> list[str]:
        """The row's line, after the header where one is due.

        Args:
            row: the round's row of the results file.

        Returns:
            The header where one is due (the first row; the first with the ensemble's metrics after rows without), then
            the row's line.
        """
        has_ensemble = "accuracy_ensemble" in row
        header = []
        if self.ensemble is None or (has_ensemble and not self.ensemble):
            self.ensemble = has_ensemble
            header = [table_header(has_ensemble)]
        return [*header, format_row(row, self.ensemble)]


class _ServerAppWatch:
    """Tells when the ServerApp of the run being followed died without a word (SIGKILL, out of memory).
    Flower notices only when its heartbeat lapses, up to a minute later, and `flwr run --stream` waits
    for that; here it takes a second. A ServerApp that ends by itself reports its outcome before it
    exits, so one that is gone while its run is not finished died. `follow` asks only until the run's last
    row is in: the ServerApp then ends by itself, and asking the run's status costs a `flwr` process
    (about 1.5 CPU-s) beside `fedbayes run`'s own on the way out of every run."""

    def __init__(self, federation: LocalFederation, submit: ManagedProcess) -> None:
        self.federation = federation
        self.submit = submit
        self.earlier = federation.serverapp_pids()  # an earlier run's ServerApp may still be on its way out
        self.seen: set[int] = set()
        self.next_check = 0.0

    def check(self) -> None:
        if self.federation.superlink_killed or time.monotonic() < self.next_check:
            return
        self.next_check = time.monotonic() + 1.0
        alive = self.federation.serverapp_pids() - self.earlier
        if alive or not self.seen:
            self.seen |= alive
            return
        run_id = self.federation.run_id(self.submit)
        status = self.federation.run_status(run_id)
        if not status.finished:
            raise RunFailed(
                f"the ServerApp of run {run_id} (pid {', '.join(map(str, sorted(self.seen)))}) died "
                f"without reporting an outcome (killed?); logs in {self.federation.log_dir}"
            )
        self.earlier |= self.seen  # it ended normally; the submission ends with the run's stream
        self.seen = set()


def check_parallel_tasks(parallel_tasks: int | None) -> None:
    """Refuse a `--parallel-tasks` of which no compute slots can be made.

    Args:
        parallel_tasks: ClientApps computing at once (None: the machine's cores; 0: no limit).

    Raises:
        ValueError: `parallel_tasks` is negative.
    """
    if parallel_tasks is not None and parallel_tasks < 0:
        raise ValueError(f"--parallel-tasks must be >= 0 (0: no limit), got {parallel_tasks}")


def with_compute_slots(env: dict[str, str], directory: Path, parallel_tasks: int | None) -> dict[str, str]:
    """`env` with this federation's compute slots (tasks/slots.py), `parallel_tasks` of them (None: one per core
    this process may use; 0: none, and no limit).

    Args:
        env: the environment the federation's processes get.
        directory: where the slots' lock files go; made where there are slots.
        parallel_tasks: how many slots.

    Returns:
        A new environment: `env` without an enclosing federation's slots, with this one's where there are any.
    """
    env = {name: value for name, value in env.items() if name != SLOTS_ENV}  # never an enclosing federation's
    count = len(os.sched_getaffinity(0)) if parallel_tasks is None else parallel_tasks
    if count:
        directory.mkdir(parents=True, exist_ok=True)
        env[SLOTS_ENV] = f"{count}:{directory}"
    return env


def show_row(progress: Progress, row: dict[str, Any], rounds: int, table: RoundTable | None = None) -> None:
    """A round's row in the table (`table`'s, with its header where one is due; None: the row alone), the strategy's
    warnings of that round, and the progress line after it (of a run of `rounds` rounds).

    Args:
        progress: the live progress line the lines are printed above.
        row: the round's row of the results file.
        rounds: the run's rounds.
        table: the table the row belongs to.
    """
    for line in table.lines(row) if table is not None else [format_row(row)]:
        progress.print(line)
    for warning in row.get("warnings", ()):
        progress.print(f"  warning: {warning}")
    progress.round_done(RoundDone(row["round"], rounds, row["accuracy"], row["clients"], row["clients_sent"]))


def _unused_log_dir(workdir: Path) -> Path:
    """<workdir>/logs, or for a later start in the same workdir (a resume) logs-2, logs-3, ...: the logs of
    the start that failed are what tells why."""
    candidates = (workdir / ("logs" if number == 1 else f"logs-{number}") for number in itertools.count(1))
    return next(path for path in candidates if not path.exists() or not any(path.iterdir()))


def _read_rows(results: Path, skip_lines: int = 0) -> list[dict[str, Any]]:
    """The rows after the file's first `skip_lines` lines (an earlier run's, never parsed), read a line at a time:
    the last piece may be a line being written, and a line over 16 MiB is no row (as to the ServerApp)."""
    if not results.exists():
        return []
    lines = (line.text for line in complete_lines(results) if line.number > skip_lines)
    return [json.loads(text) for text in lines if text is not None and text.strip()]


def _line_count(path: Path) -> int:
    """Lines in `path` (0 if there is none), a last one without a newline included: ResultsLog ends it before it
    appends. Read a line at a time: the file may be a user's, of any size."""
    if not path.exists():
        return 0
    number = end = 0
    for line in complete_lines(path):
        number, end = line.number, line.end
    return number + (path.stat().st_size > end)
