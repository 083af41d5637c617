"""Where a CNN round's time goes on the CPU: the clients' training against the server's evaluation, through the real
local federation (issue 33, item 2).

For each model (cnn-zenke, cnn-acar, resnet20) and strategy (BayesADMM, FedAvg): `fedbayes local`, 2 clients,
FMNIST-10% iid (3,000 images each), --rounds rounds, 1 local epoch, batch 32, every other key at its default. Two
evaluation settings:

- `defaults`: the evaluation keys as shipped (for a CNN: every 5th round and the last, 4 samples, a 1,000-image
  subset before the last round, the ServerApp's cores);
- `before`: what the server did before those keys existed: every round, the whole test set, 32 samples, one thread
  (`eval-every=1 eval-fraction=1 ensemble-samples=32 eval-threads=1`; the rows are the same bit for bit,
  tests/component/test_evaluation.py).

Per round it reads from the results rows: the wall time between rows (the round as the user waits for it), the
slowest client's training (`client_phase_max.update`), the server's evaluation of that round (`phase_seconds.evaluate`,
which runs beside the next round's training). The target: at the defaults, wall per round <= 1.1x the slowest
client's training. Resumable: each run's rows go to benchmarks/results/cnn_rounds/<evaluation>-<model>-<strategy>.jsonl
and a run with its rows is not run again.

    python benchmarks/cnn_rounds.py                                    # defaults, 3 rounds each
    python benchmarks/cnn_rounds.py --evaluation before --rounds 1     # the old evaluation, one round each
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.deploy.launcher import LocalRun, run_local
from fedbayes.deploy.processes import stop_processes_on_signals

RESULTS = Path(__file__).resolve().parent / "results" / "cnn_rounds"
MODELS = ("cnn-zenke", "cnn-acar", "resnet20")
STRATEGIES = ("bayesadmm", "fedavg")
EVALUATION = {
    "defaults": {},
    "before": {"eval-every": 1, "eval-fraction": 1.0, "ensemble-samples": 32, "eval-threads": 1},
}


def rows_path(evaluation: str, model: str, strategy: str) -> Path:
    return RESULTS / f"{evaluation}-{model}-{strategy}.jsonl"


def run(evaluation: str, model: str, strategy: str, rounds: int) -> list[dict]:
    """The run's rows, from an earlier run when it has `rounds` of them."""
    path = rows_path(evaluation, model, strategy)
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if len(rows) >= rounds:
            return rows[:rounds]
    load = os.getloadavg()[0]
    print(f"{evaluation} {model} {strategy}: {rounds} rounds (load {load:.2f})", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="cnn-rounds-")) / "run"
    try:
        rows = run_local(
            LocalRun(
                strategy=strategy,
                clients=2,
                rounds=rounds,
                fraction=0.1,
                split="iid",
                workdir=workdir,
                quiet=True,
                overrides={"model": model, "local-epochs": 1, "batch-size": 32, **EVALUATION[evaluation]},
            )
        )
    finally:
        shutil.rmtree(workdir.parent, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = [{**row, "load_average_before": load} for row in rows]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def round_walls(rows: list[dict]) -> list[float]:
    """Seconds between one row and the next (the first: from the ServerApp's start)."""
    walls = [row["wall_seconds"] for row in rows]
    return [walls[0], *(later - earlier for earlier, later in zip(walls, walls[1:]))]


def summary(evaluation: str, model: str, strategy: str, rows: list[dict]) -> dict:
    walls = round_walls(rows)
    training = [row["client_phase_max"]["update"] for row in rows]
    evaluate = [row["phase_seconds"]["evaluate"] for row in rows]
    later = slice(1, None) if len(rows) > 1 else slice(None)  # round 1 also waits for the clients to start
    return {
        "evaluation": evaluation,
        "model": model,
        "strategy": strategy,
        "rounds": len(rows),
        "wall": walls,
        "training": training,
        "evaluate": evaluate,
        "wall_over_training": statistics.median(w / t for w, t in zip(walls[later], training[later])),
        "eval_samples": rows[-1].get("eval_samples"),
        "accuracy": rows[-1]["accuracy"],
        "load_average_before": rows[0].get("load_average_before"),
    }


def table(summaries: list[dict]) -> str:
    def seconds(values: list[float]) -> str:
        return " / ".join(f"{value:.1f}" for value in values)

    lines = [
        "2 clients, FMNIST-10% iid, 1 local epoch, batch 32; seconds per round (round 1 / 2 / ...)",
        f"{'evaluation':<10} {'model':<10} {'strategy':<10} {'wall between rows':<22} {'slowest training':<22} "
        f"{'evaluation':<24} {'wall/train':>10} {'load':>5}",
    ]
    for s in summaries:
        lines.append(
            f"{s['evaluation']:<10} {s['model']:<10} {s['strategy']:<10} {seconds(s['wall']):<22} "
            f"{seconds(s['training']):<22} {seconds(s['evaluate']):<24} {s['wall_over_training']:>10.2f} "
            f"{s['load_average_before'] or 0:>5.2f}"
        )
    lines.append("wall/train: median over rounds 2.. of the wall between rows over the slowest client's training")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--evaluation", choices=sorted(EVALUATION), default="defaults")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    args = parser.parse_args()
    stop_processes_on_signals()
    summaries = [
        summary(args.evaluation, model, strategy, run(args.evaluation, model, strategy, args.rounds))
        for model in args.models.split(",")
        for strategy in args.strategies.split(",")
    ]
    print(table(summaries))
    (RESULTS / f"summary-{args.evaluation}.json").write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
