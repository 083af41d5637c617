"""Wall time per federated round vs the clients' pure local compute, on a real loopback federation.

For each number of clients K (default 2 and 5), each way of running ClientApps (`fork`: forks of a warm `fedbayes
superexec` per SuperNode, the launcher's default; `subprocess`: Flower's fresh `flwr-clientapp` process per message) and
each server poll interval (default 0.1 s and 3 s) this starts a SuperLink and K SuperNodes with
`deploy.launcher.run_local` (separate OS processes, gRPC on 127.0.0.1), runs FedAvg on FMNIST (iid, default MLP,
`--fraction` of the data) for `--rounds` rounds and reads the per-round results the ServerApp writes:

  round_s      time from pushing a round's messages to having aggregated the replies
               (server/loop.py; excludes the server's central evaluation)
  compute_s    mean over clients of their pure local training time (FedAvgReply.compute_seconds;
               excludes decoding, process start-up, data loading). NB: it includes building the
               optimizer, and in a fresh process the first torch optimizer imports torch._dynamo
               (~1-2 s here, see the start-up probe), so on small models it is mostly that import
  overhead_s   round_s - compute_s: everything that is not local training
  overhead %   overhead_s / round_s
  d vs 0.1s    round_s minus round_s of the 0.1 s-poll run with the same K

Rounds 2..N are reported separately because round 1 also pays one-off costs (run/FAB set-up on each
SuperNode, first connections).

Why two poll intervals: Flower's own `Strategy.start` drives rounds with `Grid.send_and_receive`,
which pushes and then pulls every 3 s; our loop (server/loop.py) pulls every `poll-interval`
(default 0.1 s). `poll-interval=3.0` reproduces Flower's polling, so the difference column is what
our loop saves per round.

Floors the app cannot change (Flower 1.39 SuperNode side):
  * a SuperNode with nothing to do sleeps a hard-coded 3 s before asking the SuperLink again
    (flwr/supernode/start_client_internal.py). It has just sent its reply when the server starts
    aggregating, so it is usually asleep when the next round's instruction arrives: up to 3 s per
    round on every node, whatever the server's poll interval;
  * it checks for the ClientApp's reply every 0.5 s (hard-coded, same file);
  * the SuperNode's SuperExec looks for a message to run every 1 s (flwr/supercore/superexec/
    run_superexec.py; settable only through the SuperNode's environment,
    FLWR_SUPEREXEC_TASK_POLL_INTERVAL, which the launcher sets to 0.2 s; see --superexec-poll-interval);
  * with `subprocess`, every message starts a fresh `flwr-clientapp` process, which imports torch and
    our client code and loads and partitions the dataset before it can train. The script measures
    that start-up in a fresh interpreter on this machine (`clientapp_startup_probes` in the JSON).
    `fork` removes the imports from it (deploy/warm_executor.py).

It also samples the CPU time of every process of each federation (/proc, by role): on 2 cores the
K ClientApp processes of a round compete for the CPU, so their start-up cost, not polling, sets the
round time once K grows. CPU totals cover the whole run, start-up included.

Run:  python benchmarks/round_overhead.py [--clients 2 5 --poll-intervals 0.1 3.0 --rounds 5]
Takes a few minutes. Writes benchmarks/results/round_overhead.json (incl. the load average at the
start, since this machine is shared and has only 2 cores).
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
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python benchmarks/round_overhead.py` from a source checkout

# Set before any Flower process starts: they inherit our environment.
import benchmarks.environment  # noqa: F401  (one thread, no telemetry: before torch and flwr)

# isort: split

from fedbayes.deploy.launcher import LocalRun, run_local
from fedbayes.deploy.processes import stop_processes_on_signals

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "round_overhead.json"
BASELINE_POLL = 0.1  # the "d vs" column compares against this poll interval


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[2, 5], help="federation sizes K to run")
    parser.add_argument(
        "--poll-intervals",
        type=float,
        nargs="+",
        default=[BASELINE_POLL, 3.0],
        help="server poll intervals in seconds (3.0 = Flower's send_and_receive)",
    )
    parser.add_argument(
        "--executors",
        nargs="+",
        default=["fork", "subprocess"],
        choices=["fork", "subprocess"],
        help="how SuperNodes run ClientApps (see deploy/warm_executor.py)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fraction", type=float, default=0.1, help="fraction of FMNIST the clients share")
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--split", default="iid")
    parser.add_argument(
        "--startup-probes",
        type=int,
        default=3,
        help="times to measure a ClientApp's start-up in a fresh interpreter (0 = skip)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run every configuration this many times (poll order alternates)"
    )
    parser.add_argument(
        "--superexec-poll-interval",
        type=float,
        default=None,
        help="set FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes (Flower default 1 s)",
    )
    parser.add_argument("--keep-workdirs", action="store_true", help="keep run dirs (logs) under runs/benchmark-*")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser.parse_args()


# Runs in a fresh interpreter, like every flwr-clientapp process: the app's imports, then the
# per-message set-up ClientRuntime.create does before training (load + partition the data, build
# the model), then the first torch optimizer, whose constructor lazily imports torch._dynamo
# (torch/_compile.py) and so costs seconds once per process. Run config = the app's defaults
# from pyproject.toml + our overrides.
CLIENTAPP_PROBE = r"""
import json, sys, tempfile, time
started = time.perf_counter()
import flwr.app, client.app
imported = time.perf_counter()
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.tasks.config import RunSettings
from fedbayes.strategies import default_run_config, run_settings
config = default_run_config()
config.update(json.loads(sys.argv[1]))
settings = run_settings(config)
with tempfile.TemporaryDirectory() as state_dir:
    node = NodeSettings.from_node_config(
        {"partition-id": 0, "num-partitions": int(sys.argv[2]), "state-dir": state_dir}, settings.device
    )
    created = time.perf_counter()
    runtime = ClientRuntime.create(settings, node)
    done = time.perf_counter()
