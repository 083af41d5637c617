"""Memory of a local federation's processes: an idle client, the ServerApp, and a 100-client federation.

  idle client   a SuperNode and its ClientApp executor started by deploy/launcher.py, no run submitted, measured
                once they have finished importing (their CPU time stops growing), for each executor: `fork` (a warm
                `fedbayes superexec` per SuperNode that has preloaded torch), `subprocess` (Flower's own
                `flower-superexec`, which starts a fresh `flwr-clientapp` per message) and `shared` (the default:
                one warm `fedbayes superexec` for `--shared-clients` SuperNodes: per client its SuperNode, plus
                once the shared process). RSS (VmRSS: every page the process maps, libraries
                and pages shared with other processes counted in full) and PSS (Pss from /proc/<pid>/smaps_rollup:
                shared pages divided among the processes sharing them).
  ServerApp     peak RSS (VmHWM) of the `flwr-serverapp` process of a 2-client FedAvg run, 2 rounds, FMNIST-10%,
                per model (`--models`), with the model's parameter count.
  federation    `--federation-clients N` (0: skip): `fedbayes local` with N clients and `--federation-executor`,
                FedAvg, logreg, fraction-train 0.1, full FMNIST split iid, `--federation-rounds` rounds: the peak
                over the run of the summed RSS and PSS of every process of the federation (SuperLink, ServerApp,
                SuperNodes, executors, ClientApps), sampled every 2 s, and the seconds per round.

Run:  python benchmarks/memory.py [--models logreg mlp cnn-acar] [--federation-clients 100]
Writes benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import benchmarks.environment  # noqa: F401  (one thread, no telemetry: before torch and flwr)

# isort: split

from fedbayes.deploy.launcher import LocalFederation, LocalRun, run_local
from fedbayes.deploy.processes import command_line, stop_processes_on_signals
from tests.support.processes import descendants, processes_with_env

OUTPUT = REPO / "benchmarks" / "results" / "memory.json"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise KeyError("Pss")


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def wait_until_idle(pids: list[int], quiet_seconds: float = 3.0, timeout: float = 120.0) -> None:
    """Until each of `pids` used under 10% of a core for `quiet_seconds`: polling, no longer importing (the executor
    has preloaded torch and the app)."""
    deadline = time.monotonic() + timeout
    last = [cpu_ticks(pid) for pid in pids]
    while time.monotonic() < deadline:
        time.sleep(quiet_seconds)
        now = [cpu_ticks(pid) for pid in pids]
        if all(after - before <= 0.1 * quiet_seconds * CLOCK_TICKS for before, after in zip(last, now)):
            return
        last = now
    raise TimeoutError(f"processes {pids} kept computing for {timeout:.0f} s")


def idle_client(root: Path, executor: str, clients: int) -> dict[str, Any]:
    """Memory of `clients` idle clients with this executor, per client (the mean over them) and, for the shared
    executor, the one process that serves them all."""
    with LocalFederation(root / f"idle-{executor}", executor) as federation:
        nodes = [federation.start_supernode(index, clients).popen.pid for index in range(clients)]
        federation.start_shared_superexec()
        deadline = time.monotonic() + 120  # the SuperNodes start Flower's flower-superexec a moment after they start
        while len(executors := executor_pids(federation, nodes)) != (0 if executor == "shared" else clients):
            if time.monotonic() > deadline:
                raise RuntimeError(f"found {len(executors)} executor processes for {clients} SuperNodes")
            time.sleep(1)
        shared = [] if federation.shared_superexec is None else [federation.shared_superexec.popen.pid]
        wait_until_idle(nodes + executors + shared)
        per_client = {
            role: {
                "rss_mib": statistics.mean(status_kib(pid, "VmRSS") for pid in pids) / 1024,
                "pss_mib": statistics.mean(pss_kib(pid) for pid in pids) / 1024,
            }
            for role, pids in (("supernode", nodes), ("superexec", executors))
            if pids
        }
        shared_process = (
            {"rss_mib": status_kib(shared[0], "VmRSS") / 1024, "pss_mib": pss_kib(shared[0]) / 1024} if shared else None
        )
    return {
        "executor": executor,
        "clients": clients,
        "per_client": per_client,
        "shared_process": shared_process,
        "rss_mib": sum(p["rss_mib"] for p in per_client.values()),
        "pss_mib": sum(p["pss_mib"] for p in per_client.values()),
    }


def executor_pids(federation: LocalFederation, supernodes: list[int]) -> list[int]:
    """The processes that poll the SuperNodes for ClientApp tasks, one per SuperNode (none with the shared executor,
    which asks them all from its one loop)."""
    if federation.executor == "fork":
        return [federation.superexecs[index].popen.pid for index in range(len(supernodes))]
    if federation.executor == "shared":
        return []
    return [
        pid
        for node in supernodes
        for pid in descendants(node)  # the SuperNode starts Flower's flower-superexec
        if any(Path(arg).name == "flower-superexec" for arg in command_line(pid)[:2])
    ]


class PeakSampler(threading.Thread):
    """The peak RSS (VmHWM) of every `flwr-serverapp` process with this FLWR_HOME."""

    def __init__(self, flwr_home: Path) -> None:
        super().__init__(daemon=True)
        self.flwr_home, self.peak_kib, self.halt = flwr_home, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.5):
            for pid in processes_with_env("FLWR_HOME", str(self.flwr_home)):
                try:
                    if any(Path(arg).name == "flwr-serverapp" for arg in command_line(pid)[:2]):
                        self.peak_kib = max(self.peak_kib, status_kib(pid, "VmHWM"))
                except (OSError, KeyError):
                    continue


class TotalSampler(threading.Thread):
    """The peak over time of the summed RSS and PSS of every process with this FLWR_HOME (the whole federation)."""

    def __init__(self, flwr_home: Path) -> None:
        super().__init__(daemon=True)
        self.flwr_home, self.halt = flwr_home, threading.Event()
        self.peak = {"rss_mib": 0.0, "pss_mib": 0.0, "processes": 0}

    def run(self) -> None:
        while not self.halt.wait(2.0):
            rss = pss = count = 0
            for pid in processes_with_env("FLWR_HOME", str(self.flwr_home)):
                try:
                    rss, pss, count = rss + status_kib(pid, "VmRSS"), pss + pss_kib(pid), count + 1
                except (OSError, KeyError):  # the process ended between the listing and the read
                    continue
            if pss / 1024 > self.peak["pss_mib"]:
                self.peak = {"rss_mib": rss / 1024, "pss_mib": pss / 1024, "processes": count}


def serverapp_peak(root: Path, model: str) -> dict[str, Any]:
    workdir = root / f"server-{model}"
    sampler = PeakSampler(workdir / "flwr-home")
    sampler.start()
    try:
        run_local(
            LocalRun(
                strategy="fedavg",
                clients=2,
                rounds=2,
                fraction=0.1,
                workdir=workdir,
                overrides={"model": model},
                quiet=True,
            )
        )
    finally:
        sampler.halt.set()
        sampler.join()
    return {"model": model, "parameters": parameter_count(model), "peak_rss_mib": sampler.peak_kib / 1024}


def federation_peak(root: Path, clients: int, rounds: int, executor: str) -> dict[str, Any]:
    workdir = root / f"federation-{clients}"
    sampler = TotalSampler(workdir / "flwr-home")
    sampler.start()
    started = time.monotonic()
    try:
        rows = run_local(
            LocalRun(
                strategy="fedavg",
                clients=clients,
                rounds=rounds,
                fraction=1.0,
                workdir=workdir,
                executor=executor,
                quiet=True,
                overrides={"model": "logreg", "fraction-train": 0.1, "wait-for-clients-timeout": 600.0},
            )
        )
    finally:
        sampler.halt.set()
        sampler.join()
    return {
        "clients": clients,
        "executor": executor,
        "model": "logreg",
        "fraction_train": 0.1,
        "rounds": rounds,
        "clients_per_round": [row["clients"] for row in rows],
        "round_seconds": [row["round_seconds"] for row in rows],
        "whole_command_seconds": time.monotonic() - started,
        "peak": sampler.peak,
    }


def parameter_count(model: str) -> int:
    from fedbayes.tasks.models import build_model

    return sum(p.numel() for p in build_model(model, (1, 28, 28), 10).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["logreg", "mlp", "cnn-acar"])
    parser.add_argument("--shared-clients", type=int, default=10, help="idle clients served by one shared executor")
    parser.add_argument("--federation-clients", type=int, default=0, help="also run a federation this large (0: no)")
    parser.add_argument("--federation-rounds", type=int, default=3)
    parser.add_argument("--federation-executor", default="shared", choices=("fork", "shared", "subprocess"))
    args = parser.parse_args()
    stop_processes_on_signals()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedbayes-memory-") as tmp:
        idle = []
        for executor, clients in (("fork", 1), ("subprocess", 1), ("shared", args.shared_clients)):
            idle.append(idle_client(Path(tmp), executor, clients))
            shared = idle[-1]["shared_process"]
            print(
                f"idle client, {executor} executor ({clients} clients):",
                ", ".join(
                    f"{role} RSS {p['rss_mib']:.0f} MiB / PSS {p['pss_mib']:.0f} MiB"
                    for role, p in idle[-1]["per_client"].items()
                ),
                f"-> RSS {idle[-1]['rss_mib']:.0f} MiB, PSS {idle[-1]['pss_mib']:.0f} MiB per client",
                ""
                if shared is None
                else f"+ once: shared executor RSS {shared['rss_mib']:.0f} MiB / PSS {shared['pss_mib']:.0f} MiB",
                flush=True,
            )
        servers = []
        for model in args.models:
            servers.append(serverapp_peak(Path(tmp), model))
            print(
                f"ServerApp, {model} ({servers[-1]['parameters']:,} parameters): peak RSS "
                f"{servers[-1]['peak_rss_mib']:.0f} MiB",
                flush=True,
            )
        federation = None
        if args.federation_clients:
            federation = federation_peak(
                Path(tmp), args.federation_clients, args.federation_rounds, args.federation_executor
            )
            peak = federation["peak"]
            print(
                f"federation of {federation['clients']} clients ({federation['executor']} executor, logreg, "
                "fraction-train 0.1): "
                f"peak RSS {peak['rss_mib']:.0f} MiB, PSS {peak['pss_mib']:.0f} MiB over {peak['processes']} "
                f"processes; clients per round {federation['clients_per_round']}, round seconds "
                f"{[round(s, 1) for s in federation['round_seconds']]}, whole command "
                f"{federation['whole_command_seconds']:.0f} s",
                flush=True,
            )
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(
        json.dumps(
            {
                "benchmark": "memory",
                "load_average_at_start": load,
                "idle_client": idle,
                "serverapp": servers,
                "federation": federation,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
