"""Every strategy at its defaults on data nobody tuned on, as a new user would run it (issue 30, item 6).

scikit-learn's bundled real datasets (not FMNIST): breast_cancer (569 x 30, 2 classes), wine (178 x 13, 3 classes) and
digits (1,797 x 64, 10 classes). Each: a stratified 75/25 train/test split (seed 0), the features standardised with
the training part's mean and standard deviation, written as npz:DIR (docs/extending/data.md). The federation:
`fedbayes local`, 3 clients on a Dirichlet split (their class mixes differ widely), the user's own MLP (one hidden
layer of 64 ReLU units: `hidden=64 activation=relu`), 10 rounds, every strategy key at its default.

Prints, per dataset and strategy, the last round's test accuracy, NLL and ECE: the Bayesian strategies' predictive
(the posterior ensemble where the row has one, else the mean) against FedAvg's. The target: at the defaults no
Bayesian strategy's NLL or ECE worse than FedAvg's (by over 5%). Resumable: each run's rows go to
benchmarks/results/user_defaults/<label>/<dataset>-<strategy>.jsonl and are reused.

    python benchmarks/user_defaults.py --label after
    python benchmarks/user_defaults.py --label trial --strategies bayesadmm,fedavg --set temperature=1

`--engine inprocess` runs each federation in this process instead (the same ServerApp and ClientApp code driven
through deploy/inprocess.py's in-process grid, no processes: seconds instead of a minute a run, the
same rows as the network path; for trials).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from sklearn import datasets
from sklearn.model_selection import train_test_split

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.deploy.inprocess import run_inprocess
from fedbayes.deploy.launcher import LocalRun, parse_override, run_local
from fedbayes.deploy.processes import stop_processes_on_signals

RESULTS = Path(__file__).resolve().parent / "results" / "user_defaults"
DATASETS = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine, "digits": datasets.load_digits}
STRATEGIES = (
    "fedavg",
    "fedprox",
    "bayesadmm",
    "feddyn",
    "fedlap",
    "fedlap-cov",
    "fedpa",
    "dsvgd",
    "p-dsvgd",
    "u-dsvgd",
)
MODEL = {"hidden": "64", "activation": "relu"}
TOLERANCE = 1.05  # "worse" than FedAvg: above 1.05x its NLL or ECE (a few test examples move these by a few %)


def write_dataset(name: str, directory: Path, load=None) -> Path:
    """`name` (scikit-learn's `load` function; default DATASETS[name]) as npz:DIR files: standardised features, a
    stratified 75/25 split."""
    bunch = (load or DATASETS[name])()
    x, y = bunch.data.astype(np.float64), bunch.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)
    mean, std = x_train.mean(0), x_train.std(0)
    std[std == 0] = 1.0  # digits has pixels that are 0 in every training image
    folder = directory / name
    folder.mkdir(parents=True, exist_ok=True)
    for split, features, labels in (("train", x_train, y_train), ("test", x_test, y_test)):
        np.savez(folder / f"{split}.npz", x=((features - mean) / std).astype(np.float32), y=labels)
    return folder


def run(label: str, dataset: str, strategy: str, args: argparse.Namespace, data: Path) -> dict:
    path = RESULTS / label / f"{dataset}-{strategy}.jsonl"
    if not path.is_file():
        workdir = Path(tempfile.mkdtemp(prefix="user-defaults-")) / "run"
        spec = LocalRun(
            strategy=strategy,
            clients=args.clients,
            rounds=args.rounds,
            dataset=f"npz:{data}",
            split="dirichlet",
            seed=args.seed,
            workdir=workdir,
            quiet=True,
            overrides={**MODEL, **dict(args.set)},
        )
        try:
            if args.engine == "inprocess":
                workdir.mkdir()
                config = spec.run_config(workdir, workdir / "results.jsonl")
                rows = run_inprocess(config, args.clients, workdir, pipeline_evaluation=True)
            else:
                rows = run_local(spec)
        finally:
            shutil.rmtree(workdir.parent, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    last = json.loads(path.read_text().splitlines()[-1])
    ensemble = "nll_ensemble" in last
    suffix = "_ensemble" if ensemble else ""
    return {
        "dataset": dataset,
        "strategy": strategy,
        "predictive": "ensemble" if ensemble else "mean",
        "accuracy": last[f"accuracy{suffix}"],
        "nll": last[f"nll{suffix}"],
        "ece": last[f"ece{suffix}"],
        "nll_mean": last["nll"],
        "ece_mean": last["ece"],
    }


def table(results: list[dict]) -> str:
    baseline = {r["dataset"]: r for r in results if r["strategy"] == "fedavg"}
    lines = [
        f"{'dataset':<14} {'strategy':<11} {'predictive':<10} {'accuracy':>8} {'NLL':>7} {'ECE':>7} "
        f"{'NLL@mean':>8} {'ECE@mean':>8}  vs FedAvg"
    ]
    for r in results:
        base = baseline.get(r["dataset"])
        verdict = ""
        if base is not None and r["strategy"] != "fedavg":
            worse = [key.upper() for key in ("nll", "ece") if r[key] > TOLERANCE * base[key]]
            verdict = "worse " + ", ".join(worse) if worse else "ok"
        lines.append(
            f"{r['dataset']:<14} {r['strategy']:<11} {r['predictive']:<10} {r['accuracy']:>8.4f} {r['nll']:>7.4f} "
            f"{r['ece']:>7.4f} {r['nll_mean']:>8.4f} {r['ece_mean']:>8.4f}  {verdict}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="results go to results/user_defaults/<label>/")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", type=parse_override, default=[], metavar="KEY=VALUE")
    parser.add_argument("--engine", default="network", choices=("network", "inprocess"))
    args = parser.parse_args()
    stop_processes_on_signals()
    data_root = Path(tempfile.mkdtemp(prefix="user-defaults-data-"))
    try:
        results = []
        for dataset in args.datasets.split(","):
            data = write_dataset(dataset, data_root)
            for strategy in args.strategies.split(","):
                results.append(run(args.label, dataset, strategy, args, data))
                print(table(results[-1:]).splitlines()[-1], flush=True)
    finally:
        shutil.rmtree(data_root, ignore_errors=True)
    print(table(results))
    (RESULTS / args.label / "summary.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
