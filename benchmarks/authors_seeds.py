"""BayesADMM's homogeneous early rounds, ours against the BayesADMM authors' code over training seeds (issue 30,
item 5).

One seed-62 run of each code on the authors' seed-62 homogeneous FMNIST-10% split differed by 4.2 / 2.1 / 1.2 / 1.0
points in rounds 1-4 (docs/results/table1.md, "The authors' code side by side"), and our own seeds on that split
spread by 9 points in round 1. Whether the two codes differ, or only their random draws do, needs both codes' spread
over the same seeds: on the same split (their data generator's, seed 62, for every run), the training seed S sets
the initial weights, IVON's weight noise and the minibatch order, and nothing else.

  ours    `fedbayes local --strategy bayesadmm --preset bayesadmm-paper --split iid --clients 10 --seed S
          --fraction 1 --set split-file=F` (the network path: 10 SuperNodes on this machine)
  theirs  their train.py, FedIVON on configs/fmnist_homog10/fedivon.yaml on the CPU, with its data generator held to
          seed 62 and the rest of the run seeded with S (their train.py seeds both from one value; a runner swaps
          the generator's seed before their script runs, nothing else; S = 62 is their run unchanged)

Since BayesADMM's shared noise draws each epoch's permutation and then the noise from one generator seeded with S, as
their code does, a seed gives both codes the same initial weights, minibatches and weight noise: the runs pair up.
The report gives per round each code's mean ± sd over the seeds, the mean of the per-seed differences (ours − theirs,
the difference of the means) with its standard error, sd(differences)/sqrt(n), and the largest per-seed difference.
Our rows from before (the permutation from a generator of its own: their initial weights, other minibatches and
noise) are in EARLIER_ROWS' folders, with those of a first fix that gave the noise a seed of its own: `--report
--ours-from NAME`.

Run:  python benchmarks/authors_seeds.py --authors-code /path/to/bayes-admm [--seeds 62,0,1,2,3] [--rounds 10]
      python benchmarks/authors_seeds.py --report
      (a checkout of team-approx-bayes/bayes-admm with Fashion-MNIST under DIR/data/FashionMNIST/raw)

Resumable: each run writes benchmarks/results/table1/authors-seeds/<code>-seed<S>.jsonl, one row per round
(accuracy of the global mean as a fraction, NLL, seconds since the start, the load average before the run); a file
with all its rounds is not run again, an interrupted run starts over.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from authors_baselines import ROUND_LINE, read_rows, write_split
from authors_rounds import on_their_split
from startup_shutdown import write_authors_config

RESULTS = Path(__file__).resolve().parent / "results" / "table1" / "authors-seeds"
# Our rows from before BayesADMM's shared noise drew the permutation from the noise's generator (2026-11-29), whose
# first noise every round replayed the initial weights' draws; and from a first fix that seeded the noise with a seed
# derived from S (the draws no longer paired with theirs). docs/results/table1.md, "Both codes over the same seeds".
EARLIER_ROWS = {"before-shared-stream": "ours-before-noise-stream", "own-noise-seed": "ours-own-noise-seed"}
SPLIT_SEED = 62  # their configs' seed, and so their split's
CODES = ("ours", "theirs")
# Their train.py with the data generator's seed held at SPLIT_SEED: the generator draws the split from numpy's global
# stream, which their __main__ seeds with the run's seed just before; every later draw is seeded again with it.
THEIR_RUNNER = """
import runpy, sys
import numpy as np
import data_generators
split_seed = int(sys.argv.pop(1))
Generator = data_generators.FederatedMNISTDataGenerator
class SplitSeeded(Generator):
    def __init__(self, *args, seed, **kwargs):
        np.random.seed(split_seed)
        super().__init__(*args, seed=split_seed, **kwargs)