import torch
torch.optim.Adam(runtime.model.parameters())  # the first optimizer in a process imports torch._dynamo
optimizer_ready = time.perf_counter()
print(json.dumps({
    "import_seconds": imported - started,
    "runtime_create_seconds": done - created,
    "first_optimizer_seconds": optimizer_ready - done,
}))
"""


def probe_clientapp_startup(args: argparse.Namespace, probes: int) -> list[dict[str, float]]:
    """Per-message ClientApp start-up cost on this machine, measured `probes` times."""
    run_config = json.dumps({"dataset": args.dataset, "fraction": args.fraction, "split": args.split})
    results = []
    for _ in range(probes):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CLIENTAPP_PROBE, run_config, str(min(args.clients))],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:  # the app's internals may have moved; the benchmark goes on without it
            print(f"clientapp start-up probe failed:\n{done.stderr[-2000:]}", file=sys.stderr)
            return results
        results.append({**json.loads(done.stdout.strip().splitlines()[-1]), "process_wall_seconds": wall})
    return results


def format_probe(probes: list[dict[str, float]]) -> str:
    if not probes:
        return "clientapp start-up probe: not run"
    median = {key: statistics.median(p[key] for p in probes) for key in probes[0]}
    return (
        f"per-message ClientApp start-up in a fresh interpreter (median of {len(probes)}): "
        f"imports {median['import_seconds']:.2f} s + data/model set-up {median['runtime_create_seconds']:.2f} s"
        f" + first optimizer (imports torch._dynamo) {median['first_optimizer_seconds']:.2f} s;"
        f" whole process {median['process_wall_seconds']:.2f} s"
    )


class CpuSampler(threading.Thread):
    """Samples the CPU time of every process of one federation, grouped by role.

    The federation's processes are found by their FLWR_HOME (the launcher gives each run its own),
    which every helper Flower starts inherits. Each process's own utime+stime is read every
    `interval` s and the last value kept, so short-lived flwr-clientapp processes are counted too
    (minus at most their last `interval` s).
    """

    def __init__(self, flwr_home: Path, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.needle = f"FLWR_HOME={flwr_home}".encode()
        self.interval = interval
        self.seen: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, start tick) -> (role, cpu s)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            self.sample()

    def stop(self) -> dict[str, dict[str, float]]:
        """Stop sampling; returns role -> {"cpu_seconds": total, "processes": how many}."""
        self.halt.set()
        self.join()
        self.sample()
        totals: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_seconds": 0.0, "processes": 0})
        for role, seconds in self.seen.values():
            totals[role]["cpu_seconds"] += seconds
            totals[role]["processes"] += 1
        return dict(sorted(totals.items()))

    def sample(self) -> None:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if self.needle not in (proc / "environ").read_bytes().split(b"\0"):
                    continue
                start_tick, cpu_seconds = _cpu_of(proc)
                self.seen[(int(proc.name), start_tick)] = (_role_of(proc), cpu_seconds)
            except (OSError, ValueError, IndexError):  # the process exited meanwhile
                continue


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_of(proc: Path) -> tuple[int, float]:
    """(start time in ticks, own user+system CPU seconds) from /proc/<pid>/stat."""
    fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, start = int(fields[11]), int(fields[12]), int(fields[19])  # stat fields 14, 15, 22
    return start, (utime + stime) / CLOCK_TICKS


def _role_of(proc: Path) -> str:
    """'flower-superlink', 'flwr-clientapp', ...: the Flower console script the process runs."""
    argv = (proc / "cmdline").read_bytes().split(b"\0")
    for arg in argv[:2]:
        name = Path(arg.decode(errors="replace")).name
        if name.startswith(("flwr", "flower")):
            return name
        if name == "fedbayes" and len(argv) > 2:
            return f"fedbayes {argv[2].decode(errors='replace')}"
    return Path(argv[0].decode(errors="replace")).name or "?"


def run_configuration(
    args: argparse.Namespace, clients: int, executor: str, poll: float, root: Path
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Run one federation; returns its per-round rows and CPU seconds by process role."""
    workdir = (root / f"k{clients}-{executor}-poll{poll:g}").resolve()
    spec = LocalRun(
        strategy="fedavg",
        clients=clients,
        rounds=args.rounds,
        dataset=args.dataset,
        fraction=args.fraction,
        split=args.split,
        workdir=workdir,
        overrides={"poll-interval": poll},
        quiet=True,
        executor=executor,
    )
    sampler = CpuSampler(workdir / "flwr-home")  # the launcher's FLWR_HOME for this workdir
    sampler.start()
    try:
        rows = run_local(spec)
    finally:
        cpu = sampler.stop()
    return rows, cpu


