"""`fedbayes local`: a real federation on this machine, one OS process per party, gRPC on loopback.

Starts a SuperLink and K SuperNodes (each with its own `client-id` and partition), submits the app
with `flwr run`, prints one table row per round as the ServerApp writes it, and stops every process
it started (also on Ctrl-C or when one of them fails). Insecure by design: loopback only.

The same LocalFederation also runs a secured federation across hosts (TLS + SuperNode authentication,
deploy/pki.py), where a host is this machine or a Linux network namespace with its own IP standing in
for another machine (tests/test_system_netns.py). Without TLS it refuses anything but 127.0.0.1.

ClientApps run, by default, as forks of a warm `fedbayes superexec` per SuperNode (deploy/warm_executor.py);
`executor="subprocess"` keeps Flower's stock path, a fresh `flwr-clientapp` process per message.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.client import node_config, superexec_command, supernode_command
from deploy.pki import TlsFiles, connection_config, register_supernode
from deploy.processes import ManagedProcess, ProcessGroup, free_ports, kill_tree

APP_DIR = Path(__file__).resolve().parents[1]
CONNECTION = "fedbayes-local"
STARTUP_TIMEOUT = 60.0
EXECUTORS = ("fork", "subprocess")
TABLE_HEADER = " round  accuracy      nll      ece  clients  round_s   wall_s"


@dataclass(frozen=True)
class Host:
    """Where a process runs: this machine, or a network namespace (`ip netns`) standing in for another
    machine that reaches the others at `address`."""

    address: str = "127.0.0.1"
    netns: str | None = None

    def command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def port_open(self, address: str, port: int) -> bool:
        """Whether something listens on `address`:`port` as seen from this host."""
        probe = ["bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]
        return subprocess.run(self.command(probe), capture_output=True, timeout=10).returncode == 0


LOOPBACK = Host()


@dataclass
class LocalRun:
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
    executor: str = "fork"

    def run_config(self, workdir: Path, results: Path) -> dict[str, Any]:
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


def stop_processes_on_signals() -> None:
    """Make SIGTERM and SIGINT unwind through `with LocalFederation(...)`, which stops every process
    it started. (A background job ignores SIGINT unless told otherwise; SIGTERM would kill us outright.)"""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)


def check_run_config(run_config: dict[str, Any]) -> None:
    """Refuse, before any process starts, a run config the ServerApp would refuse after its start-up: an
    unknown key, a bad value, an unknown strategy (tasks.config.ConfigError, a ValueError, names it)."""
    from strategies import get_algorithm
    from tasks.config import ConfigError, RunSettings, pyproject_run_config

    defaults = pyproject_run_config(APP_DIR / "pyproject.toml")
    unknown = sorted(set(run_config) - set(defaults))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {', '.join(unknown)}; they are listed in pyproject.toml")
    get_algorithm(RunSettings.from_run_config({**defaults, **run_config}).strategy)


def run_local(spec: LocalRun) -> list[dict[str, Any]]:
    """Run the federation to completion and return its per-round results."""
    if spec.clients < 1 or spec.rounds < 1:
        raise ValueError("--clients and --rounds must be >= 1")
    workdir = (spec.workdir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.strategy}").resolve()
    results = (spec.results or workdir / "results.jsonl").resolve()
    check_run_config(spec.run_config(workdir, results))
    say = (lambda *a: None) if spec.quiet else (lambda *a: print(*a, flush=True))
    say(
        "WARNING: fedbayes local runs INSECURE (no TLS, no node authentication) on 127.0.0.1 only. "
        "Use the deploy/ path for anything that crosses a network."
    )
    results.unlink(missing_ok=True)  # an earlier run's rows must not be read as this run's
    with LocalFederation(workdir, spec.executor) as federation:
        for index in range(spec.clients):
            federation.start_supernode(index, spec.clients)
        submit = federation.submit(spec.run_config(workdir, results))
        say(f"SuperLink 127.0.0.1:{federation.fleet_port} (gRPC) + {spec.clients} SuperNodes; logs in {federation.log_dir}")
        say(TABLE_HEADER)
        rows = federation.follow(results, submit, spec.rounds, on_row=lambda row: say(format_row(row)))
    if len(rows) < spec.rounds:
        raise RuntimeError(
            f"the run ended after {len(rows)} of {spec.rounds} rounds; see {federation.log_dir}:\n{submit.log_tail(40)}"
        )
    return rows


class LocalFederation:
    """A SuperLink plus SuperNodes started on demand; everything stops on exit.

    By default all on 127.0.0.1 and insecure. With `tls` the SuperLink serves TLS (its Fleet API on
    `server.address`, its Control API on the server host's 127.0.0.1, where the operator's `flwr` runs)
    and, with `node_auth`, accepts only SuperNodes whose public key was registered; it then keeps its
    state in a database, so a client's node id stays the same across SuperNode and SuperLink restarts.
    """

    def __init__(
        self, workdir: Path, executor: str = "fork", server: Host = LOOPBACK, tls: TlsFiles | None = None,
        node_auth: bool = False,
    ) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"ClientApp executor must be one of {EXECUTORS}, got {executor!r}")
        if tls is None and (server != LOOPBACK or node_auth):
            raise ValueError("a federation beyond 127.0.0.1, or with node authentication, needs TLS (deploy/pki.py)")
        self.executor = executor
        self.server = server
        self.tls = tls
        self.node_auth = node_auth
        if not (APP_DIR / "pyproject.toml").is_file():
            raise FileNotFoundError(f"the Flower app (pyproject.toml) is not at {APP_DIR}; run from a source checkout")
        if workdir.exists():
            shutil.rmtree(workdir)
        self.workdir = workdir
        self.log_dir = workdir / "logs"
        self.flwr_home = workdir / "flwr-home"
        self.flwr_home.mkdir(parents=True)
        self.control_port, self.fleet_port = free_ports(2)
        (self.flwr_home / "config.toml").write_text(
            connection_config(CONNECTION, f"127.0.0.1:{self.control_port}", tls.ca_cert if tls else None)
        )
        self.processes = ProcessGroup(self.log_dir, process_env(self.flwr_home))
        self.supernodes: dict[int, ManagedProcess] = {}
        self.superexecs: dict[int, ManagedProcess] = {}

    def __enter__(self) -> LocalFederation:
        try:
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
        if self.tls is None:
            security = ["--insecure"]
        else:
            security = ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
                        "--ssl-keyfile", str(self.tls.server_key), "--database", str(self.workdir / "superlink.db")]
            security += ["--enable-supernode-auth"] if self.node_auth else []
        self.superlink_killed = False
        self.superlink = self.processes.start(
            "superlink",
            self.server.command(
                [console_script("flower-superlink"), *security, "--isolation", "subprocess",
                 "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                 "--port", str(self.control_port), "--fleet-api-address", self.fleet_address]
            ),
            cwd=self.workdir,
        )
        self._wait_for_port("127.0.0.1", self.control_port)
        self._wait_for_port(self.server.address, self.fleet_port)
        return self.superlink

    def kill_superlink(self) -> None:
        """SIGKILL the SuperLink with its ServerApp and executor: the server machine dies mid-run."""
        kill_tree(self.superlink.popen.pid)
        self.superlink.popen.wait(timeout=30)
        self.superlink_killed = True  # on purpose: `follow` does not take it for a crash

    def _wait_for_port(self, address: str, port: int) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self.server.port_open(address, port):
            if self.superlink.popen.poll() is not None:
                raise RuntimeError(f"the SuperLink exited with code {self.superlink.popen.returncode}:\n"
                                   f"{self.superlink.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the SuperLink did not listen on {address}:{port} within {STARTUP_TIMEOUT:.0f} s:\n"
                                   f"{self.superlink.log_tail()}")
            time.sleep(0.1)

    def register(self, public_key: Path) -> int | None:
        """Let the SuperNode holding this key's private half in (node authentication); its node id."""
        return register_supernode(public_key, CONNECTION, self.processes.env, self.server.command([]), console_script("flwr"))

    def start_supernode(
        self, index: int, num_partitions: int, extra_env: dict[str, str] | None = None, host: Host = LOOPBACK,
        auth_key: Path | None = None,
    ) -> ManagedProcess:
        """SuperNode `client-<index>` holding partition `index` on `host`, with its own Runtime API port
        (and, with the fork executor, its own warm `fedbayes superexec` next to it on that host)."""
        if self.node_auth and auth_key is None:
            raise ValueError("this federation authenticates SuperNodes: pass the client's private key")
        (port,) = free_ports(1)
        config = node_config(f"client-{index}", self.workdir / "client-state", partition=(index, num_partitions))
        isolation = "process" if self.executor == "fork" else "subprocess"
        tls = None if self.tls is None else self.tls.ca_cert
        node = self.processes.start(
            f"supernode-{index}",
            host.command(supernode_command(console_script("flower-supernode"), self.fleet_address, config, port, tls, auth_key,
                                           isolation)),
            cwd=self.workdir,
            extra_env=extra_env,
        )
        self.supernodes[index] = node
        if self.executor == "fork":
            self.superexecs[index] = self.processes.start(
                f"superexec-{index}",
                host.command(superexec_command(console_script("fedbayes"), port, node.popen.pid)),
                cwd=self.workdir,
                extra_env=extra_env,
            )
        return node

    def stop_supernode(self, index: int, timeout: float = 30.0) -> None:
        """Stop SuperNode `index` (and its superexec) and wait until it is gone, e.g. to restart it."""
        for daemon in (self.supernodes.pop(index), self.superexecs.pop(index, None)):
            if daemon is not None:
                self.processes.stop(daemon)
                daemon.popen.wait(timeout=timeout)

    def kill_supernode(self, index: int) -> None:
        """SIGKILL SuperNode `index`, its superexec and any ClientApp running: the client machine dies."""
        for daemon in (self.supernodes.pop(index), self.superexecs.pop(index, None)):
            if daemon is not None:
                kill_tree(daemon.popen.pid)
                daemon.popen.wait(timeout=30)

    def submit(self, run_config: dict[str, Any]) -> ManagedProcess:
        """`flwr run` the app with these run-config overrides; returns the streaming CLI process.

        Server checkpoints go under the workdir unless the overrides say otherwise: a local federation
        must never resume from another one's checkpoint in the user-wide default directory. Without node
        authentication a restarted SuperNode gets a new node id, so client ids may move to a new node once
        the old one has left (`client-identity=reconnect`); with it a node id is a key, and ids stay bound.
        """
        identity = "bound" if self.node_auth else "reconnect"
        run_config = {"server-state-dir": str(self.workdir / "server-state"), "client-identity": identity,
                      **run_config}
        overrides = self.workdir / "run-config.toml"
        overrides.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items()))
        return self.processes.start(
            "flwr-run",
            self.server.command([console_script("flwr"), "run", str(APP_DIR), CONNECTION, "--stream", "-c", str(overrides)]),
            cwd=self.workdir,
        )

    def run_id(self, submit: ManagedProcess, timeout: float = 30.0) -> int:
        """The Flower run id a `submit` started (the CLI prints it when it starts streaming)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"run_id `(\d+)`", submit.log_path.read_text(errors="replace"))
            if match:
                return int(match.group(1))
            time.sleep(0.1)
        raise TimeoutError(f"no run id in {submit.log_path} after {timeout:.0f} s:\n{submit.log_tail()}")

    def stop_run(self, run_id: int) -> None:
        """`flwr stop`: the SuperLink marks the run stopped at once (after a ServerApp crash it would
        take Flower's heartbeat timeout, up to 60 s, during which SuperNodes hold the dead run's messages)."""
        subprocess.run(self.server.command([console_script("flwr"), "stop", str(run_id), CONNECTION]), cwd=self.workdir,
                       env=self.processes.env, check=True, capture_output=True, timeout=60)

    def follow(
        self, results: Path, submit: ManagedProcess, rounds: int, on_row: Callable[[dict[str, Any]], None]
    ) -> list[dict[str, Any]]:
        """Hand each round's results to `on_row` as the ServerApp appends them; return when the
        run ends, raise when the SuperLink or a SuperNode dies."""
        rows: list[dict[str, Any]] = []
        while True:
            finished = submit.popen.poll() is not None
            for row in _read_rows(results)[len(rows):]:
                rows.append(row)
                on_row(row)
            # Checked before `finished`: a dying SuperLink also ends `flwr run`, and that is no normal end.
            superlink = [] if self.superlink_killed else [self.superlink]
            for daemon in (*superlink, *self.supernodes.values(), *self.superexecs.values()):
                if daemon.popen.poll() is not None:
                    raise RuntimeError(
                        f"{daemon.name} exited with code {daemon.popen.returncode} during the run:\n{daemon.log_tail()}"
                    )
            if finished or len(rows) >= rounds:
                _wait(submit, 30)
                return rows
            time.sleep(0.2)


def process_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Flower daemons start their helpers (flower-superexec, flwr-clientapp) by name from PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        # SuperExec asks its SuperNode for a new task every 1 s by default: up to 1 s lost per round.
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL=env.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        FEDBAYES_THREADS=env.get("FEDBAYES_THREADS", "1"),
        PYTHONUNBUFFERED="1",
    )
    return env


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` -> (key, typed value): bools, ints, floats, else the string itself. Keys are
    spelled with hyphens (`proximal-mu`); `proximal_mu` means the same."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key = key.replace("_", "-")
    if raw in ("true", "false"):
        return key, raw == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def format_row(row: dict[str, Any]) -> str:
    clients = f"{row['clients']}/{row['clients_sent']}"
    return (
        f"{row['round']:>6}  {row['accuracy']:>8.4f}  {row['nll']:>7.4f}  {row['ece']:>7.4f}  {clients:>7}"
        f"  {row['round_seconds']:>7.1f}  {row['wall_seconds']:>7.1f}"
    )


def console_script(name: str) -> str:
    """Flower's console scripts from this interpreter's environment."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"'{name}' not found; install the project (make install)")
    return found


def _wait(process: ManagedProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while process.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)


def _read_rows(results: Path) -> list[dict[str, Any]]:
    if not results.exists():
        return []
    complete_lines = results.read_text().split("\n")[:-1]  # the last piece may be a line being written
    return [json.loads(line) for line in complete_lines if line.strip()]
