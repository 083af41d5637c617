"""`fedbayes local`: a real federation on this machine, one OS process per party, gRPC on loopback.

Starts a SuperLink and K SuperNodes (each with its own `client-id` and partition), submits the app
with `flwr run`, prints one table row per round as the ServerApp writes it, and stops every process
it started (also on Ctrl-C or when one of them fails). Insecure by design: loopback only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.processes import ManagedProcess, ProcessGroup, free_ports, wait_for_port

APP_DIR = Path(__file__).resolve().parents[1]
CONNECTION = "fedbayes-local"
STARTUP_TIMEOUT = 60.0

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


def process_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
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
    """`key=value` -> (key, typed value): bools, ints, floats, else the string itself."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set expects key=value, got {text!r}")
    if raw in ("true", "false"):
        return key, raw == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def run_local(spec: LocalRun) -> list[dict[str, Any]]:
    """Run the federation to completion and return its per-round results."""
    if spec.clients < 1 or spec.rounds < 1:
        raise ValueError("--clients and --rounds must be >= 1")
    if not (APP_DIR / "pyproject.toml").is_file():
        raise FileNotFoundError(f"the Flower app (pyproject.toml) is not at {APP_DIR}; run from a source checkout")
    workdir = (spec.workdir or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{spec.strategy}").resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    results = (spec.results or workdir / "results.jsonl").resolve()
    flwr_home = workdir / "flwr-home"
    flwr_home.mkdir(parents=True)
    results.unlink(missing_ok=True)
    control_port, fleet_port, *node_ports = free_ports(2 + spec.clients)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n'
        f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{control_port}"\ninsecure = true\n'
    )
    overrides = workdir / "run-config.toml"
    overrides.write_text(
        "".join(f"{key} = {toml_value(value)}\n" for key, value in spec.run_config(workdir, results).items())
    )
    say = (lambda *a: None) if spec.quiet else (lambda *a: print(*a, flush=True))
    say(
        "WARNING: fedbayes local runs INSECURE (no TLS, no node authentication) on 127.0.0.1 only. "
        "Use the deploy/ path for anything that crosses a network."
    )
    with ProcessGroup(workdir / "logs", process_env(flwr_home)) as processes:
        (workdir / "process-groups.json").write_text("[]")
        superlink = processes.start(
            "superlink",
            [_tool("flower-superlink"), "--insecure", "--isolation", "subprocess",
             "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(control_port),
             "--fleet-api-address", f"127.0.0.1:{fleet_port}"],
            cwd=workdir,
        )
        wait_for_port(control_port, STARTUP_TIMEOUT, superlink)
        wait_for_port(fleet_port, STARTUP_TIMEOUT, superlink)
        nodes = [
            processes.start(
                f"supernode-{index}",
                [_tool("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{fleet_port}",
                 "--port", str(port), "--node-config", _node_config(index, spec.clients, workdir)],
                cwd=workdir,
            )
            for index, port in enumerate(node_ports)
        ]
        submit = processes.start(
            "flwr-run", [_tool("flwr"), "run", str(APP_DIR), CONNECTION, "--stream", "-c", str(overrides)], cwd=workdir
        )
        (workdir / "process-groups.json").write_text(json.dumps(processes.process_group_ids()))
        say(f"SuperLink 127.0.0.1:{fleet_port} (gRPC) + {spec.clients} SuperNodes; logs in {workdir / 'logs'}")
        rows = _follow(results, submit, [superlink, *nodes], spec.rounds, say)
    if len(rows) < spec.rounds:
        raise RuntimeError(
            f"the run ended after {len(rows)} of {spec.rounds} rounds; see {workdir / 'logs'}:\n{submit.log_tail(40)}"
        )
    return rows


def _node_config(index: int, num_clients: int, workdir: Path) -> str:
    state_dir = json.dumps(str(workdir / "client-state"))
    return f'client-id="client-{index}" partition-id={index} num-partitions={num_clients} state-dir={state_dir}'


def _tool(name: str) -> str:
    """Flower's console scripts from this interpreter's environment."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"'{name}' not found; install the project (make install)")
    return found


def _follow(
    results: Path, submit: ManagedProcess, daemons: list[ManagedProcess], rounds: int, say
) -> list[dict[str, Any]]:
    """Print rows as the ServerApp appends them; stop on completion or when a daemon dies."""
    rows: list[dict[str, Any]] = []
    say(" round  accuracy      nll      ece  clients  round_s   wall_s")
    while True:
        finished = submit.popen.poll() is not None
        for row in _read_rows(results)[len(rows):]:
            rows.append(row)
            say(_format_row(row))
        if finished or len(rows) >= rounds:
            if len(rows) >= rounds:
                _wait(submit, 30)
            return rows
        for daemon in daemons:
            if daemon.popen.poll() is not None:
                raise RuntimeError(
                    f"{daemon.name} exited with code {daemon.popen.returncode} during the run:\n{daemon.log_tail()}"
                )
        time.sleep(0.2)


def _wait(process: ManagedProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while process.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)


def _read_rows(results: Path) -> list[dict[str, Any]]:
    if not results.exists():
        return []
    complete_lines = results.read_text().split("\n")[:-1]  # the last piece may be a line being written
    return [json.loads(line) for line in complete_lines if line.strip()]


def _format_row(row: dict[str, Any]) -> str:
    clients = f"{row['clients']}/{row['clients_sent']}"
    return (
        f"{row['round']:>6}  {row['accuracy']:>8.4f}  {row['nll']:>7.4f}  {row['ece']:>7.4f}  {clients:>7}"
        f"  {row['round_seconds']:>7.1f}  {row['wall_seconds']:>7.1f}"
    )
