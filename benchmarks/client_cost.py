"""Cost of one client round: BayesADMM's client half (IVON with prior and duals, then the dual step),
FedDyn's, FedLap's and FedLap-Cov's (Adam on the cavity loss, plus the diagonal-GGN pass for Cov) against
FedAvg's (Adam), on the same data, model and number of epochs.

Calls each strategy's real `client_update` in this process (decode the instruction, train, encode the
reply, write durable state), so it times exactly what a ClientApp does between receiving and replying,
minus Flower's process start. One compute thread.

    python benchmarks/client_cost.py --epochs 5 --repeats 3
    python benchmarks/client_cost.py --epochs 5 --strategies fedavg,fedlap-cov   # results/client_cost-fedlap-cov.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np
import torch

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.bayes.params import flatten, get_parameters, unflatten
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, new_header
from fedbayes.strategies import default_run_config, get_algorithm, run_settings
from fedbayes.strategies.bayesadmm.settings import BayesADMMSettings

RESULTS = Path(__file__).resolve().parent / "results" / "client_cost.json"


def runtime_for(strategy: str, epochs: int, state_dir: str) -> ClientRuntime:
    defaults = default_run_config()
    settings = run_settings(
        {**defaults, "federation": "cost", "strategy": strategy, "fraction": 0.1, "local-epochs": epochs}
    )
    node = NodeSettings.from_node_config(
        {"partition-id": 0, "num-partitions": 10, "state-dir": state_dir}, default_device="cpu"
    )
    return ClientRuntime.create(settings, node)


def fedavg_instruction(runtime: ClientRuntime, server_round: int):
    settings = runtime.settings
    message = pb.FedAvgInstruction(
        training=pb.LocalTraining(
            epochs=settings.local_epochs,
            batch_size=settings.batch_size,
            learning_rate=settings.lr,
            optimizer="adam",
            seed=0,
        ),
    )
    return encode(
        pb.Instruction(header=new_header(settings.federation, server_round)),
        message,
        {"weights": get_parameters(runtime.model)},
    )


def bayesadmm_instruction(runtime: ClientRuntime, server_round: int):
    settings = runtime.settings
    hp = settings.hyperparameters(BayesADMMSettings)
    mean = torch.from_numpy(flatten(get_parameters(runtime.model), runtime.layout))
    global_ = Gaussian(mean, torch.full_like(mean, hp.prior_precision))
    message = pb.BayesADMMInstruction(
        training=pb.LocalTraining(
            epochs=settings.local_epochs, batch_size=settings.batch_size, learning_rate=5e-5, optimizer="ivon", seed=0
        ),
        family="diagonal",
        rho=hp.rho,
        dual_step=hp.rho * hp.dual_damping,
        temperature=hp.temperature,
        hess_init=hp.hess_init,
        beta1=hp.beta1,
        beta2=hp.beta2,
        mc_samples=1,
        rescale_lr=False,
        reset_posterior=True,
    )
    return encode(
        pb.Instruction(header=new_header(settings.federation, server_round)),
        message,
        {
            "global_mean": unflatten(global_.mean.numpy(), runtime.layout),
            "global_precision": unflatten(global_.precision.numpy(), runtime.layout),
        },
    )


def feddyn_instruction(runtime: ClientRuntime, server_round: int):
    settings = runtime.settings
    message = pb.FedDynInstruction(
        training=pb.LocalTraining(
            epochs=settings.local_epochs,
            batch_size=settings.batch_size,
            learning_rate=settings.lr,
            optimizer="adam",
            weight_decay=1e-4,
            seed=0,
        ),
        alpha=0.01,
        known_clients=10,
        known_examples=10 * len(runtime.data.labels),
    )
    return encode(
        pb.Instruction(header=new_header(settings.federation, server_round)),
        message,
        {"global_weights": get_parameters(runtime.model)},
    )


def fedlap_instruction(runtime: ClientRuntime, server_round: int):
    settings = runtime.settings
    covariance = settings.strategy == "fedlap-cov"
    message = pb.FedLapInstruction(
        training=pb.LocalTraining(
            epochs=settings.local_epochs,
            batch_size=settings.batch_size,
            learning_rate=settings.lr,
            optimizer="adam",
            seed=0,
        ),
        prior_precision=1.0,
        known_clients=10,
        known_examples=10 * len(runtime.data.labels),
        covariance=covariance,
    )
    weights = get_parameters(runtime.model)
    precision = {name: np.ones_like(value) for name, value in weights.items()} if covariance else {}
    return encode(
        pb.Instruction(header=new_header(settings.federation, server_round)),
        message,
        {"global_mean": weights, "global_precision": precision},
    )


INSTRUCTIONS = {
    "fedavg": fedavg_instruction,
    "bayesadmm": bayesadmm_instruction,
    "feddyn": feddyn_instruction,
    "fedlap": fedlap_instruction,
    "fedlap-cov": fedlap_instruction,
}
LABELS = {
    "fedavg": "FedAvg (Adam)",
    "bayesadmm": "BayesADMM (IVON + duals)",
    "feddyn": "FedDyn (Adam, λ_k)",
    "fedlap": "FedLap (Adam, cavity)",
    "fedlap-cov": "FedLap-Cov (+ diag GGN)",
}


def time_rounds(strategy: str, build, epochs: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as state_dir:
        runtime = runtime_for(strategy, epochs, state_dir)
        update = get_algorithm(strategy).client_half()
        seconds = []
        for server_round in range(1, repeats + 2):
            content = build(runtime, server_round)
            started = time.perf_counter()
            update(content, runtime)
            if server_round > 1:  # round 1 warms up allocators and caches
                seconds.append(time.perf_counter() - started)
        return seconds, len(runtime.data.labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategies", default="fedavg,bayesadmm", help="comma-separated; fedavg is always timed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    strategies = ["fedavg"] + [s for s in args.strategies.split(",") if s != "fedavg"]
    seconds = {}
    for strategy in strategies:
        seconds[strategy], examples = time_rounds(strategy, INSTRUCTIONS[strategy], args.epochs, args.repeats)
    ratios = {s: statistics.median(seconds[s]) / statistics.median(seconds["fedavg"]) for s in strategies[1:]}
    if strategies == ["fedavg", "bayesadmm"]:  # the original comparison keeps its file and keys
        path, result = (
            RESULTS,
            {
                "examples": examples,
                "epochs": args.epochs,
                "model": "mlp 784-200-100-10",
                "fedavg_adam_seconds": seconds["fedavg"],
                "bayesadmm_ivon_seconds": seconds["bayesadmm"],
                "ratio_median": ratios["bayesadmm"],
            },
        )
    else:
        path = RESULTS.with_name(f"client_cost-{'-'.join(strategies[1:])}.json")
        result = {
            "examples": examples,
            "epochs": args.epochs,
            "model": "mlp 784-200-100-10",
            "seconds": seconds,
            "ratio_to_fedavg_median": ratios,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"one client round, {examples} examples x {args.epochs} epochs, MLP 784-200-100-10, 1 thread")
    print(f"{'client half':<28} {'median s':>9} {'/ FedAvg':>9}  runs")
    for strategy in strategies:
        ratio = f"{ratios[strategy]:.2f}" if strategy in ratios else "1.00"
        print(
            f"{LABELS[strategy]:<28} {statistics.median(seconds[strategy]):>9.3f} {ratio:>9}  "
            f"{', '.join(f'{s:.3f}' for s in seconds[strategy])}"
        )


if __name__ == "__main__":
    main()
