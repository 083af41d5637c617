"""Memory of a local federation's processes: an idle client (SuperNode + its warm executor) and the ServerApp.

  idle client   a SuperNode and its `fedbayes superexec` started by deploy/launcher.py, no run submitted, measured
                once the executor has finished preloading (its CPU time stops growing): RSS (VmRSS: every page the
                process maps, libraries shared with other processes counted in full) and PSS (Pss from
                /proc/<pid>/smaps_rollup: shared pages divided among the processes sharing them).
  ServerApp     peak RSS (VmHWM) of the `flwr-serverapp` process of a 2-client FedAvg run, 2 rounds, FMNIST-10%,
                per model (`--models`), with the model's parameter count.

Run:  python benchmarks/memory.py [--models logreg mlp cnn-acar]
Writes benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

for _name, _value in (("OMP_NUM_THREADS", "1"), ("FLWR_TELEMETRY_ENABLED", "0"), ("FLWR_DISABLE_UPDATE_CHECK", "1"),
                      ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")):
    os.environ.setdefault(_name, _value)

from fedbayes.deploy.launcher import LocalFederation, LocalRun, run_local, stop_processes_on_signals  # noqa: E402
from fedbayes.deploy.processes import command_line, processes_with_env  # noqa: E402

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
    """Until none of `pids` used CPU for `quiet_seconds` (the executor has preloaded torch and the app)."""
    deadline = time.monotonic() + timeout
    last = [cpu_ticks(pid) for pid in pids]
    while time.monotonic() < deadline:
        time.sleep(quiet_seconds)
        now = [cpu_ticks(pid) for pid in pids]
        if sum(now) - sum(last) <= 0.1 * quiet_seconds * CLOCK_TICKS:  # under 10% of a core: polling, not importing
            return
        last = now
    raise TimeoutError(f"processes {pids} kept computing for {timeout:.0f} s")


def idle_client(root: Path) -> dict[str, Any]:
    with LocalFederation(root / "idle", "fork") as federation:
        supernode = federation.start_supernode(0, 1)
        superexec = federation.superexecs[0]
        pids = {"supernode": supernode.popen.pid, "superexec": superexec.popen.pid}
        time.sleep(5)
        wait_until_idle(list(pids.values()))
        processes = {role: {"rss_mib": status_kib(pid, "VmRSS") / 1024, "pss_mib": pss_kib(pid) / 1024}
                     for role, pid in pids.items()}
    return {"processes": processes,
            "rss_mib": sum(p["rss_mib"] for p in processes.values()),
            "pss_mib": sum(p["pss_mib"] for p in processes.values())}


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


def serverapp_peak(root: Path, model: str) -> dict[str, Any]:
    workdir = root / f"server-{model}"
    sampler = PeakSampler(workdir / "flwr-home")
    sampler.start()
    try:
        run_local(LocalRun(strategy="fedavg", clients=2, rounds=2, fraction=0.1, workdir=workdir,
                           overrides={"model": model}, quiet=True))
    finally:
        sampler.halt.set()
        sampler.join()
    return {"model": model, "parameters": parameter_count(model), "peak_rss_mib": sampler.peak_kib / 1024}


def parameter_count(model: str) -> int:
    from fedbayes.tasks.models import build_model

    return sum(p.numel() for p in build_model(model, (1, 28, 28), 10).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["logreg", "mlp", "cnn-acar"])
    args = parser.parse_args()
    stop_processes_on_signals()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedbayes-memory-") as tmp:
        idle = idle_client(Path(tmp))
        print("idle client:", ", ".join(f"{role} RSS {p['rss_mib']:.0f} MiB / PSS {p['pss_mib']:.0f} MiB"
                                        for role, p in idle["processes"].items()),
              f"-> RSS {idle['rss_mib']:.0f} MiB, PSS {idle['pss_mib']:.0f} MiB", flush=True)
        servers = []
        for model in args.models:
            servers.append(serverapp_peak(Path(tmp), model))
            print(f"ServerApp, {model} ({servers[-1]['parameters']:,} parameters): peak RSS "
                  f"{servers[-1]['peak_rss_mib']:.0f} MiB", flush=True)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({"benchmark": "memory", "load_average_at_start": load, "idle_client": idle,
                                  "serverapp": servers}, indent=2) + "\n")
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
