"""Which of the BayesADMM authors' training details moves FedAvg's and FedProx's Table 1 rows (issue 30, item 2).

Under the `bayesadmm-paper` preset our FedAvg (heterogeneous FMNIST-10%, 10 clients) ends 3.5 points above the
paper's row, while the authors' own code with the same values lands on it (benchmarks/authors_baselines.py). What
their code does that no run-config key expresses (deploy/presets.py, REF_DIFFERENCES), each switched on alone here:

  adam-kept     each client's Adam state (moments, step count) carries over from round to round: their worker builds
                its optimizer once; ours builds a fresh one every round
  same-order    every round draws the minibatch order of round 1: their worker reseeds with its seed at every call
  their-split   their data generator's split (authors_baselines.py --write-split; --split-file F), not ours

The runs are in one process (the ServerApp's and ClientApp's code on benchmarks/network_vs_inprocess.py's in-process
grid); `ours` is the preset unchanged, the baseline each variant is read against (its rows are within 0.8 points of
Table 1's network rows of 2026-11-26 at rounds 10 / 25 / 50, not identical to them). The two training variants replace
FedAvg's client `train_locally` for the run with one that keeps the optimizer's state per client id in memory, or
seeds every round as round 1: an experiment, not an option of the client.

    python benchmarks/baseline_protocol.py --variants ours,adam-kept,same-order --seeds 0,1,2
    python benchmarks/baseline_protocol.py --variants their-split --seeds 62 --split-file heterog-62.json
    python benchmarks/baseline_protocol.py --strategy fedprox --variants adam-kept --seeds 0,1,2
    python benchmarks/baseline_protocol.py --report

Resumable: each run writes benchmarks/results/bayesadmm-paper/protocol/<strategy>-<variant>-seed<S>.jsonl when it
has finished; a run whose file holds all its rounds is not run again.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchmarks.environment  # noqa: F401  (one thread, no telemetry: before torch and flwr)

# isort: split
from benchmarks.authors_baselines import AUTHORS, RESULTS, seed_cells
from benchmarks.network_vs_inprocess import run_inprocess
from benchmarks.reproduce_table1 import PAPER_ACCURACY
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.deploy.launcher import LocalRun
from fedbayes.deploy.presets import BAYESADMM_PAPER
from fedbayes.strategies.fedavg import client as fedavg_client

PROTOCOL = RESULTS / "protocol"
VARIANTS = ("ours", "adam-kept", "same-order", "their-split")
STRATEGIES = ("fedavg", "fedprox")
SPLIT = "dirichlet"


@contextlib.contextmanager
def patched_training(keep_adam: bool, same_order: bool) -> Iterator[None]:
    """FedAvg's client training with the optimizer's state kept per client, or round 1's minibatch order."""
    if not (keep_adam or same_order):
        yield
        return
    saved: dict[str, dict] = {}

    def train_locally(runtime, training, server_round, proximal_mu=0.0):
        extra_loss = None
        if proximal_mu > 0.0:  # FedProx: the anchor is the global model this round starts from
            anchor = [p.detach().clone().to(runtime.device) for p in runtime.model.parameters()]
            extra_loss = fedavg_client._proximal_term(proximal_mu, anchor)
        model = runtime.model.to(runtime.device)
        optimizer = make_optimizer(model, training)
        if keep_adam and runtime.node.client_id in saved:
            optimizer.load_state_dict(saved[runtime.node.client_id])
        losses = train_epochs(
            model,
            runtime.data,
            optimizer,
            training.epochs,
            training.batch_size,
            runtime.device,
            seed=runtime.local_seed(training.seed, 1 if same_order else server_round),
            extra_loss=extra_loss,
        )
        if keep_adam:
            saved[runtime.node.client_id] = copy.deepcopy(optimizer.state_dict())
        model.cpu()
        return losses

    original = fedavg_client.train_locally
    fedavg_client.train_locally = train_locally
    try:
        yield
    finally:
        fedavg_client.train_locally = original


def run_variant(strategy: str, variant: str, seed: int, rounds: int, split_file: Path | None) -> Path:
    results = PROTOCOL / f"{strategy}-{variant}-seed{seed}.jsonl"
    if results.exists() and len(results.read_text().splitlines()) >= rounds:
        print(f"{results.name}: done, not run again", flush=True)
        return results
    overrides = BAYESADMM_PAPER.run_config(strategy, SPLIT, BAYESADMM_PAPER.clients)
    fraction = BAYESADMM_PAPER.fraction
    if variant == "their-split":
        if split_file is None:
            raise SystemExit("their-split needs --split-file (authors_baselines.py --write-split)")
        overrides, fraction = {**overrides, "split-file": str(split_file.resolve())}, 1.0
    workdir = Path(tempfile.mkdtemp(prefix=f"protocol-{variant}-")) / "run"
    workdir.mkdir()
    spec = LocalRun(
        strategy=strategy,
        clients=BAYESADMM_PAPER.clients,
        rounds=rounds,
        fraction=fraction,
        split=SPLIT,
        seed=seed,
        workdir=workdir,
        quiet=True,
        overrides=overrides,
    )
    try:
        with patched_training(keep_adam=variant == "adam-kept", same_order=variant == "same-order"):
            rows = run_inprocess(spec.run_config(workdir, workdir / "results.jsonl"), spec.clients, workdir, True)
    finally:
        shutil.rmtree(workdir.parent, ignore_errors=True)
    PROTOCOL.mkdir(parents=True, exist_ok=True)
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{results.name}: round {rounds} accuracy {rows[-1]['accuracy']:.4f}", flush=True)
    return results


def report() -> str:
    lines = ["| heterogeneous | code | seeds | accuracy % at 10 / 25 / 50 | NLL at 10 / 25 / 50 |"]
    lines.append("|---|---|---|---|---|")
    for strategy in STRATEGIES:
        groups = [(f"in one process: {v}", sorted(PROTOCOL.glob(f"{strategy}-{v}-seed*.jsonl"))) for v in VARIANTS]
        groups += [
            ("network path (Table 1's rows)", sorted(RESULTS.glob(f"{SPLIT}-{strategy}-seed*.jsonl"))),
            ("the authors' code", sorted(AUTHORS.glob(f"{SPLIT}-{strategy}-seed*.jsonl"))),
        ]
        for name, files in groups:
            if files:
                seeds = ", ".join(f.stem.rsplit("seed", 1)[1] for f in files)
                accuracy, nll = seed_cells(files, "accuracy", 100.0), seed_cells(files, "nll", 1.0)
                lines.append(f"| {strategy} | {name} | {seeds} | {accuracy} | {nll} |")
        paper = " / ".join(str(v) for v in PAPER_ACCURACY[(SPLIT, strategy)])
        lines.append(f"| {strategy} | paper | 3 | {paper} | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="fedavg", choices=STRATEGIES)
    parser.add_argument("--variants", default="ours,adam-kept,same-order")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=BAYESADMM_PAPER.rounds)
    parser.add_argument("--split-file", type=Path, help="their split, for the their-split variant")
    parser.add_argument("--report", action="store_true", help="only print the table from the files on disk")
    args = parser.parse_args()
    if not args.report:
        variants = args.variants.split(",")
        unknown = [variant for variant in variants if variant not in VARIANTS]
        if unknown:
            parser.error(f"unknown variant {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
        for variant in variants:
            for seed in (int(s) for s in args.seeds.split(",")):
                run_variant(args.strategy, variant, seed, args.rounds, args.split_file)
    print(report())


if __name__ == "__main__":
    main()
