"""A `fedbayes local` run's start-up and shutdown (issue 33, item 4), as a user sees them from the command line.

Runs `fedbayes local` --repeats times, one after another, and reads its output as it comes:

  to round 1     seconds from the command's start to round 1's row (start-up, round 1's training and evaluation)
  round 1        round 1's own wall seconds (the row's round_s), so that start-up = to round 1 - round 1
  last row->exit seconds from the last round's row to the command's exit (the ServerApp's end, the run's status,
                 every process stopped)
  SuperNode MiB  the mean RSS of the run's SuperNode processes, read once round 1's row is out

The authors' single process took 10-13 s to its first round and 3 s to exit on this 2-core machine (issue 33). Writes
benchmarks/results/startup_shutdown/<label>.jsonl, one line per run, with the load average before it.

Run:  python benchmarks/startup_shutdown.py --label after [--strategy bayesadmm --clients 10 --rounds 3 --repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import status_kib

RESULTS = Path(__file__).resolve().parent / "results" / "startup_shutdown"
ROW_PREFIX = " round  accuracy"  # `fedbayes local`'s table header; rows follow it


def supernode_rss_mib(workdir: Path) -> float | None:
    """Mean RSS (MiB) of the live `fedbayes supernode` processes whose command line names this run's workdir."""
    sizes = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
            if b"supernode" in command and any(str(workdir).encode() in part for part in command):
                sizes.append(status_kib(int(proc.name), "VmRSS") / 1024)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone meanwhile
    return statistics.mean(sizes) if sizes else None


def one_run(args: argparse.Namespace, workdir: Path) -> dict:
    command = [
        str(Path(sys.executable).parent / "fedbayes"),
        "local",
        "--strategy",
        args.strategy,
        "--clients",
        str(args.clients),
        "--rounds",
        str(args.rounds),
        "--fraction",
        str(args.fraction),
        "--workdir",
        str(workdir),
        *[part for setting in args.set for part in ("--set", setting)],
    ]
    load = os.getloadavg()
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    header_seen, rows, rss, lines = False, [], None, []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(ROW_PREFIX):
            header_seen = True
        elif header_seen and line.split()[:1] and line.split()[0].isdigit():
            rows.append((time.monotonic() - started, line.split()))
            if rss is None:
                rss = supernode_rss_mib(workdir)
    process.wait()
    ended = time.monotonic() - started
    if process.returncode != 0 or len(rows) != args.rounds:
        raise SystemExit(f"`{' '.join(command)}` failed ({process.returncode}):\n{''.join(lines[-30:])}")
    first_at, first = rows[0]
    return {
        "to_round_1_s": first_at,
        "round_1_s": float(first[5]),  # round, accuracy, nll, ece, clients, round_s, wall_s
        "last_row_to_exit_s": ended - rows[-1][0],
        "total_s": ended,
        "supernode_rss_mib": rss,
        "load_before": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="the results file's name, e.g. before / after")
    parser.add_argument("--strategy", default="bayesadmm")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.02, help="of FMNIST: start-up does not depend on it")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config values")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.label}.jsonl"
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="startup-") as temp:
            run = {"label": args.label, "repeat": repeat, **vars(args), **one_run(args, Path(temp) / "fed")}
        with out.open("a") as results:
            results.write(json.dumps(run) + "\n")
        runs.append(run)
        print(
            f"{args.label} #{repeat}: to round 1 {run['to_round_1_s']:.1f} s (round 1 {run['round_1_s']:.1f} s), "
            f"last row -> exit {run['last_row_to_exit_s']:.1f} s, SuperNode {run['supernode_rss_mib']:.0f} MiB, "
            f"load {run['load_before'][0]:.1f}",
            flush=True,
        )
    median = {
        name: statistics.median(run[name] for run in runs)
        for name in ("to_round_1_s", "round_1_s", "last_row_to_exit_s", "supernode_rss_mib")
    }
    print("\n| run (median) | to round 1 s | round 1 s | start-up s | last row -> exit s | SuperNode RSS MiB |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.label}, {len(runs)} runs | {median['to_round_1_s']:.1f} | {median['round_1_s']:.1f} | "
        f"{median['to_round_1_s'] - median['round_1_s']:.1f} | {median['last_row_to_exit_s']:.1f} | "
        f"{median['supernode_rss_mib']:.0f} |"
    )


if __name__ == "__main__":
    main()
