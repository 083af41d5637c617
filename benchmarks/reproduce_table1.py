"""Reproduce BayesADMM's Table 1 row (FMNIST-10%, MLP 784-200-100-10 sigmoid, 10 clients) through
the real local federation: a SuperLink and one SuperNode process per client, gRPC on loopback.

For each split (iid = "homogeneous", dirichlet = "heterogeneous") and strategy it runs
`fedbayes local` on identical splits (same seed), writes every round to
benchmarks/results/table1/<split>-<strategy>-seed<seed>.jsonl, prints accuracy and NLL at rounds
10/25/50 (the paper's metric: mean over rounds t-2..t) next to the paper's numbers, and plots accuracy
and NLL against the round.

    python benchmarks/reproduce_table1.py --splits dirichlet --strategies bayesadmm,fedavg --seed 0

Tuning runs (`--tag NAME --set key=value ...`, the overrides on top of the presets) go to
benchmarks/results/table1/tuning/ with their own summary, so they never replace the reference runs.

FedDyn, FedLap and FedLap-Cov (../shared/specs/feddyn-fedlap-splits.md) run with Adam 1e-3 and 5 local epochs
like FedAvg; FedDyn α = 1e-2, wd = 1e-4; FedLap/FedLap-Cov δ = 1 (one point of [P]'s grids each, not swept):

    python benchmarks/reproduce_table1.py --splits dirichlet,iid --strategies feddyn,fedlap-cov,fedlap

BayesADMM runs with the run config's default `noise=shared` (every client draws IVON's weight noise and its
minibatch order from the run seed in every round, as the reference code does); the earlier rows with fresh numbers
per client and round are `--tag independent --set noise=independent`.

Hyperparameters: BayesADMM uses the reference configuration (../shared/specs/bayesadmm.md §2),
which feeds raw 0-255 pixels (input-scale=255); FedAvg/FedProx use Adam 1e-3 on [0, 1] pixels with
5 local epochs, their usual good setting, not tuned down. FedPA (heterogeneous split only) uses
FedAvg's client and server setting, with 10 burn-in rounds and shrinkage ρ = 0.1 (spec fedpa.md §6.3).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploy.launcher import LocalRun, parse_override, run_local, stop_processes_on_signals  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "table1"
REPORT_ROUNDS = (10, 25, 50)

COMMON = {"model": "mlp", "hidden": "200,100", "activation": "sigmoid", "batch-size": 32}
PRESETS = {
    ("bayesadmm", "dirichlet"): {
        "local-epochs": 10, "lr": 5e-5, "hess-init": 1e-3, "temperature": 1e-3, "prior-precision": 1.0,
        "dual-damping": 1e-3, "rho": 0.2, "beta2": 0.9998, "lr-schedule": "cosine", "input-scale": 255.0,
    },
    ("bayesadmm", "iid"): {
        "local-epochs": 10, "lr": 5e-5, "hess-init": 1e-3, "temperature": 1e-3, "prior-precision": 0.5,
        "dual-damping": 1e-3, "rho": 0.1, "beta2": 0.9998, "lr-schedule": "constant", "input-scale": 255.0,
    },
    ("fedavg", "dirichlet"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam"},
    ("fedavg", "iid"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam"},
    ("fedprox", "dirichlet"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam", "proximal-mu": 0.01},
    ("fedprox", "iid"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam", "proximal-mu": 0.01},
    # FedDyn / FedLap / FedLap-Cov ([P] App. E.5 grids, one point each, not swept here): Adam 1e-3, 5 epochs.
    **{(strategy, split): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam", **preset}
       for split in ("dirichlet", "iid")
       for strategy, preset in (("feddyn", {"feddyn-alpha": 0.01, "weight-decay": 1e-4}),
                                ("fedlap", {"prior-precision": 1.0}), ("fedlap-cov", {"prior-precision": 1.0}))},
    # FedPA reuses FedAvg's client setting (the paper's protocol, §5.1) and FedAvg's server (SGD, lr 1):
    # 10 FedAvg rounds, then 1 discarded + 4 sampled epochs per round (the same 5 epochs), ρ = 0.1.
    ("fedpa", "dirichlet"): {
        "local-epochs": 5, "lr": 1e-3, "optimizer": "adam", "burn-in-rounds": 10, "samples": 4,
        "local-burnin-epochs": 1, "shrinkage": 0.1, "server-optimizer": "sgd", "server-lr": 1.0,
    },
}

# Paper Table 1 (FMNIST-10%, 10 clients), accuracy % at rounds 10/25/50; heterogeneous NLL where given.
PAPER_ACCURACY = {
    ("iid", "fedavg"): (72.3, 77.7, 80.0),
    ("iid", "fedprox"): (72.2, 77.4, 80.3),
    ("iid", "bayesadmm@mean"): (80.4, 83.1, 83.4),
    ("iid", "bayesadmm"): (80.6, 83.5, 84.1),
    ("dirichlet", "fedavg"): (70.4, 74.3, 76.0),
    ("dirichlet", "fedprox"): (69.9, 74.7, 76.9),
    ("dirichlet", "bayesadmm@mean"): (77.0, 81.4, 82.1),
    ("dirichlet", "bayesadmm"): (77.0, 81.5, 82.3),
    ("iid", "feddyn"): (75.3, 77.5, 78.2),
    ("iid", "fedlap"): (72.1, 77.1, 80.2),
    ("iid", "fedlap-cov"): (75.0, 79.8, 81.8),
    ("dirichlet", "feddyn"): (73.0, 74.6, 74.6),
    ("dirichlet", "fedlap"): (71.3, 74.3, 77.6),
    ("dirichlet", "fedlap-cov"): (74.6, 78.3, 80.5),
}
# NLL: BayesADMM's paper [C] Table 1 (FedDyn/FedLap rows taken from Swaroop et al.).
PAPER_NLL = {
    ("dirichlet", "fedavg"): (0.78, 0.72, 0.67), ("dirichlet", "bayesadmm"): (0.65, 0.52, 0.50),
    ("iid", "fedavg"): (0.70, 0.61, 0.56),
    ("iid", "feddyn"): (0.67, 0.63, 0.63), ("iid", "fedlap"): (0.71, 0.62, 0.57), ("iid", "fedlap-cov"): (0.67, 0.59, 0.56),
    ("dirichlet", "feddyn"): (0.75, 0.70, 0.77), ("dirichlet", "fedlap"): (0.75, 0.71, 0.65),
    ("dirichlet", "fedlap-cov"): (0.70, 0.63, 0.60),
}


def results_dir(tag: str) -> Path:
    return RESULTS / "tuning" if tag else RESULTS


def run_name(split: str, strategy: str, seed: int, tag: str) -> str:
    return f"{split}-{strategy}{'-' + tag if tag else ''}-seed{seed}"


def run(strategy: str, split: str, seed: int, rounds: int, clients: int, tag: str = "", extra: dict | None = None) -> dict:
    name = run_name(split, strategy, seed, tag)
    started = time.monotonic()
    rows = run_local(
        LocalRun(
            strategy=strategy, clients=clients, rounds=rounds, dataset="fmnist", fraction=0.1, split=split,
            seed=seed, results=results_dir(tag) / f"{name}.jsonl", workdir=Path("runs") / f"table1-{name}",
            overrides={**COMMON, **PRESETS[(strategy, split)], **(extra or {})},
        )
    )
    return {"strategy": strategy, "split": split, "seed": seed, "tag": tag, "overrides": extra or {}, "rows": rows,
            "wall_seconds": time.monotonic() - started}


def last_three(rows: list[dict], round_: int, key: str) -> float | None:
    values = [row[key] for row in rows if round_ - 2 <= row["round"] <= round_ and key in row]
    return sum(values) / len(values) if len(values) == 3 else None


def table(runs: list[dict]) -> str:
    lines = [f"{'split':<10} {'method':<16} {'acc@10/25/50 (ours)':<22} {'paper':<18} {'nll@10/25/50 (ours)':<22} {'paper nll':<16} wall"]
    for result in runs:
        variants = [("", result["strategy"])]
        if result["strategy"] == "bayesadmm":
            variants = [("", "bayesadmm@mean"), ("_ensemble", "bayesadmm")]
        tag = f" [{result['tag']}]" if result.get("tag") else ""
        for suffix, method in variants:
            accuracy = [last_three(result["rows"], r, f"accuracy{suffix}") for r in REPORT_ROUNDS]
            nll = [last_three(result["rows"], r, f"nll{suffix}") for r in REPORT_ROUNDS]
            paper = PAPER_ACCURACY.get((result["split"], method))
            paper_nll = PAPER_NLL.get((result["split"], method))
            lines.append(
                f"{result['split']:<10} {method + tag:<16} {_fmt(accuracy, 100, 1):<22} {_fmt(paper, 1, 1):<18} "
                f"{_fmt(nll, 1, 3):<22} {_fmt(paper_nll, 1, 2):<16} {result['wall_seconds'] / 60:.1f} min"
            )
    return "\n".join(lines)


def _fmt(values, scale: float, digits: int) -> str:
    if values is None:
        return "-"
    return " / ".join("-" if v is None else f"{v * scale:.{digits}f}" for v in values)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (accuracy_axis, nll_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for result in runs:
        rounds = [row["round"] for row in result["rows"]]
        label = f"{result['split']} {result['strategy']}"
        accuracy_axis.plot(rounds, [row["accuracy"] for row in result["rows"]], label=label + " @mean")
        nll_axis.plot(rounds, [row["nll"] for row in result["rows"]], label=label + " @mean")
        if "accuracy_ensemble" in result["rows"][0]:
            accuracy_axis.plot(rounds, [row["accuracy_ensemble"] for row in result["rows"]], "--", label=label + " ensemble")
            nll_axis.plot(rounds, [row["nll_ensemble"] for row in result["rows"]], "--", label=label + " ensemble")
    accuracy_axis.set(xlabel="round", ylabel="test accuracy", title="FMNIST-10%, 10 clients")
    nll_axis.set(xlabel="round", ylabel="test NLL", ylim=(0.3, 1.5))
    accuracy_axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def report(args: argparse.Namespace) -> None:
    directory = results_dir(args.tag)
    summary = json.loads((directory / f"summary-seed{args.seed}.json").read_text())
    walls = {(r["split"], r["strategy"], r.get("tag", "")): r["wall_seconds"] for r in summary}
    runs = []
    for split in args.splits.split(","):
        for strategy in args.strategies.split(","):
            path = directory / f"{run_name(split, strategy, args.seed, args.tag)}.jsonl"
            if path.exists() and (split, strategy, args.tag) in walls:
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                runs.append({"strategy": strategy, "split": split, "seed": args.seed, "tag": args.tag, "rows": rows,
                             "wall_seconds": walls[(split, strategy, args.tag)]})
    print(table(runs))
    if not args.tag:
        plot(runs, RESULTS / f"table1-seed{args.seed}.png")


def record_summary(result: dict, path: Path) -> None:
    """Add one run (without its rows) to the seed's summary, replacing an earlier run of the same pair."""
    summary = json.loads(path.read_text()) if path.exists() else []
    key = (result["split"], result["strategy"], result.get("tag", ""))
    summary = [r for r in summary if (r["split"], r["strategy"], r.get("tag", "")) != key]
    summary.append({k: v for k, v in result.items() if k != "rows"})
    path.write_text(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="bayesadmm,fedavg,fedprox")
    parser.add_argument("--splits", default="dirichlet,iid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--report", action="store_true", help="only tabulate and plot the runs already on disk")
    parser.add_argument("--tag", default="", help="a tuning run's name (results go to results/table1/tuning/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset value")
    args = parser.parse_args()
    if args.report:
        report(args)
        return
    stop_processes_on_signals()
    if args.set and not args.tag:
        parser.error("--set changes the presets: name the tuning run with --tag")
    directory = results_dir(args.tag)
    directory.mkdir(parents=True, exist_ok=True)
    extra = dict(parse_override(item) for item in args.set)
    runs = []
    for split in args.splits.split(","):
        for strategy in args.strategies.split(","):
            runs.append(run(strategy, split, args.seed, args.rounds, args.clients, args.tag, extra))
            record_summary(runs[-1], directory / f"summary-seed{args.seed}.json")
            print(table(runs[-1:]), flush=True)
    print()
    print(table(runs))
    if not args.tag:
        plot(runs, RESULTS / f"table1-seed{args.seed}.png")


if __name__ == "__main__":
    main()