data_generators.FederatedMNISTDataGenerator = SplitSeeded
runpy.run_path("train.py", run_name="__main__")
"""


def run_ours(split_file: Path, seed: int, rounds: int, workdir: Path) -> list[dict]:
    command = [str(Path(sys.executable).parent / "fedbayes"), "local", *on_their_split(split_file, seed)]
    command += ["--rounds", str(rounds), "--workdir", str(workdir)]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout[-3000:]}")
    rows = read_rows(workdir / "results.jsonl")
    return [
        {"round": r["round"], "accuracy": r["accuracy"], "nll": r["nll"], "seconds": r["wall_seconds"]} for r in rows
    ]


def run_theirs(code: Path, seed: int, rounds: int, workdir: Path) -> list[dict]:
    config_file = write_authors_config(code, {"seed_init": seed, "num_runs": 1}, rounds, workdir)
    command = [sys.executable, "-u", "-c", THEIR_RUNNER, str(SPLIT_SEED), "--config_file", str(config_file)]
    started = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    rows, tail = [], []
    for line in process.stdout:
        tail = [*tail[-30:], line]
        if match := ROUND_LINE.match(line):
            seconds = round(time.monotonic() - started, 1)
            rows.append(
                {
                    "round": int(match[1]),
                    "accuracy": float(match[2]) / 100.0,
                    "nll": float(match[3]),
                    "seconds": seconds,
                }
            )
    if process.wait() != 0 or len(rows) != rounds:
        raise SystemExit(f"their train.py failed ({process.returncode}):\n{''.join(tail)}")
    return rows


def run(code_name: str, seed: int, rounds: int, authors: Path | None, split_file: Path, temp: Path) -> None:
    results = RESULTS / f"{code_name}-seed{seed}.jsonl"
    if len(read_rows(results)) >= rounds:
        print(f"{results.name}: done, not run again", flush=True)
        return
    load = os.getloadavg()[0]
    workdir = temp / f"{code_name}-{seed}"
    if code_name == "ours":
        rows = run_ours(split_file, seed, rounds, workdir)
    else:
        assert authors is not None
        rows = run_theirs(authors, seed, rounds, workdir)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results.write_text("".join(json.dumps({**row, "load_at_start": load}) + "\n" for row in rows))
    print(f"{results.name}: " + " / ".join(f"{100 * r['accuracy']:.1f}" for r in rows) + f" (load {load:.1f})")


def report(ours: Path = RESULTS) -> str:
    """Per round, over the seeds with that round from both codes (runs with --rounds 2 add to rounds 1-2 only); our
    rows from `ours`."""
    folders = {"ours": ours, "theirs": RESULTS}
    runs = {
        code: {int(f.stem.rsplit("seed", 1)[1]): read_rows(f) for f in folders[code].glob(f"{code}-seed*.jsonl")}
        for code in CODES
    }
    seeds = sorted(set(runs["ours"]) & set(runs["theirs"]))
    if not seeds:
        return "no seed has both codes' rows yet"
    rounds = max(min(len(runs[code][seed]) for code in CODES) for seed in seeds)
    lines = [
        f"accuracy of the global mean %, seeds {', '.join(map(str, seeds))}, the authors' seed-{SPLIT_SEED} "
        "homogeneous split",
        "",
        "| round | seeds | ours, mean ± sd | theirs, mean ± sd | ours − theirs | its standard error | largest |",
        "|---|---|---|---|---|---|---|",
    ]
    for index in range(rounds):
        having = [seed for seed in seeds if all(len(runs[code][seed]) > index for code in CODES)]
        cells = {code: [100 * runs[code][seed][index]["accuracy"] for seed in having] for code in CODES}
        differences = [ours_ - theirs_ for ours_, theirs_ in zip(cells["ours"], cells["theirs"])]
        sd = {code: statistics.stdev(values) if len(values) > 1 else float("nan") for code, values in cells.items()}
        mean = {code: statistics.fmean(values) for code, values in cells.items()}
        error = statistics.stdev(differences) / math.sqrt(len(having)) if len(having) > 1 else float("nan")
        largest = max(differences, key=abs)
        lines.append(
            f"| {index + 1} | {len(having)} | {mean['ours']:.1f} ± {sd['ours']:.1f} | {mean['theirs']:.1f} ± "
            f"{sd['theirs']:.1f} | {statistics.fmean(differences):+.2f} | {error:.2f} | {largest:+.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, help="a checkout of team-approx-bayes/bayes-admm")
    parser.add_argument("--seeds", default="62,0,1,2,3")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--codes", default="ours,theirs", help="which codes to run, comma-separated")
    parser.add_argument("--report", action="store_true", help="print the table from the files on disk and stop")
    parser.add_argument(
        "--ours-from",
        choices=sorted(EARLIER_ROWS),
        help="with --report: our earlier rows (EARLIER_ROWS) in place of the current ones",
    )
    args = parser.parse_args()
    if args.report:
        print(report(RESULTS / EARLIER_ROWS[args.ours_from] if args.ours_from else RESULTS))
        return
    if args.authors_code is None:
        parser.error("--authors-code is needed to run (their split is written from their data generator)")
    code = args.authors_code.resolve()
    if not (code / "train.py").is_file() or not (code / "data" / "FashionMNIST" / "raw").is_dir():
        parser.error(f"{code} must be a checkout of team-approx-bayes/bayes-admm with data/FashionMNIST/raw in it")
    codes = args.codes.split(",")
    if unknown := set(codes) - set(CODES):
        parser.error(f"--codes: unknown {sorted(unknown)}; choose from {', '.join(CODES)}")
    with tempfile.TemporaryDirectory(prefix="authors-seeds-") as temp:
        split_file = Path(temp) / f"split-iid-seed{SPLIT_SEED}.json"
        write_split(code, "iid", SPLIT_SEED, split_file)
        for seed in (int(s) for s in args.seeds.split(",")):
            for code_name in codes:
                run(code_name, seed, args.rounds, code, split_file, Path(temp))
    print(report())


if __name__ == "__main__":
    main()
