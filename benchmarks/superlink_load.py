"""The SuperLink load test: a real SuperLink and ServerApp against N nodes speaking the Fleet API, m sampled a round.

For each N (`--nodes`), this starts `fedbayes superlink` and its ServerApp executor on 127.0.0.1, insecure, as
`fedbayes local` does (deploy/launcher.py `LocalFederation`, `--executor fork`: the SuperLink's warm executor forks
the run's ServerApp), and the load generator (tests/support/fleet_nodes.py), `--processes` processes sharing the N
nodes: Flower's own SuperNode connection and `fedbayes supernode`'s loop per node (`--poll`: its
FEDBAYES_SUPERNODE_POLL), each answering its instruction with a valid fedbayes FedAvg reply after
`--compute-seconds`. Once every node is connected it measures the idle federation for `--idle-seconds`, then, for
each m (`--sampled`), runs FedAvg with logreg on a `--fraction` of FMNIST for `--rounds` rounds that sample m of the
N nodes (`fraction-train` m/N, `min-clients` m, `wait-for-clients` N, `straggler-wait` 0: every reply is waited for)
and reports, over rounds 2..R (round 1 also pays for the run's start):

  wall_s        a round's wall: its start to the next round's start (the last: to its row), server/loop.py's clock
  slowest_s     the slowest sampled client's compute (the row's client_phase_max.update: the nodes report the
                simulated compute there)
  overhead_s    wall_s - slowest_s, median over the rounds (max: the worst round)
  committed     every round accepted exactly the m replies the nodes sent it (the rows' clients, clients_sent and
                rejected; the nodes' own record of their replies)
  SuperLink, ServerApp, nodes   CPU (cores: CPU-s per wall-s over the rounds' window) and peak RSS, from /proc
  pulls/s, heartbeats/s         the nodes' PullMessages and SendNodeHeartbeat calls per second, and a pull's mean
                                latency, over the same window

`--profile` samples the SuperLink and the ServerApp with py-spy (`pip install py-spy`) over the rounds' window and
prints the functions that held the CPU most: by own samples, and by the innermost fedbayes or Flower function running.
A case that fails (the run, the load generator, a node) is reported with why, and the next N is still run. The
federations' logs, the nodes' counters and the profiles are kept under `--workdir` if given.

Each case's row is appended to `--output` (JSONL, default benchmarks/results/scale/superlink_load.jsonl) with the
machine's load (`os.getloadavg()`) before and after it, and `--label`: the load generator shares this machine's cores
with the SuperLink and the ServerApp, and so does everything else running on it (its node threads count in the load
average too).

    python benchmarks/superlink_load.py --nodes 100 1000 --sampled 10 100 --rounds 6 [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python benchmarks/superlink_load.py` from a source checkout

import benchmarks.environment  # noqa: F401  (one thread, no telemetry: before torch and flwr)

# isort: split

from benchmarks.network_vs_inprocess import per_round, phase_medians
from fedbayes.deploy.processes import stop_processes_on_signals
from tests.support.superlink_load import LoadSettings, run_nodes

OUTPUT = REPO / "benchmarks" / "results" / "scale" / "superlink_load.jsonl"


def median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def summarised(case: dict[str, Any]) -> dict[str, Any]:
    """A measured case with its results rows replaced by their per-round summary (module docstring)."""
    if "rows" not in case:  # failed
        return case
    row = {key: value for key, value in case.items() if key != "rows"}
    rounds = per_round(case["rows"])
    return {
        **row,
        "wall_s": median([r["wall_s"] for r in rounds]),
        "slowest_s": median([r["slowest_s"] for r in rounds]),
        "overhead_s": median([r["overhead_s"] for r in rounds]),
        "overhead_max_s": max((r["overhead_s"] for r in rounds if r["overhead_s"] is not None), default=None),
        "per_round": rounds,
        "server_phases": phase_medians(case["rows"], "phase_seconds"),
    }


# ---- the table ----------------------------------------------------------------------------------------------------
def cell(value: Any, spec: str, width: int) -> str:
    return f"{value:{width}{spec}}" if isinstance(value, (int, float)) else f"{'-':>{width}}"


TABLE_HEADER = (
    "  nodes      m  wall_s  slow_s  ovh_s  ovh_max  SL_cores  SL_MiB  SA_cores  SA_MiB  gen_cores"
    "  pulls/s  hb/s  pull_ms  idle_SL_cores  committed  load_1m"
)


def table_row(row: dict[str, Any]) -> str:
    if "failure" in row:
        return f"{row['nodes']:>7}  {row['sampled']:>5}  FAILED: {row['failure'].splitlines()[0][:160]}"
    superlink, serverapp, nodes = (row.get(role, {}) for role in ("superlink", "serverapp", "generators"))
    return (
        f"{row['nodes']:>7}  {row['sampled']:>5}  {cell(row['wall_s'], '.2f', 6)}  {cell(row['slowest_s'], '.2f', 6)}"
        f"  {cell(row['overhead_s'], '.2f', 5)}  {cell(row['overhead_max_s'], '.2f', 7)}"
        f"  {cell(superlink.get('cores'), '.2f', 8)}  {cell(superlink.get('rss_mib_max'), '.0f', 6)}"
        f"  {cell(serverapp.get('cores'), '.2f', 8)}  {cell(serverapp.get('rss_mib_max'), '.0f', 6)}"
        f"  {cell(nodes.get('cores'), '.2f', 9)}  {cell(row['pulls_per_s'], '.0f', 7)}"
        f"  {cell(row['heartbeats_per_s'], '.1f', 4)}  {cell(row['pull_ms'], '.1f', 7)}"
        f"  {cell(row['idle'].get('superlink', {}).get('cores'), '.2f', 13)}"
        f"  {'yes' if row['committed']['all'] else 'NO':>9}  {cell(row['load']['load_1m'], '.1f', 7)}"
    )


def details(row: dict[str, Any]) -> str:
    """A case's phases, its first commit problem and its profiles, indented under the table."""
    if "failure" in row:
        return "\n".join(f"    {line}" for line in row["failure"].splitlines()[1:12])
    lines = []
    phases = ", ".join(f"{name} {seconds:.2f}" for name, seconds in row["server_phases"].items() if seconds)
    lines.append(f"  N={row['nodes']} m={row['sampled']}: server phases (median s): {phases}")
    lines += [f"    not committed: {problem}" for problem in row["committed"]["problems"][:3]]
    profiles = {**{f"idle {role}": summary for role, summary in row["idle"]["profiles"].items()}, **row["profiles"]}
    for role, summary in profiles.items():
        if summary:
            own = "; ".join(f"{frame} {share:.0%}" for frame, share in summary["own"][:6])
            innermost = "; ".join(f"{frame} {share:.0%}" for frame, share in summary["innermost"][:6])
            lines.append(f"    {role} profile ({summary['samples']} samples), own: {own}")
            lines.append(f"    {role} profile, innermost fedbayes/Flower function: {innermost}")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--sampled", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--rounds", type=int, default=LoadSettings.rounds)
    parser.add_argument("--compute-seconds", type=float, default=LoadSettings.compute_seconds)
    parser.add_argument("--processes", type=int, default=LoadSettings.processes, help="load generator processes")
    parser.add_argument("--fraction", type=float, default=LoadSettings.fraction, help="share of FMNIST (server)")
    parser.add_argument("--idle-seconds", type=float, default=LoadSettings.idle_seconds)
    parser.add_argument("--connect-rate", type=float, default=LoadSettings.connect_rate)
    parser.add_argument("--poll", type=float, default=LoadSettings.poll, help="the nodes' FEDBAYES_SUPERNODE_POLL")
    parser.add_argument("--profile", action="store_true", help="py-spy the SuperLink and the ServerApp")
    parser.add_argument("--key-curve", choices=("p256", "p384"), default="p256", help="the nodes' key curve")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument("--label", default="", help="a name for these rows (e.g. before/after a change)")
    parser.add_argument(
        "--workdir", type=Path, help="keep the federations' logs and profiles here (default: a temp dir)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    stop_processes_on_signals()
    settings = LoadSettings(
        rounds=args.rounds,
        compute_seconds=args.compute_seconds,
        processes=args.processes,
        fraction=args.fraction,
        idle_seconds=args.idle_seconds,
        connect_rate=args.connect_rate,
        poll=args.poll,
        profile=args.profile,
        key_curve=args.key_curve,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    print(f"load before: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    print(TABLE_HEADER, flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="superlink-load-") as temporary:
        root = args.workdir or Path(temporary)
        for nodes in args.nodes:
            for case in run_nodes(nodes, [m for m in args.sampled if m <= nodes], settings, root):
                row = {"label": args.label, "rounds_asked": args.rounds, "key_curve": settings.key_curve}
                row |= summarised(case)
                with args.output.open("a") as output:
                    output.write(json.dumps(row) + "\n")
                print(table_row(row), flush=True)
                rows.append(row)
    for row in rows:
        print(details(row))


if __name__ == "__main__":
    main()
