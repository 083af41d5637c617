"""Where a federated round's wall time goes: the network federation against the same rounds in one process.

Two measurements, one table (issue 16's targets):

  fedavg-3   FedAvg, 3 clients, FMNIST-10% (iid, the app's default MLP), `--fedavg-rounds` rounds through
             `fedbayes local` (SuperLink + 3 SuperNodes + the warm executor, gRPC on 127.0.0.1; `--executor` as
             `fedbayes local --executor`, default shared).
             overhead per round = round wall - the slowest client's local work that round.
  bayesadmm  BayesADMM, 10 clients, FMNIST-10% homogeneous (iid; MLP 784-200-100-10 sigmoid, 10 local epochs,
             batch 32, the iid preset of benchmarks/reproduce_table1.py), `--bayesadmm-rounds` rounds,
             (1) through `fedbayes local` and (2) in this process, one thread: the same ServerApp code
             (server/app.py's run_federation, server/loop.py's rounds, evaluation and checkpoints) driving
             deploy/inprocess.py's grid whose "push" runs every message through the same ClientApp function
             (client/app.py's train) with each client's node config, one after the other. Same run config,
             same code, no processes, no serialisation, no polling. ratio = network / in-process. The
             in-process run is done twice: as the code runs (the loop evaluates round t on a second thread
             while round t+1 trains), and on one thread (that pipelining off).
             Both runs are deterministic: the table says whether their per-round metrics are identical.

Definitions, per round r >= 2 (round 1 pays one-off start-up costs and is left out of every median):
  wall_s      from round r's start to round r+1's start (rows: start = wall_seconds - round_seconds); the last
              round: to the end of its evaluation. Everything, evaluation and checkpoint included, as far as
              the next round does not hide them (server/loop.py evaluates round r while round r+1 trains)
  slowest_s   max over the round's clients of their `update` phase (decode, state, train, encode; the pure
              training time is `client_compute_seconds`, the mean, also shown)
  overhead_s  wall_s - slowest_s

The phase breakdown lists the medians of the rows' `phase_seconds` (server: configure, push, first/last reply
after the push, aggregate, evaluate, checkpoint) and `client_phase_seconds` (the clients' medians: setup =
data + model, update, state-load/-save).

CPU by process (the network runs): every process of the federation (those with its FLWR_HOME) is sampled every
0.5 s (utime + stime from /proc/<pid>/stat; a process's last < 0.5 s is missed) from the moment the first round's
row is written until the last round's is: CPU seconds per round for each kind of process (SuperLink, its
ServerApp executor, the ServerApp, SuperNodes, the warm executors polling, the ClientApp tasks they fork, `flwr`
commands) and the cores they used together, against the machine's cores. It says where a round's wall time goes
when the cores, not waiting, are the limit.

Run:  python benchmarks/network_vs_inprocess.py [--fedavg-rounds 6 --bayesadmm-rounds 3 --executor fork --label before]
Writes benchmarks/results/network_vs_inprocess-<label>.json. The machine may be shared: the load average
at the start and end is printed and saved; compare ratios from one run, not seconds across runs.
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
sys.path.insert(0, str(REPO))  # `python benchmarks/network_vs_inprocess.py` from a source checkout

import benchmarks.environment  # noqa: F401  (one thread, no telemetry: before torch and flwr)

# isort: split

from benchmarks.reproduce_table1 import COMMON, PRESETS
from fedbayes.deploy.inprocess import run_inprocess
from fedbayes.deploy.launcher import FLWR_HOME, LocalRun, run_local
from fedbayes.deploy.processes import command_line, stop_processes_on_signals
from tests.support.processes import processes_with_env

RESULTS = REPO / "benchmarks" / "results"
METRICS = ("accuracy", "nll", "ece", "accuracy_ensemble", "nll_ensemble", "ece_ensemble", "train_loss")
BAYESADMM = {**COMMON, **PRESETS[("bayesadmm", "iid")]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fedavg-rounds", type=int, default=6)
    parser.add_argument("--bayesadmm-rounds", type=int, default=3)
    parser.add_argument("--bayesadmm-clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra run-config key for every run (e.g. ensemble-samples=4)",
    )
    parser.add_argument("--label", default="run", help="names the output file: network_vs_inprocess-<label>.json")
    parser.add_argument("--skip", nargs="*", default=[], choices=["fedavg", "network", "inprocess"])
    parser.add_argument(
        "--executor",
        default="shared",
        choices=["shared", "fork", "subprocess"],
        help="how the network runs' SuperNodes run their ClientApps (`fedbayes local --executor`)",
    )
    return parser.parse_args()


def run_network(
    strategy: str, clients: int, rounds: int, fraction: float, overrides: dict[str, Any], root: Path, executor: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of a `fedbayes local` run, and the CPU its processes spent per round (CpuByProcess)."""
    workdir = root / f"{strategy}-{clients}"
    spec = LocalRun(
        strategy=strategy,
        clients=clients,
        rounds=rounds,
        dataset="fmnist",
        fraction=fraction,
        split="iid",
        workdir=workdir,
        overrides=overrides,
        quiet=True,
        executor=executor,
    )
    sampler = CpuByProcess(workdir / FLWR_HOME, workdir / "results.jsonl")
    sampler.start()
    try:
        rows = run_local(spec)
    finally:
        sampler.halt.set()
        sampler.join()
    return rows, sampler.report(rows)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