def mean_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return statistics.fmean(values) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-round means over all rounds and over rounds 2..N (steady state)."""
    steady = [row for row in rows if row["round"] >= 2] or rows
    round_all, round_steady = mean_of(rows, "round_seconds"), mean_of(steady, "round_seconds")
    compute_steady = mean_of(steady, "client_compute_seconds")
    overhead = round_steady - compute_steady if compute_steady is not None else None
    return {
        "round_seconds_all": round_all,
        "round_seconds_steady": round_steady,
        "compute_seconds_all": mean_of(rows, "client_compute_seconds"),
        "compute_seconds_steady": compute_steady,
        "overhead_seconds_steady": overhead,
        "overhead_fraction_steady": overhead / round_steady if overhead is not None else None,
        "round_seconds_max": max(row["round_seconds"] for row in rows),
        "final_accuracy": rows[-1]["accuracy"],
        "clients_replied": [row["clients"] for row in rows],
    }


def add_poll_differences(results: list[dict[str, Any]]) -> None:
    """Steady round time minus that of the BASELINE_POLL run with the same K (and repeat)."""
    baseline = {
        (r["repeat"], r["clients"], r["executor"]): r["summary"]["round_seconds_steady"]
        for r in results
        if r.get("summary") and r["poll_interval"] == BASELINE_POLL
    }
    for result in results:
        key = (result["repeat"], result["clients"], result["executor"])
        if result.get("summary") and key in baseline:
            result["summary"]["round_seconds_vs_baseline_poll"] = (
                result["summary"]["round_seconds_steady"] - baseline[key]
            )


def average_over_repeats(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pseudo-result per (K, executor, poll) whose summary is the mean of the repeats' summaries."""
    groups: dict[tuple[int, str, float], list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        if result.get("summary"):
            groups[(result["clients"], result["executor"], result["poll_interval"])].append(result["summary"])
    averaged = []
    for (clients, executor, poll), summaries in groups.items():
        keys = {k for s in summaries for k, v in s.items() if isinstance(v, (int, float))}
        mean = {k: mean_of(summaries, k) for k in sorted(keys)}
        averaged.append(
            {
                "clients": clients,
                "executor": executor,
                "poll_interval": poll,
                "repeats": len(summaries),
                "summary": mean,
            }
        )
    return averaged


def _cell(value: float | None, spec: str, width: int) -> str:
    return f"{value:{spec}}".rjust(width) if value is not None else "-".rjust(width)


def format_table(results: list[dict[str, Any]], rounds: int) -> str:
    steady = f"2-{rounds}"
    header = (
        f"{'K':>2} {'executor':>10} {'poll_s':>6} {'round_s all':>11} {'round_s ' + steady:>11} {'compute_s':>9}"
        f" {'overhead_s':>10} {'overhead %':>10} {'d vs 0.1s':>9}"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        s = result.get("summary")
        if s is None:
            lines.append(
                f"{result['clients']:>2} {result['executor']:>10} {result['poll_interval']:>6g}  "
                f"FAILED: {result['error']}"
            )
            continue
        fraction = s["overhead_fraction_steady"]
        lines.append(
            f"{result['clients']:>2} {result['executor']:>10} {result['poll_interval']:>6g}"
            f" {_cell(s['round_seconds_all'], '.2f', 11)} {_cell(s['round_seconds_steady'], '.2f', 11)}"
            f" {_cell(s['compute_seconds_steady'], '.3f', 9)} {_cell(s['overhead_seconds_steady'], '.2f', 10)}"
            f" {_cell(fraction * 100 if fraction is not None else None, '.1f', 10)}"
            f" {_cell(s.get('round_seconds_vs_baseline_poll'), '+.2f', 9)}"
        )
    return "\n".join(lines)


def format_rounds(result: dict[str, Any]) -> str:
    """One line per configuration with every round's seconds, to show the spread."""
    rounds = " ".join(f"{row['round_seconds']:.1f}" for row in result.get("rows", []))
    return (
        f"repeat {result['repeat']} K={result['clients']} {result['executor']} poll={result['poll_interval']:g}:"
        f" round_s per round [{rounds}]"
    )


def run_all(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    """Every (K, executor, poll) configuration, `--repeats` times; poll intervals alternate within
    each K so that load from other users of the machine hits both alike."""
    results = []
    for repeat in range(args.repeats):
        for clients in args.clients:
            for executor in args.executors:
                polls = args.poll_intervals if repeat % 2 == 0 else list(reversed(args.poll_intervals))
                for poll in polls:
                    results.append(run_one(args, repeat, clients, executor, poll, root / f"r{repeat}"))
    add_poll_differences(results)
    return results


def run_one(
    args: argparse.Namespace, repeat: int, clients: int, executor: str, poll: float, root: Path
) -> dict[str, Any]:
    load = os.getloadavg()
    print(f"running K={clients} executor={executor} poll-interval={poll:g} s (load {load[0]:.2f}) ...", flush=True)
    result: dict[str, Any] = {
        "repeat": repeat,
        "clients": clients,
        "executor": executor,
        "poll_interval": poll,
        "load_average_before": load,
    }
    started = time.monotonic()
    try:
        rows, cpu = run_configuration(args, clients, executor, poll, root)
        result.update(rows=rows, summary=summarize(rows), cpu_by_role=cpu)
    except Exception as error:  # keep the other configurations' results
        traceback.print_exc()
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    result["total_seconds"] = time.monotonic() - started  # incl. process start-up and shutdown
    return result


# `fedbayes superexec` = the warm parent and its forked ClientApps (same command line).
CPU_ROLES = (
    "fedbayes superlink",
    "flwr-serverapp",
    "flower-supernode",
    "flower-superexec",
    "flwr-clientapp",
    "fedbayes superexec",
)


def format_cpu_table(results: list[dict[str, Any]]) -> str:
    """CPU seconds each kind of process used over the whole run (start-up included)."""
    header = (
        f"{'K':>2} {'executor':>10} {'poll_s':>6} {'wall_s':>7} {'cpu_s':>7} "
        + " ".join(f"{r:>16}" for r in CPU_ROLES)
        + f" {'other':>6} {'per clientapp':>13}"
    )
    lines = ["CPU seconds per run by process (2 cores => at most 2 x wall_s):", header, "-" * len(header)]
    for result in results:
        cpu = result.get("cpu_by_role")
        if cpu is None:
            continue
        seconds = {role: entry["cpu_seconds"] for role, entry in cpu.items()}
        other = sum(v for role, v in seconds.items() if role not in CPU_ROLES)
        clientapps = cpu.get("flwr-clientapp", {}).get("processes", 0)
        per_clientapp = seconds.get("flwr-clientapp", 0.0) / clientapps if clientapps else 0.0
        lines.append(
            f"{result['clients']:>2} {result['executor']:>10} {result['poll_interval']:>6g} "
            f"{result['total_seconds']:>7.1f} {sum(seconds.values()):>7.1f} "
            + " ".join(f"{seconds.get(r, 0.0):>16.1f}" for r in CPU_ROLES)
            + f" {other:>6.1f} {per_clientapp:>13.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    stop_processes_on_signals()
    if args.superexec_poll_interval is not None:  # the launcher passes our environment to the SuperNodes
        os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(args.superexec_poll_interval)
    load_at_start = os.getloadavg()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(
        f"load average at start: {load_at_start[0]:.2f} {load_at_start[1]:.2f} {load_at_start[2]:.2f}"
        f" on {os.cpu_count()} cores"
    )
    startup = probe_clientapp_startup(args, args.startup_probes)
    if args.keep_workdirs:
        root = REPO / "runs" / f"benchmark-{time.strftime('%Y%m%d-%H%M%S')}"
        results = run_all(args, root)
    else:
        with tempfile.TemporaryDirectory(prefix="fedbayes-bench-") as tmp:
            results = run_all(args, Path(tmp))
    print()
    print(format_table(results, args.rounds))
    averaged = average_over_repeats(results) if args.repeats > 1 else []
    if averaged:
        print(f"\nmean over {args.repeats} repeats:")
        print(format_table(averaged, args.rounds))
    print()
    for result in results:
        print(format_rounds(result))
    print()
    print(format_cpu_table(results))
    print(format_probe(startup))
    output = {
        "benchmark": "round_overhead",
        "started_at": started_at,
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "settings": {
            "strategy": "fedavg",
            "dataset": args.dataset,
            "split": args.split,
            "fraction": args.fraction,
            "rounds": args.rounds,
            "model": "mlp (app default)",
            "executors": args.executors,
            "env": {
                k: os.environ.get(k)
                for k in ("OMP_NUM_THREADS", "FEDBAYES_THREADS", "FLWR_SUPEREXEC_TASK_POLL_INTERVAL")
            },
        },
        "clientapp_startup_probes": startup,
        "configurations": results,
        "mean_over_repeats": averaged,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(output, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
