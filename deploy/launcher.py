"""`fedbayes local`: a real federation on this machine, one OS process per party, gRPC on loopback.

Starts a SuperLink and K SuperNodes (each with its own `client-id` and partition), submits the app
with `flwr run`, prints one table row per round as the ServerApp writes it, and stops every process
it started (also on Ctrl-C or when one of them fails). Insecure by design: loopback only.

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

from deploy.processes import ManagedProcess, ProcessGroup, free_ports, wait_for_port

APP_DIR = Path(__file__).resolve().parents[1]
CONNECTION = "fedbayes-local"
STARTUP_TIMEOUT = 60.0
EXECUTORS = ("fork", "subprocess")
TABLE_HEADER = " round  accuracy      nll      ece  clients  round_s   wall_s"


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


def run_local(spec: LocalRun) -> list[dict[str, Any]]:
    """Run the federation to completion and return its per-round results."""
    if spec.clients < 1 or spec.rounds < 1:
        raise ValueError("--clients and --rounds must be >= 1")
    workdir = (spec.workdir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.strategy}").resolve()
    results = (spec.results or workdir / "results.jsonl").resolve()
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
    """A SuperLink on 127.0.0.1 plus SuperNodes started on demand; everything stops on exit."""

    def __init__(self, workdir: Path, executor: str = "fork") -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"ClientApp executor must be one of {EXECUTORS}, got {executor!r}")
        self.executor = executor
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
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.control_port}"\ninsecure = true\n'
        )
        self.processes = ProcessGroup(self.log_dir, process_env(self.flwr_home))
        self.supernodes: dict[int, ManagedProcess] = {}
        self.superexecs: dict[int, ManagedProcess] = {}

    def __enter__(self) -> LocalFederation:
        try:
            self.superlink = self.processes.start(
                "superlink",
                [_tool("flower-superlink"), "--insecure", "--isolation", "subprocess",
                 "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
                 "--port", str(self.control_port), "--fleet-api-address", f"127.0.0.1:{self.fleet_port}"],
                cwd=self.workdir,
            )
            wait_for_port(self.control_port, STARTUP_TIMEOUT, self.superlink)
            wait_for_port(self.fleet_port, STARTUP_TIMEOUT, self.superlink)
        except BaseException:
            self.processes.stop_all()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.processes.stop_all()

    def start_supernode(
        self, index: int, num_partitions: int, extra_env: dict[str, str] | None = None
    ) -> ManagedProcess:
        """SuperNode `client-<index>` holding partition `index`, with its own Runtime API port (and, with
        the fork executor, its own warm `fedbayes superexec`)."""
        (port,) = free_ports(1)
        state_dir = json.dumps(str(self.workdir / "client-state"))
        node_config = (
            f'client-id="client-{index}" partition-id={index} num-partitions={num_partitions} state-dir={state_dir}'
        )
        node = self.processes.start(
            f"supernode-{index}",
            [_tool("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.fleet_port}",
             "--port", str(port), "--node-config", node_config,
             "--isolation", "process" if self.executor == "fork" else "subprocess"],
            cwd=self.workdir,
            extra_env=extra_env,
        )
        self.supernodes[index] = node
        if self.executor == "fork":
            self.superexecs[index] = self.processes.start(
                f"superexec-{index}",
                [_tool("fedbayes"), "superexec", "--insecure", "--runtime-api-address", f"127.0.0.1:{port}",
                 "--parent-pid", str(node.popen.pid)],
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

    def submit(self, run_config: dict[str, Any]) -> ManagedProcess:
        """`flwr run` the app with these run-config overrides; returns the streaming CLI process.

        Server checkpoints go under the workdir unless the overrides say otherwise: a local federation
        must never resume from another one's checkpoint in the user-wide default directory.
        """
        run_config = {"server-state-dir": str(self.workdir / "server-state"), **run_config}
        overrides = self.workdir / "run-config.toml"
        overrides.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items()))
        return self.processes.start(
            "flwr-run",
            [_tool("flwr"), "run", str(APP_DIR), CONNECTION, "--stream", "-c", str(overrides)],
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
        subprocess.run([_tool("flwr"), "stop", str(run_id), CONNECTION], cwd=self.workdir, env=self.processes.env,
                       check=True, capture_output=True, timeout=60)

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
            if finished or len(rows) >= rounds:
                _wait(submit, 30)
                return rows
            for daemon in (self.superlink, *self.supernodes.values(), *self.superexecs.values()):
                if daemon.popen.poll() is not None:
                    raise RuntimeError(
                        f"{daemon.name} exited with code {daemon.popen.returncode} during the run:\n{daemon.log_tail()}"
                    )
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


def _tool(name: str) -> str:
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