KINDS = {
    "flower-superlink": "SuperLink",
    "superlink": "SuperLink",
    "flwr-serverapp": "ServerApp",
    "flower-superexec": "ServerApp executor (SuperLink's)",
    "flwr": "flwr commands",
    "supernode": "SuperNodes",
    "run": "fedbayes run (submits, streams the log)",
}


class CpuByProcess(threading.Thread):
    """The CPU ticks of every process of one federation over time, and when each results row appeared (module
    docstring)."""

    def __init__(self, flwr_home: Path, results: Path) -> None:
        super().__init__(daemon=True)
        self.flwr_home, self.results, self.halt = flwr_home, results, threading.Event()
        self.kinds: dict[int, str] = {}
        self.samples: list[tuple[float, dict[int, int]]] = []  # (time.monotonic(), pid -> CPU ticks)
        self.row_seen: list[float] = []  # time.monotonic() when row i first appeared

    def run(self) -> None:
        while not self.halt.wait(0.5):
            ticks = {}
            for pid in processes_with_env("FLWR_HOME", str(self.flwr_home)):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    self.kinds.setdefault(pid, process_kind(pid, int(fields[1])))
                except (OSError, IndexError):  # the process ended between the listing and the read
                    continue
                ticks[pid] = int(fields[11]) + int(fields[12])
            now = time.monotonic()
            self.samples.append((now, ticks))
            rows = len(self.results.read_text().splitlines()) if self.results.exists() else 0
            self.row_seen += [now] * (rows - len(self.row_seen))

    def ticks_at(self, moment: float) -> dict[int, int]:
        """Each process's CPU ticks at its last sample up to `moment` (a process that ended keeps its last)."""
        found: dict[int, int] = {}
        for sampled, ticks in self.samples:
            if sampled > moment:
                break
            found.update(ticks)
        return found

    def report(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """CPU seconds per round and kind of process over rounds 2..N, timed as `per_round` times them: from round
        2's start (the ServerApp's monotonic clock is this machine's) to the last row."""
        if len(rows) < 2 or len(self.row_seen) < len(rows):
            return {}
        clock_start = min(seen - row["wall_seconds"] for seen, row in zip(self.row_seen, rows))
        start, end = clock_start + rows[1]["wall_seconds"] - rows[1]["round_seconds"], self.row_seen[len(rows) - 1]
        before, after, spent = self.ticks_at(start), self.ticks_at(end), {}
        for pid, ticks in after.items():
            kind = self.kinds[pid]
            spent[kind] = spent.get(kind, 0.0) + (ticks - before.get(pid, 0)) / CLOCK_TICKS / (len(rows) - 1)
        return {
            "window_s": end - start,
            "cpu_s_per_round": dict(sorted(spent.items(), key=lambda kv: -kv[1])),
            "cores_used": sum(spent.values()) * (len(rows) - 1) / (end - start),
            "cores": os.cpu_count(),
        }


def process_kind(pid: int, parent: int) -> str:
    """What a federation process is, by its command line (a warm executor's forks have their parent's)."""
    argv = command_line(pid)
    names = [Path(arg).name for arg in argv[:3]]
    if "fedbayes" in names[:2]:
        command = names[names.index("fedbayes") + 1] if names[-1] != "fedbayes" else ""
        if command == "superexec":
            return "ClientApp tasks (forks)" if command_line(parent) == argv else "warm executors (polling)"
        return KINDS.get(command, f"fedbayes {command}")
    return next((KINDS[name] for name in names[:2] if name in KINDS), " ".join(argv[:3]) or "?")


# ---------------------------------------------------------------------------------------------------------
# Per-round numbers and the table


def per_round(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """wall_s, slowest_s, overhead_s, compute_s of rounds 2..N (see the module docstring)."""
    # A row is written when its round's evaluation ends, which, pipelined, is during the next round: a round's
    # wall time runs from its start to the next round's start (the last one's: to the end of its evaluation).
    starts = [row["wall_seconds"] - row["round_seconds"] for row in rows]
    ends = starts[1:] + [rows[-1]["wall_seconds"]]
    out = []
    for row, start, end in list(zip(rows, starts, ends))[1:]:
        slowest = (row.get("client_phase_max") or {}).get("update")
        out.append(
            {
                "round": row["round"],
                "wall_s": end - start,
                "slowest_s": slowest,
                "overhead_s": end - start - slowest if slowest is not None else None,
                "compute_s": row.get("client_compute_seconds"),
            }
        )
    return out


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def phase_medians(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    steady = rows[1:] or rows
    names = sorted({name for row in steady for name, value in (row.get(key) or {}).items() if value is not None})
    return {name: median([(row.get(key) or {}).get(name) for row in steady]) for name in names}


def summary(name: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    rounds = per_round(rows)
    return {
        "name": name,
        "rounds": len(rows),
        **{f"median_{k}": median([r[k] for r in rounds]) for k in ("wall_s", "slowest_s", "overhead_s", "compute_s")},
        "per_round": rounds,
        "server_phases": phase_medians(rows, "phase_seconds"),
        "client_phases": phase_medians(rows, "client_phase_seconds"),
        "rows": rows,
    }


def same_metrics(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(x.get(k) == y.get(k) for x, y in zip(a, b) for k in METRICS)


def cell(value: float | None, width: int = 10, spec: str = ".2f") -> str:
    return (f"{value:{spec}}" if value is not None else "-").rjust(width)


def format_table(results: list[dict[str, Any]]) -> str:
    header = (
        f"{'run':<22} {'rounds':>6} {'wall_s':>10} {'slowest_s':>10} {'overhead_s':>10} {'compute_s':>10}"
        "   (medians over rounds 2..N)"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r['name']:<22} {r['rounds']:>6} {cell(r['median_wall_s'])} {cell(r['median_slowest_s'])}"
            f" {cell(r['median_overhead_s'])} {cell(r['median_compute_s'])}"
        )
    return "\n".join(lines)


def format_phases(results: list[dict[str, Any]]) -> str:
    lines = ["phase breakdown (medians over rounds 2..N, seconds):"]
    for r in results:
        server = " ".join(f"{k}={v:.3f}" for k, v in r["server_phases"].items())
        client = " ".join(f"{k}={v:.3f}" for k, v in r["client_phases"].items())
        lines += [f"  {r['name']}", f"    server: {server}", f"    client: {client}"]
    return "\n".join(lines)


def format_cpu(results: list[dict[str, Any]]) -> str:
    lines = ["CPU seconds per round by process (rounds 2..N, sampled; see the module docstring):"]
    for r in results:
        cpu = r.get("cpu_by_process")
        if cpu:
            lines.append(
                f"  {r['name']}: {cpu['cores_used']:.2f} of {cpu['cores']} cores busy over {cpu['window_s']:.1f} s"
            )
            lines += [f"    {kind:<36} {seconds:7.2f}" for kind, seconds in cpu["cpu_s_per_round"].items()]
    return "\n".join(lines)


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    from fedbayes.deploy.launcher import parse_override

    return dict(parse_override(pair) for pair in pairs)


def main() -> None:
    args = parse_args()
    stop_processes_on_signals()
    load_start = os.getloadavg()
    print(
        f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f} on {os.cpu_count()} cores",
        flush=True,
    )
    extra = parse_sets(args.set)
    bayesadmm = {**BAYESADMM, **extra}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedbayes-net-vs-inproc-") as tmp:
        root = Path(tmp)
        if "fedavg" not in args.skip:
            print("fedavg, 3 clients, network ...", flush=True)
            rows, cpu = run_network("fedavg", 3, args.fedavg_rounds, args.fraction, extra, root, args.executor)
            results.append({**summary("fedavg-3 network", rows), "cpu_by_process": cpu})
        network = inprocess = None
        if "network" not in args.skip:
            print(f"bayesadmm, {args.bayesadmm_clients} clients, network ...", flush=True)
            network, cpu = run_network(
                "bayesadmm",
                args.bayesadmm_clients,
                args.bayesadmm_rounds,
                args.fraction,
                bayesadmm,
                root,
                args.executor,
            )
            results.append({**summary(f"bayesadmm-{args.bayesadmm_clients} network", network), "cpu_by_process": cpu})
        if "inprocess" not in args.skip:
            config = {
                "strategy": "bayesadmm",
                "num-server-rounds": args.bayesadmm_rounds,
                "dataset": "fmnist",
                "fraction": args.fraction,
                "split": "iid",
                "seed": 0,
                "federation": "inprocess",
                "wait-for-clients": args.bayesadmm_clients,
                **bayesadmm,
            }
            for pipelined, label in ((True, "in-process"), (False, "in-process 1 thread")):
                print(f"bayesadmm, {args.bayesadmm_clients} clients, {label} ...", flush=True)
                rows = run_inprocess(config, args.bayesadmm_clients, root / label.replace(" ", "-"), pipelined)
                inprocess = inprocess or rows
                results.append(summary(f"bayesadmm-{args.bayesadmm_clients} {label}", rows))
    load_end = os.getloadavg()
    print()
    print(format_table(results))
    ratio = ratio_serial = identical = None
    if network and inprocess:
        network_wall, same_code, serial = (r["median_wall_s"] for r in results[-3:])
        ratio, ratio_serial = network_wall / same_code, network_wall / serial
        identical = same_metrics(network, inprocess)
        print(
            f"\nbayesadmm wall per round, network / in-process (same code): {ratio:.2f}x; network / in-process on"
            f" one thread: {ratio_serial:.2f}x; per-round metrics identical (network vs in-process): {identical}"
        )
    print()
    print(format_phases(results))
    print()
    print(format_cpu(results))
    print(f"\nload average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}")
    output = RESULTS / f"network_vs_inprocess-{args.label}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(
        json.dumps(
            {
                "benchmark": "network_vs_inprocess",
                "label": args.label,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "load_average_at_start": load_start,
                "load_average_at_end": load_end,
                "cpu_count": os.cpu_count(),
                "settings": {
                    "fraction": args.fraction,
                    "fedavg_rounds": args.fedavg_rounds,
                    "executor": args.executor,
                    "bayesadmm_rounds": args.bayesadmm_rounds,
                    "bayesadmm_clients": args.bayesadmm_clients,
                    "bayesadmm_run_config": bayesadmm,
                    "extra": extra,
                },
                "bayesadmm_ratio_network_over_inprocess": ratio,
                "bayesadmm_ratio_network_over_inprocess_one_thread": ratio_serial,
                "bayesadmm_metrics_identical": identical,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
