"""Robust aggregation against one bad client, FMNIST-10 % heterogeneous (Dirichlet), 10 clients, the MLP, each
strategy with its Table 1 settings (benchmarks/reproduce_table1.py PRESETS: FedAvg and FedDyn 2 Adam epochs,
BayesADMM 10 IVON epochs on raw pixels, cosine).

The bad client is the one with the most examples (the most weight in FedAvg's mean). Attacks:
  scaled        it sends its honest update x SCALE (under the screen's 100x: the robust rules' job)
  sign-flip     it sends its honest update x SIGN_FLIP
  shuffled      it trains honestly on randomly permuted labels (valid replies, bad data)
  none          no attack: the price of each rule with ten honest clients
against the reference, the nine honest clients alone with robust-aggregation=none. BayesADMM's bad client keeps
its duals consistent with its altered local posterior (the server replays them), FedDyn's its λ sketch.

Runs in one process through the real server and client halves (no network: the numbers per round are the same as
the network path's, tests/test_simulation.py), one thread. Resumable: a run whose JSONL has all its rows is
skipped. Results: benchmarks/results/robust_aggregation/<strategy>-<rule>-<attack>.jsonl and summary.json.

    python benchmarks/robust_aggregation.py [--rounds 15] [--strategies fedavg,feddyn,bayesadmm]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.supercore.task_identity import TaskIdentity

from benchmarks.reproduce_table1 import COMMON, PRESETS
from fedbayes.bayes.metrics import classification_metrics, predict_probs
from fedbayes.bayes.params import get_parameters, set_parameters
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.server.round_core import RoundCore
from fedbayes.strategies import default_run_config, get_algorithm, run_settings
from fedbayes.tasks.config import RunSettings
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import build_run_model
from tests.support import FakeGrid, reply_message, rogue

RESULTS = Path(__file__).resolve().parent / "results" / "robust_aggregation"
CLIENTS = 10
SCALE = 10.0
SIGN_FLIP = -3.0
ATTACKS = ("none", "scaled", "sign-flip", "shuffled")
RULES = {
    "fedavg": ("none", "clip", "median", "trimmed-mean"),
    "feddyn": ("none", "clip", "median", "trimmed-mean"),
    "bayesadmm": ("none", "clip"),
}


def settings_for(strategy: str, rule: str, rounds: int, seed: int) -> RunSettings:
    return run_settings(
        {
            **default_run_config(strategy),
            **COMMON,
            **PRESETS[(strategy, "dirichlet")],
            "strategy": strategy,
            "federation": "bench",
            "fraction": 0.1,
            "split": "dirichlet",
            "seed": seed,
            "num-server-rounds": rounds,
            "robust-aggregation": rule,
            "ensemble-samples": 0,
        }
    )


def client_runtimes(settings: RunSettings, state_dir: str) -> dict[int, ClientRuntime]:
    """Node i + 1 holds partition i."""
    return {
        partition + 1: ClientRuntime.create(
            settings,
            NodeSettings.from_node_config(
                {"partition-id": partition, "num-partitions": CLIENTS, "state-dir": state_dir}, default_device="cpu"
            ),
        )
        for partition in range(CLIENTS)
    }


def with_shuffled_labels(runtime: ClientRuntime, seed: int) -> ClientRuntime:
    generator = torch.Generator().manual_seed(seed)
    labels = runtime.data.labels[torch.randperm(len(runtime.data.labels), generator=generator)]
    return dataclasses.replace(runtime, data=dataclasses.replace(runtime.data, labels=labels))


def run(strategy: str, rule: str, attack: str, rounds: int, seed: int, reference_run: bool) -> list[dict]:
    settings = settings_for(strategy, rule, rounds, seed)
    algorithm = get_algorithm(strategy)
    test = load_dataset(settings.dataset, train=False).scaled(settings.input_scale)
    torch.manual_seed(settings.seed)
    model = build_run_model(settings.architecture, test.input_shape, test.num_classes)
    arrays = ArrayRecord({name: Array(value) for name, value in get_parameters(model).items()})
    rows = []
    with TemporaryDirectory() as state_dir:
        runtimes = client_runtimes(settings, state_dir)
        bad = max(runtimes, key=lambda node: len(runtimes[node].data.labels))
        if reference_run:
            del runtimes[bad]
        elif attack == "shuffled":
            runtimes[bad] = with_shuffled_labels(runtimes[bad], seed)
        layout = runtimes[next(iter(runtimes))].layout
        server = algorithm.build_server(settings, layout)
        core = RoundCore(settings, server)
        for server_round in range(1, rounds + 1):
            started = time.perf_counter()
            plan = core.configure(server_round, arrays, FakeGrid(runtimes))
            messages = plan.messages
            replies = []
            for message in messages:
                node = message.metadata.dst_node_id
                content = algorithm.client_half()(message.content, runtimes[node])
                if node == bad and attack in ("scaled", "sign-flip") and not reference_run:
                    factor = SCALE if attack == "scaled" else SIGN_FLIP
                    reference = rogue.sent_reference(server, layout, runtimes[bad].node.client_id)
                    change = rogue.scaled_update(reference, rogue.UPDATE_GROUP[strategy], factor)
                    content = rogue.consistent_reply(server, content, change, server_round)
                replies.append(reply_message(content, node))
            outcome = core.aggregate(plan, replies)
            arrays = outcome.arrays if outcome.arrays is not None else arrays
            set_parameters(model, {name: arrays[name].numpy() for name in arrays})
            metrics = classification_metrics(predict_probs(model, test.images, 2000, torch.device("cpu")), test.labels)
            report = outcome.report
            rows.append(
                {
                    "round": server_round,
                    **metrics,
                    "accepted": len(report.accepted),
                    "rejected": sorted(report.rejected),
                    "quarantined": sorted(report.quarantined),
                    "bad_client": runtimes.get(bad, None) and runtimes[bad].node.client_id,
                    "seconds": time.perf_counter() - started,
                }
            )
            logging.getLogger("bench").info(
                "%s %s %s round %d: acc %.4f", strategy, rule, attack, server_round, metrics["accuracy"]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", default="fedavg,feddyn,bayesadmm")
    args = parser.parse_args()
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = []
    for strategy in args.strategies.split(","):
        plan = [("none", "reference", True)] + [(rule, attack, False) for rule in RULES[strategy] for attack in ATTACKS]
        for rule, attack, reference_run in plan:
            path = RESULTS / f"{strategy}-{rule}-{attack}-seed{args.seed}.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            if len(rows) < args.rounds:
                rows = run(strategy, rule, attack, args.rounds, args.seed, reference_run)
                path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            last = rows[-1]
            summary.append(
                {
                    "strategy": strategy,
                    "rule": rule,
                    "attack": attack,
                    "accuracy": last["accuracy"],
                    "nll": last["nll"],
                    "ece": last["ece"],
                    "rejected_rounds": sum(bool(r["rejected"]) for r in rows),
                    "seconds_per_round": float(np.mean([r["seconds"] for r in rows])),
                }
            )
    (RESULTS / f"summary-seed{args.seed}.json").write_text(json.dumps(summary, indent=1))
    print_table(summary)


def print_table(summary: list[dict]) -> None:
    reference = {row["strategy"]: row for row in summary if row["attack"] == "reference"}
    print("| strategy | robust-aggregation | attack | accuracy | Δ vs 9 honest | NLL | ECE | rounds with a refusal |")
    print("|---|---|---|---|---|---|---|---|")
    for row in summary:
        delta = row["accuracy"] - reference[row["strategy"]]["accuracy"]
        print(
            f"| {row['strategy']} | {row['rule']} | {row['attack']} | {row['accuracy']:.4f} | {delta:+.4f} | "
            f"{row['nll']:.3f} | {row['ece']:.3f} | {row['rejected_rounds']} |"
        )


if __name__ == "__main__":
    main()
