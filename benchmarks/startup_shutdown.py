"""A `fedbayes local` run's start-up and shutdown (issue 33, item 4), as a user sees them from the command line.

Runs `fedbayes local` --repeats times, one after another, and reads its output as it comes:

  to round 1     seconds from the command's start to round 1's row (start-up, round 1's training and evaluation)
  round 1        round 1's own wall seconds (the row's round_s), so that start-up = to round 1 - round 1
  last row->exit seconds from the last round's row to the command's exit (the ServerApp's end, the run's status,
                 every process stopped)
  SuperNode MiB  the mean RSS of the run's SuperNode processes, read once round 1's row is out

With --authors-code DIR (a checkout of the BayesADMM authors' code, team-approx-bayes/bayes-admm, with Fashion-MNIST
under DIR/data/FashionMNIST/raw) each repeat runs their single process after ours, back to back: FedIVON on their
configs/fmnist_homog10/fedivon.yaml on the CPU, for --rounds rounds. Their start-up is the time to their first
"Starting communication round", round 1 from there to round 1's last evaluation line, and last row -> exit from their
last round's last evaluation line to the process's exit. Writes benchmarks/results/startup_shutdown/<label>.jsonl,
one line per run (ours, then theirs under <label>-authors), with the load average before it.

Run:  python benchmarks/startup_shutdown.py --label after [--strategy bayesadmm --clients 10 --rounds 3 --repeats 3]
      [--authors-code /path/to/bayes-admm]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
    """Mean RSS (MiB) of the live SuperNodes running in this run's workdir: processes named supernode-<i> (forked by
    the SuperNodes' fork server, deploy/forkserver.py) or started as `fedbayes supernode`."""
    sizes = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            command = (proc / "cmdline").read_bytes().split(b"\0")
            forked = (proc / "comm").read_text().startswith("supernode-")
            started = b"supernode" in command[:3]  # python, the fedbayes script, its subcommand
            if (forked or started) and (proc / "cwd").resolve() == workdir.resolve():
                sizes.append(status_kib(int(proc.name), "VmRSS") / 1024)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue  # gone meanwhile
    return statistics.mean(sizes) if sizes else None


def one_run(args: argparse.Namespace, workdir: Path) -> dict:
    command = [
        "--strategy",
        args.strategy,
        "--clients",
        str(args.clients),
        "--fraction",
        str(args.fraction),
        *[part for setting in args.set for part in ("--set", setting)],
    ]
    return timed_local_run(command, args.rounds, workdir)


