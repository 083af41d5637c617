"""Seconds per round and memory per host of the README's simulation command on a Ray cluster of network namespaces.

Starts `--hosts` machines (network namespaces on one bridge, tests/support/netns.py; needs root), Ray's head on
the first and a worker node on each other (one CPU each, no dashboard, an 80 MiB object store;
tests/support/ray_cluster.py), then runs `fedbayes run <repo> local --ray-address HEAD:6379` on the head's machine
with `--clients` virtual clients, logreg, FedAvg, `fraction-train` `--fraction-train` (default 0.01: 100 of 10,000
train each round), on `--fraction` of FMNIST split iid over them, for `--rounds` rounds. It reads round_s (push ..
evaluation, server/loop.py) from the rows the ServerApp writes and samples, every 0.5 s, the resident memory (VmRSS)
summed over each host's Ray processes and, apart, over the simulation's own processes (its SuperLink and
`flwr-simulation`, which runs the ServerApp and drives Ray, on the head's machine); it reports each sum's peak.
Pages shared between processes count once per process.

Run:  sudo python benchmarks/simulation_cluster.py [--hosts 3 --clients 10000 --rounds 3]
Writes benchmarks/results/simulation_cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.environment import DEFAULTS
from tests.support.netns import NetnsLab
from tests.support.processes import processes_of, processes_with_env, resident_mib
from tests.support.ray_cluster import HOST_MARKER, RayCluster

OUTPUT = REPO / "benchmarks" / "results" / "simulation_cluster.json"
SAMPLE_EVERY = 0.5  # seconds


class HostMemory:
    """While a `with` block runs, the peak of each group's summed resident set (MiB); `groups`: name -> its pids."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups
        self.peaks = dict.fromkeys(groups, 0.0)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(SAMPLE_EVERY):
            for name, pids in self.groups.items():
                self.peaks[name] = max(self.peaks[name], sum(resident_mib(pid, "VmRSS") for pid in pids()))

    def __enter__(self) -> HostMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.done.set()
        self.thread.join()


def run_on_cluster(args: argparse.Namespace, root: Path) -> dict:
    names = ["head", *(f"worker{i}" for i in range(1, args.hosts))]
    results, home = root / "sim.jsonl", root / "sim-home"
    config = (
        f'num-server-rounds={args.rounds} fraction={args.fraction} model="logreg" '
        f'fraction-train={args.fraction_train} results-path="{results}" server-state-dir="{root / "server-state"}"'
    )
    command = [
        str(Path(sys.executable).with_name("fedbayes")),
        "run",
        str(REPO),
        "local",
        "--stream",
        "--federation-config",
        f"num-supernodes={args.clients} client-resources-num-cpus=1",
        "-c",
        config,
    ]
    env = {**os.environ, **DEFAULTS, "FLWR_HOME": str(home)}
    with NetnsLab(names) as lab:
        workers = {name: lab[name] for name in names[1:]}
        with RayCluster(lab["head"], workers, root) as cluster:
            groups = {name: _host_pids(cluster, name) for name in names}
            groups["head: the simulation (SuperLink, flwr-simulation)"] = lambda: processes_of(home)
            started = time.monotonic()
            with HostMemory(groups) as memory:
                done = subprocess.run(
                    lab["head"].command([*command[:5], "--ray-address", cluster.address, *command[5:]]),
                    cwd=REPO,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=3600,
                )
            wall = time.monotonic() - started
            tasks = cluster.tasks_by_node()
    if done.returncode != 0:
        raise RuntimeError(f"the simulation failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    steady = [row["round_seconds"] for row in rows[1:]] or [rows[0]["round_seconds"]]
    return {
        "hosts": {name: lab[name].address for name in names},
        "clients": args.clients,
        "clients_per_round": [row["clients_sent"] for row in rows],
        "round_seconds": [row["round_seconds"] for row in rows],
        "median_round_seconds_2_n": statistics.median(steady),
        "command_wall_seconds": wall,
        "peak_rss_mib": memory.peaks,
        "clientapp_tasks_by_node": tasks["runs"],
        "left_behind": processes_of(home),
        "final_accuracy": rows[-1]["accuracy"],
    }


def _host_pids(cluster: RayCluster, name: str) -> Callable[[], list[int]]:
    marker = cluster.marker(name)
    return lambda: processes_with_env(HOST_MARKER, marker)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3, help="machines: Ray's head and hosts - 1 worker nodes")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--fraction-train", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=1.0, help="of FMNIST, split iid over the clients")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedbayes-simcluster-") as tmp:
        run = run_on_cluster(args, Path(tmp))
    end = os.getloadavg()
    print(
        f"{args.clients} virtual clients on {args.hosts} hosts ({run['clients_per_round'][0]} per round): round_s "
        f"{' '.join(f'{s:.1f}' for s in run['round_seconds'])}; median of rounds 2..N "
        f"{run['median_round_seconds_2_n']:.1f} s; whole command {run['command_wall_seconds']:.0f} s",
        flush=True,
    )
    for name, peak in run["peak_rss_mib"].items():
        print(f"  peak resident MiB, {name}: {peak:.0f}", flush=True)
    print(f"  ClientAppActor.run tasks by node: {run['clientapp_tasks_by_node']}", flush=True)
    print(f"load average at end: {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}", flush=True)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(
        json.dumps(
            {
                "benchmark": "simulation_cluster",
                "load_average_at_start": load,
                "load_average_at_end": end,
                "settings": vars(args),
                "run": run,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
