"""The network path against the BayesADMM authors' single process, round for round (issue 33, item 3).

The same federation twice, one run after the other, --pairs times:

  ours    `fedbayes local --strategy bayesadmm --preset bayesadmm-paper --split iid --clients 10 --seed 62
          --fraction 1 --set split-file=F`: 10 SuperNodes, the SuperLink and the warm executor on this machine,
          on the authors' own seed-62 homogeneous FMNIST-10% split (F is written from their data generator, as
          `benchmarks/authors_baselines.py --write-split` does)
  theirs  their train.py, FedIVON on configs/fmnist_homog10/fedivon.yaml (the same split, settings and
          evaluation: the global mean and a 32-sample Bayesian model average on the 10,000 test images), on the
          CPU, once per --authors-threads count (default 1 and the machine's cores: a single process can use them
          all, and one thread can be the faster on small layers)

A round's seconds run from its start to the next round's start, the last round's to the end of its evaluation (ours:
from the result rows' round_s and wall_s, so that our evaluation of round r, done while round r+1 trains, counts as
far as it is not hidden; theirs: from their "Starting communication round" lines and the last evaluation line). Round 1
pays start-up and is left out: the per-round figure is the median over rounds 2..R. Each pair's ratio is ours over
theirs, measured back to back; the table gives every pair and the median ratio. Writes
benchmarks/results/authors_rounds/<label>.jsonl, one line per run, with the load average before it.

Run:  python benchmarks/authors_rounds.py --authors-code /path/to/bayes-admm --label L [--rounds 6 --pairs 3]
      (a checkout of team-approx-bayes/bayes-admm with Fashion-MNIST under DIR/data/FashionMNIST/raw)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from authors_baselines import write_split
from startup_shutdown import timed_authors_run, timed_local_run

RESULTS = Path(__file__).resolve().parent / "results" / "authors_rounds"
SEED = 62  # their configs' seed, and so their split's


def on_their_split(split_file: Path, seed: int) -> list[str]:
    """`fedbayes local`'s arguments for our BayesADMM under the bayesadmm-paper preset on their homogeneous split."""
    local_args = ["--strategy", "bayesadmm", "--preset", "bayesadmm-paper", "--split", "iid", "--clients", "10"]
    return [*local_args, "--seed", str(seed), "--fraction", "1", "--set", f"split-file={split_file}"]


def ours(split_file: Path, rounds: int, workdir: Path) -> dict:
    return timed_local_run(on_their_split(split_file, SEED), rounds, workdir)


def theirs(code: Path, threads: int, rounds: int, workdir: Path) -> dict:
    """Their single process with `threads` compute threads (torch's intra-op pool)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return timed_authors_run(code, {"seed_init": SEED}, rounds, workdir, env)


def round_seconds(run: dict) -> float:
    """Median seconds per round over rounds 2..R (module docstring)."""
    starts = run["round_starts_s"]
    ends = [*starts[2:], run["last_round_end_s"]]
    return statistics.median(end - start for start, end in zip(starts[1:], ends))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, required=True, help="a checkout of team-approx-bayes/bayes-admm")
    parser.add_argument("--label", required=True, help="the results file's name")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument(
        "--authors-threads",
        default=f"1,{os.cpu_count() or 1}",
        help="their process's compute threads, comma-separated: each runs after ours, and the ratio is to the fastest",
    )
    args = parser.parse_args()
    code = args.authors_code.resolve()
    if not (code / "train.py").is_file() or not (code / "data" / "FashionMNIST" / "raw").is_dir():
        parser.error(f"{code} must be a checkout of team-approx-bayes/bayes-admm with data/FashionMNIST/raw in it")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: round 1 is start-up, and a median needs rounds 2..R")
    threads = sorted({int(count) for count in args.authors_threads.split(",")})
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.label}.jsonl"
    table = []
    with tempfile.TemporaryDirectory(prefix="authors-rounds-") as temp:
        split_file = Path(temp) / f"split-iid-seed{SEED}.json"
        write_split(code, "iid", SEED, split_file)
        for pair in range(args.pairs):
            runs = {"ours": ours(split_file, args.rounds, Path(temp) / f"ours-{pair}")}
            for count in threads:
                runs[f"theirs, {count} thread(s)"] = theirs(
                    code, count, args.rounds, Path(temp) / f"theirs-{pair}-{count}"
                )
            seconds = {side: round_seconds(run) for side, run in runs.items()}
            with out.open("a") as results:
                for side, run in runs.items():
                    row = {"label": args.label, "side": side, "pair": pair, "rounds": args.rounds, **run}
                    results.write(json.dumps({**row, "round_s": seconds[side]}) + "\n")
            table.append((pair, seconds, {side: run["total_s"] for side, run in runs.items()}))
            load = runs["ours"]["load_before"][0]
            print(
                f"pair {pair} (load before {load:.1f}): "
                + ", ".join(f"{k} {v:.2f} s/round" for k, v in seconds.items()),
                flush=True,
            )
    sides = list(table[0][1])
    print(f"\nseconds per round, median over rounds 2..{args.rounds}; the ratio is ours over their fastest")
    print(f"| pair | {' | '.join(sides)} | **ours / theirs** | command -> exit s: {', '.join(sides)} |")
    print("|---|" + "---|" * (len(sides) + 2))
    ratios = []
    for pair, seconds, totals in table:
        ratios.append(seconds["ours"] / min(value for side, value in seconds.items() if side != "ours"))
        cells = " | ".join(f"{seconds[side]:.2f}" for side in sides)
        print(f"| {pair} | {cells} | **{ratios[-1]:.2f}×** | {', '.join(f'{totals[side]:.1f}' for side in sides)} |")
    print(f"median ratio {statistics.median(ratios):.2f}×")


if __name__ == "__main__":
    main()