def timed_local_run(local_args: list[str], rounds: int, workdir: Path) -> dict:
    """`fedbayes local LOCAL_ARGS --rounds ROUNDS --workdir WORKDIR`, its rows' times read as they are printed."""
    command = [
        str(Path(sys.executable).parent / "fedbayes"),
        "local",
        *local_args,
        "--rounds",
        str(rounds),
        "--workdir",
        str(workdir),
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
    if process.returncode != 0 or len(rows) != rounds:
        raise SystemExit(f"`{' '.join(command)}` failed ({process.returncode}):\n{''.join(lines[-30:])}")
    first_at, first = rows[0]
    return {
        "to_round_1_s": first_at,
        "round_1_s": float(first[5]),  # round, accuracy, nll, ece, clients, round_s, wall_s
        "last_row_to_exit_s": ended - rows[-1][0],
        "total_s": ended,
        # the ServerApp's clock: a round starts at its row's wall_s less its round_s and ends at its wall_s
        "round_starts_s": [float(row[6]) - float(row[5]) for _, row in rows],
        "last_round_end_s": float(rows[-1][1][6]),
        "supernode_rss_mib": rss,
        "load_before": load,
    }


AUTHORS_CONFIG = Path("configs/fmnist_homog10/fedivon.yaml")
AUTHORS_ROUND_STARTS = re.compile(r"^Starting communication round")
AUTHORS_EVALUATION = re.compile(r"^(Comm round \d+:|  \[Bayes Model-Avg\])")  # a round's two evaluation lines


def authors_run(args: argparse.Namespace, workdir: Path) -> dict:
    """The authors' train.py on their homogeneous FMNIST-10% configuration, on the CPU, for args.rounds rounds."""
    return timed_authors_run(args.authors_code, {}, args.rounds, workdir, dict(os.environ))


def write_authors_config(code: Path, config_changes: dict, rounds: int, workdir: Path) -> Path:
    """Their configs/fmnist_homog10/fedivon.yaml with CONFIG_CHANGES, on the CPU, for ROUNDS rounds, written into
    WORKDIR (made here)."""
    import yaml

    config = yaml.safe_load((code / AUTHORS_CONFIG).read_text())
    config.update(use_cuda=False, num_comm_rounds=rounds, wandb_log=False, **config_changes)
    workdir.mkdir(parents=True)
    config_file = workdir / "fedivon.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return config_file


def timed_authors_run(code: Path, config_changes: dict, rounds: int, workdir: Path, env: dict[str, str]) -> dict:
    """Their train.py on configs/fmnist_homog10/fedivon.yaml with CONFIG_CHANGES, on the CPU, for ROUNDS rounds; a
    round ends at its last evaluation line."""
    config_file = write_authors_config(code, config_changes, rounds, workdir)
    command = [sys.executable, "-u", "train.py", "--config_file", str(config_file), "--path", str(workdir)]
    load = os.getloadavg()
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    round_starts, evaluations, lines = [], [], []
    for line in process.stdout:
        lines.append(line)
        if AUTHORS_ROUND_STARTS.match(line):
            round_starts.append(time.monotonic() - started)
        elif AUTHORS_EVALUATION.match(line):
            evaluations.append((len(round_starts), time.monotonic() - started))
    process.wait()
    ended = time.monotonic() - started
    if process.returncode != 0 or len(round_starts) != rounds:
        raise SystemExit(f"`{' '.join(command)}` failed ({process.returncode}):\n{''.join(lines[-30:])}")
    round_ends = [max(at for number, at in evaluations if number == index) for index in range(1, rounds + 1)]
    return {
        "to_round_1_s": round_ends[0],
        "round_1_s": round_ends[0] - round_starts[0],
        "last_row_to_exit_s": ended - evaluations[-1][1],
        "total_s": ended,
        "round_starts_s": round_starts,
        "last_round_end_s": round_ends[-1],
        "supernode_rss_mib": None,
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
    parser.add_argument(
        "--authors-code", type=Path, help="the BayesADMM authors' code: run it after each of our runs, for a ratio"
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.label}.jsonl"
    kinds = {args.label: one_run, **({f"{args.label}-authors": authors_run} if args.authors_code else {})}
    runs: dict[str, list[dict]] = {label: [] for label in kinds}
    settings = {**vars(args), "authors_code": str(args.authors_code) if args.authors_code else None}
    for repeat in range(args.repeats):
        for label, measure in kinds.items():
            with tempfile.TemporaryDirectory(prefix="startup-") as temp:
                run = {**settings, "label": label, "repeat": repeat, **measure(args, Path(temp) / "fed")}
            with out.open("a") as results:
                results.write(json.dumps(run) + "\n")
            runs[label].append(run)
            rss = "" if run["supernode_rss_mib"] is None else f", SuperNode {run['supernode_rss_mib']:.0f} MiB"
            print(
                f"{label} #{repeat}: to round 1 {run['to_round_1_s']:.1f} s (round 1 {run['round_1_s']:.1f} s), "
                f"last row -> exit {run['last_row_to_exit_s']:.1f} s{rss}, load {run['load_before'][0]:.1f}",
                flush=True,
            )
    print("\n| run (median) | to round 1 s | round 1 s | start-up s | last row -> exit s | SuperNode RSS MiB |")
    print("|---|---|---|---|---|---|")
    for label, measured in runs.items():
        median = {
            name: statistics.median(run[name] for run in measured)
            for name in ("to_round_1_s", "round_1_s", "last_row_to_exit_s")
        }
        sizes = [run["supernode_rss_mib"] for run in measured if run["supernode_rss_mib"] is not None]
        print(
            f"| {label}, {len(measured)} runs | {median['to_round_1_s']:.1f} | {median['round_1_s']:.1f} | "
            f"{median['to_round_1_s'] - median['round_1_s']:.1f} | {median['last_row_to_exit_s']:.1f} | "
            f"{f'{statistics.median(sizes):.0f}' if sizes else '-'} |"
        )


if __name__ == "__main__":
    main()
