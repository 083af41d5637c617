"""Uncertainty for error detection on FMNIST-10% (10 clients, heterogeneous split): how well BayesADMM's mutual
information (epistemic) and predictive entropy tell the test examples its posterior predictive gets wrong from those
it gets right, against FedAvg's softmax entropy, as AUROC (0.5: no better than chance; bayes/metrics.py's, as the
server's rows compute it: `misclassification_auroc`).

Runs both federations through `fedbayes local` with Table 1's settings (benchmarks/reproduce_table1.py presets,
dirichlet split, MLP 784-200-100-10), exports the final round (`fedbayes export`'s code, posterior/export.py) and
predicts on the FMNIST test set with `fedbayes.posterior` (BayesADMM: its `ensemble-samples`-sample predictive with
the server's round seed, and at its mean m̄; FedAvg: its one model). Prints a table and writes
benchmarks/results/uncertainty/auroc.json. Resumable: a run whose results reach the last round is reused, an
interrupted one continues from its checkpoint (`fedbayes local --resume`), each in runs/uncertainty-auroc/.

    python benchmarks/uncertainty_auroc.py               # 50 rounds each: hours on a 2-core CPU
    python benchmarks/uncertainty_auroc.py --smoke       # 2 clients, 2 rounds, FMNIST-2%, logreg: a few minutes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproduce_table1 import COMMON, PRESETS

from fedbayes.bayes.metrics import misclassification_auroc
from fedbayes.deploy.launcher import FLWR_HOME, LocalRun, run_local
from fedbayes.deploy.processes import stop_processes_on_signals
from fedbayes.posterior import load
from fedbayes.posterior.export import export_posterior, locate_run
from fedbayes.tasks.datasets import load_dataset

RESULTS = Path(__file__).resolve().parent / "results" / "uncertainty"
STRATEGIES = ("bayesadmm", "fedavg")
SPLIT = "dirichlet"
SMOKE = {
    "clients": 2,
    "rounds": 2,
    "fraction": 0.02,
    "overrides": {"model": "logreg", "local-epochs": 1, "ensemble-samples": 4},
}


def workdir_of(strategy: str, args: argparse.Namespace) -> Path:
    return Path("runs") / f"uncertainty-auroc{'-smoke' if args.smoke else ''}" / f"{SPLIT}-{strategy}-seed{args.seed}"


def finished_rounds(workdir: Path) -> int:
    results = workdir / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.is_file() else []
    return max((row["round"] for row in rows), default=0)


def train(strategy: str, args: argparse.Namespace) -> Path:
    """The run's workdir, its federation trained to `rounds` (reused when done, resumed when interrupted)."""
    workdir = workdir_of(strategy, args)
    done = finished_rounds(workdir)
    if done >= args.rounds:
        print(f"{strategy}: reusing {workdir} ({done} rounds)", flush=True)
        return workdir
    resume = (workdir / FLWR_HOME).is_dir()
    print(f"{strategy}: {'resuming' if resume else 'starting'} {workdir} (round {done} of {args.rounds})", flush=True)
    run_local(
        LocalRun(
            strategy=strategy,
            clients=args.clients,
            rounds=args.rounds,
            dataset="fmnist",
            fraction=args.fraction,
            split=SPLIT,
            seed=args.seed,
            workdir=workdir,
            resume=resume,
            overrides={**COMMON, **PRESETS[(strategy, SPLIT)], **args.overrides},
        )
    )
    return workdir


def measure(strategy: str, workdir: Path) -> list[dict]:
    """AUROC rows of the run's final round: its global model's softmax entropy, and, where the strategy has a
    posterior, its predictive's entropy and mutual information."""
    exported = workdir / "posterior.safetensors"
    header = export_posterior(locate_run(workdir, None), exported)
    posterior = load(exported)
    test = load_dataset("fmnist", train=False)
    rows = []
    predictions = {"global model": posterior.predict(test.pixels, samples=0)}
    if header.kind != "point":
        predictions["posterior"] = posterior.predict(test.pixels)  # the run's ensemble-samples, the server's seed
    for name, prediction in predictions.items():
        scores = {"entropy": prediction.entropy}
        if prediction.members > 1:
            scores["mutual information"] = prediction.mutual_information
        for score_name, score in scores.items():
            rows.append(
                {
                    "strategy": strategy,
                    "predictive": name,
                    "members": prediction.members,
                    "score": score_name,
                    "accuracy": (prediction.predicted == test.labels).double().mean().item(),
                    "auroc": misclassification_auroc(score, prediction.predicted == test.labels),
                    "round": header.round,
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'strategy':<10} {'predictive':<16} {'score':<19} {'accuracy':>8} {'AUROC':>7}"]
    for row in rows:
        predictive = row["predictive"] if row["members"] == 1 else f"{row['predictive']} ({row['members']})"
        shown_auroc = "-" if row["auroc"] is None else f"{row['auroc']:.4f}"  # None: no mistakes, or no right ones
        lines.append(
            f"{row['strategy']:<10} {predictive:<16} {row['score']:<19} {row['accuracy']:>8.4f} {shown_auroc:>7}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="tiny settings, to check that the script works")
    args = parser.parse_args()
    args.overrides = {}
    if args.smoke:
        args.clients, args.rounds, args.fraction = SMOKE["clients"], SMOKE["rounds"], SMOKE["fraction"]
        args.overrides = SMOKE["overrides"]
    stop_processes_on_signals()
    started = time.monotonic()
    rows = [row for strategy in STRATEGIES for row in measure(strategy, train(strategy, args))]
    print(table(rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    output = RESULTS / f"auroc{'-smoke' if args.smoke else ''}.json"
    output.write_text(
        json.dumps(
            {
                "settings": {key: value for key, value in vars(args).items()},
                "split": SPLIT,
                "rows": rows,
                "wall_seconds": time.monotonic() - started,
            },
            indent=1,
        )
    )
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
