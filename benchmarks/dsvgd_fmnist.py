"""DSVGD's Bayesian neural network against FedAvg on FMNIST-10% with 10 clients, through the real local
federation (a SuperLink and one SuperNode process per client, gRPC on loopback): accuracy, NLL and ECE of
the global model after every round.

The paper's setting (Kassab & Simeone Sec. 7 / App. C; docs/algorithms/dsvgd.md): an MLP 784-100-10
with ReLU, prior N(0, I/e), N = 20 particles, KDE bandwidth 0.55, AdaGrad-with-momentum lr 1e-3, batch 100,
ONE client per round (round-robin); FedAvg likewise schedules one client per round (`fraction-train=0.1`)
and trains Adam 1e-3 on its data. DSVGD is evaluated as the particle-averaged predictive (the `_ensemble`
keys); the plain keys of its rows evaluate the particle mean, which is no model of a network.
Not reproduced, for CPU time on a shared 2-core machine: the paper's N = 20 and L = L' = 200 (N = 10 and
L = L' = 50 here; `--set particles=20 --set local-steps=200 --set distill-steps=200` for the paper's); the paper
reports MCE, we report ECE.

    python benchmarks/dsvgd_fmnist.py --rounds 10
    python benchmarks/dsvgd_fmnist.py --strategies dsvgd --rounds 20 --tag r20      # each client twice
    python benchmarks/dsvgd_fmnist.py --report --tag ,r20    # tabulate the runs on disk

Writes benchmarks/results/dsvgd/fmnist-<strategy>-seed<seed>.jsonl (one row per round) and a summary JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.deploy.launcher import LocalRun, parse_override, run_local
from fedbayes.deploy.processes import stop_processes_on_signals

RESULTS = Path(__file__).resolve().parent / "results" / "dsvgd"
MODEL = {"model": "mlp", "hidden": "100", "activation": "relu", "batch-size": 100}
PRESETS = {
    "dsvgd": {
        "particles": 10,
        "local-steps": 50,
        "distill-steps": 50,
        "kde-bandwidth": 0.55,
        "svgd-lr": 1e-3,
        "distill-lr": 1e-3,
        "prior-precision": 2.718281828,
        "dsvgd-alpha": 1.0,
        "ensemble-samples": 10,
    },
    "fedavg": {"fraction-train": 0.1, "local-epochs": 10, "lr": 1e-3, "optimizer": "adam"},
}


def run_name(strategy: str, seed: int, tag: str) -> str:
    return f"fmnist-{strategy}{'-' + tag if tag else ''}-seed{seed}"


def run(strategy: str, rounds: int, seed: int, extra: dict, tag: str) -> dict:
    started = time.monotonic()
    name = run_name(strategy, seed, tag)
    rows = run_local(
        LocalRun(
            strategy=strategy,
            clients=10,
            rounds=rounds,
            dataset="fmnist",
            fraction=0.1,
            split="iid",
            seed=seed,
            results=RESULTS / f"{name}.jsonl",
            workdir=Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-dsvgd-{name}",
            overrides={**MODEL, **PRESETS[strategy], **extra, "results-exists": "replace"},  # a rerun replaces its rows
        )
    )
    return {
        "strategy": strategy,
        "seed": seed,
        "tag": tag,
        "overrides": {**MODEL, **PRESETS[strategy], **extra},
        "rows": rows,
        "wall_seconds": time.monotonic() - started,
    }


def predictive(row: dict, strategy: str) -> tuple[float, float, float]:
    suffix = "_ensemble" if strategy.endswith("dsvgd") else ""
    return row[f"accuracy{suffix}"], row[f"nll{suffix}"], row[f"ece{suffix}"]


def table(runs: list[dict]) -> str:
    lines = [f"{'round':>5}  " + "  ".join(f"{label(r) + ' acc/nll/ece':<26}" for r in runs)]
    for index in range(max(len(r["rows"]) for r in runs)):
        cells = []
        for result in runs:
            if index < len(result["rows"]):
                accuracy, nll, ece = predictive(result["rows"][index], result["strategy"])
                cells.append(f"{accuracy:.4f} / {nll:.4f} / {ece:.4f}    ")
            else:
                cells.append(" " * 26)
        lines.append(f"{index + 1:>5}  " + "  ".join(cells))
    lines.append("wall   " + "  ".join(f"{r['wall_seconds'] / 60:<26.1f}" for r in runs) + " (min)")
    return "\n".join(lines)


def label(result: dict) -> str:
    return result["strategy"] + (f" [{result['tag']}]" if result.get("tag") else "")


def load(strategy: str, seed: int, tag: str, summary: list[dict]) -> dict | None:
    path = RESULTS / f"{run_name(strategy, seed, tag)}.jsonl"
    known = [r for r in summary if r["strategy"] == strategy and r["seed"] == seed and r.get("tag", "") == tag]
    if not path.exists() or not known:
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {**known[0], "rows": rows}


def record_summary(result: dict) -> None:
    """Add one run (without its rows) to its seed's summary, replacing an earlier run of the same strategy and tag."""
    path = RESULTS / f"summary-seed{result['seed']}.json"
    summary = json.loads(path.read_text()) if path.exists() else []
    key = (result["strategy"], result["seed"], result.get("tag", ""))
    summary = [r for r in summary if (r["strategy"], r["seed"], r.get("tag", "")) != key]
    summary.append({k: v for k, v in result.items() if k != "rows"})
    path.write_text(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="dsvgd,fedavg")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="", help="names a run with other settings (kept beside the presets' runs)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset value")
    parser.add_argument("--report", action="store_true", help="only tabulate the runs already on disk")
    args = parser.parse_args()
    summary_path = RESULTS / f"summary-seed{args.seed}.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else []
    if args.report:
        tags = args.tag.split(",")
        runs = [r for r in (load(s, args.seed, t, summary) for s in args.strategies.split(",") for t in tags) if r]
        print(table(runs))
        return
    stop_processes_on_signals()
    RESULTS.mkdir(parents=True, exist_ok=True)
    extra = dict(parse_override(item) for item in args.set)
    if extra and not args.tag:
        parser.error("--set changes the presets: name the run with --tag")
    runs = []
    for strategy in args.strategies.split(","):
        runs.append(run(strategy, args.rounds, args.seed, extra, args.tag))
        record_summary(runs[-1])
        print(table(runs[-1:]), flush=True)
    print(table(runs))


if __name__ == "__main__":
    main()
