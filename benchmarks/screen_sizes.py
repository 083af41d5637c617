"""The screen on honest clients of very unequal size: does it refuse the one with the most data?

scikit-learn's digits (1,797 x 64, 10 classes), standardised with the training part's mean and standard deviation,
283 examples held out for the server (stratified, seed 0) and the other 1,514 dealt at random (`--seed`) to four
clients of 1,310 / 74 / 97 / 33 examples, as pre-partitioned npz:DIR files (docs/extending/data.md). Every strategy
with every key at its default (`--set KEY=VALUE` changes one), 20 rounds, in one process (the in-process grid of
deploy/inprocess.py: the real ServerApp, round core and ClientApp code).

Prints, per strategy: the rounds in which the screen refused a client (and which), the rounds a node sat out in
quarantine (of the 20), the accuracy at the last round before the first refusal and at the end. Rows go to
benchmarks/results/screen_sizes/<label>/<strategy>.jsonl (reused when present).

    python benchmarks/screen_sizes.py --label after
    python benchmarks/screen_sizes.py --label small-mlp --set hidden=32 --set activation=relu --set local-epochs=5
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.user_defaults import STRATEGIES
from fedbayes.deploy.inprocess import run_inprocess
from fedbayes.deploy.launcher import LocalRun, parse_override

RESULTS = Path(__file__).resolve().parent / "results" / "screen_sizes"
TEST_EXAMPLES = 283


def write_clients(sizes: list[int], seed: int, directory: Path) -> Path:
    """digits as npz:DIR: client-<i>.npz with sizes[i] training examples (dealt at random by `seed`), test.npz."""
    digits = load_digits()
    x, y = digits.data.astype(np.float64), digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=TEST_EXAMPLES, stratify=y, random_state=0)
    if sum(sizes) > len(y_train):
        raise SystemExit(f"--sizes: {sum(sizes)} examples in all, but digits has {len(y_train)} to deal")
    mean, std = x_train.mean(0), x_train.std(0)
    std[std == 0] = 1.0  # pixels that are 0 in every training image
    order = np.random.default_rng(seed).permutation(len(y_train))
    directory.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(np.split(order[: sum(sizes)], np.cumsum(sizes)[:-1])):
        features = ((x_train[rows] - mean) / std).astype(np.float32)
        np.savez(directory / f"client-{index}.npz", x=features, y=y_train[rows])
    np.savez(directory / "test.npz", x=((x_test - mean) / std).astype(np.float32), y=y_test)
    return directory


def run(label: str, strategy: str, args: argparse.Namespace, data: Path) -> list[dict]:
    path = RESULTS / label / f"{strategy}.jsonl"
    if not path.is_file():
        workdir = Path(tempfile.mkdtemp(prefix="screen-sizes-")) / "run"
        spec = LocalRun(
            strategy=strategy,
            clients=len(args.sizes),
            rounds=args.rounds,
            dataset=f"npz:{data}",
            seed=args.seed,
            workdir=workdir,
            quiet=True,
            overrides=dict(args.set),
        )
        try:
            workdir.mkdir()
            config = spec.run_config(workdir, workdir / "results.jsonl")
            rows = run_inprocess(config, len(args.sizes), workdir, pipeline_evaluation=True)
        finally:
            shutil.rmtree(workdir.parent, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return [json.loads(line) for line in path.read_text().splitlines()]


def screen_refusals(row: dict) -> list[str]:
    """The client ids the screen refused in a results row (its `rejected` is "client 'ID' (node N)" -> reason)."""
    return sorted(who.split("'")[1] for who, why in row["rejected"].items() if "refused by the screen" in why)


def summary(strategy: str, rows: list[dict]) -> dict:
    refused = {row["round"]: screen_refusals(row) for row in rows if screen_refusals(row)}
    first = min(refused, default=None)
    before = [row for row in rows if first is None or row["round"] < first]
    return {
        "strategy": strategy,
        "screen_refusals": refused,
        # a row's `quarantined` lists the nodes that sit out the next round
        "sat_out_rounds": [row["round"] + 1 for row in rows[:-1] if row["quarantined"]],
        "accuracy_before": before[-1]["accuracy"] if before else None,
        "round_before": before[-1]["round"] if before else None,
        "accuracy_end": rows[-1]["accuracy"],
    }


def table(results: list[dict]) -> str:
    lines = [f"{'strategy':<11} {'refused (round: clients)':<40} {'sat out':<12} {'acc before':>16} {'acc end':>8}"]
    for r in results:
        refusals = ", ".join(f"{k}: {'+'.join(v)}" for k, v in r["screen_refusals"].items()) or "none"
        sat_out = f"{min(r['sat_out_rounds'])}-{max(r['sat_out_rounds'])}" if r["sat_out_rounds"] else "none"
        before = f"{r['accuracy_before']:.3f} (r{r['round_before']})" if r["accuracy_before"] is not None else "-"
        lines.append(f"{r['strategy']:<11} {refusals:<40} {sat_out:<12} {before:>16} {r['accuracy_end']:>8.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="results go to results/screen_sizes/<label>/")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--sizes", default="1310,74,97,33", type=lambda text: [int(n) for n in text.split(",")])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", type=parse_override, default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="screen-sizes-data-"))
    try:
        write_clients(args.sizes, args.seed, data)
        results = []
        for strategy in args.strategies.split(","):
            results.append(summary(strategy, run(args.label, strategy, args, data)))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    print(table(results))
    (RESULTS / args.label / "summary.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
