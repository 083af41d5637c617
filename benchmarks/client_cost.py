"""Cost of one client round: BayesADMM's client half (IVON with prior and duals, then the dual step)
against FedAvg's (Adam), on the same data, model and number of epochs.

Calls each strategy's real `client_update` in this process (decode the instruction, train, encode the
reply, write durable state), so it times exactly what a ClientApp does between receiving and replying,
minus Flower's process start. One compute thread.

    python benchmarks/client_cost.py --epochs 5 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bayes.gaussian import Gaussian  # noqa: E402
from bayes.params import flatten, get_parameters, unflatten  # noqa: E402
from client.runtime import ClientRuntime, NodeSettings  # noqa: E402
from protos import payloads_pb2 as pb  # noqa: E402
from protos.codec import encode, new_header  # noqa: E402
from strategies import get_algorithm  # noqa: E402
from tasks.config import RunSettings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "client_cost.json"


def runtime_for(strategy: str, epochs: int, state_dir: str) -> ClientRuntime:
    defaults = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    settings = RunSettings.from_run_config({**defaults, "strategy": strategy, "fraction": 0.1, "local-epochs": epochs})
    node = NodeSettings.from_node_config(
        {"partition-id": 0, "num-partitions": 10, "state-dir": state_dir}, default_device="cpu"
    )
    return ClientRuntime.create(settings, node)


def fedavg_instruction(runtime: ClientRuntime, server_round: int):
    settings = runtime.settings
    message = pb.FedAvgInstruction(
        header=new_header(settings.federation, server_round),
        training=pb.LocalTraining(epochs=settings.local_epochs, batch_size=settings.batch_size,
                                  learning_rate=settings.lr, optimizer="adam", seed=0),
    )
    return encode(message, {"weights": get_parameters(runtime.model)})


def bayesadmm_instruction(runtime: ClientRuntime, server_round: int):
    settings = runtime.settings
    mean = torch.from_numpy(flatten(get_parameters(runtime.model), runtime.layout))
    global_ = Gaussian(mean, torch.full_like(mean, settings.prior_precision))
    message = pb.BayesADMMInstruction(
        header=new_header(settings.federation, server_round),
        training=pb.LocalTraining(epochs=settings.local_epochs, batch_size=settings.batch_size,
                                  learning_rate=5e-5, optimizer="ivon", seed=0),
        rho=settings.rho, dual_step=settings.rho * settings.dual_damping, temperature=settings.temperature,
        hess_init=settings.hess_init, beta1=settings.beta1, beta2=settings.beta2, mc_samples=1,
        rescale_lr=False, reset_posterior=True,
    )
    return encode(message, {
        "global_mean": unflatten(global_.mean.numpy(), runtime.layout),
        "global_precision": unflatten(global_.precision.numpy(), runtime.layout),
    })


def time_rounds(strategy: str, build, epochs: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory() as state_dir:
        runtime = runtime_for(strategy, epochs, state_dir)
        update = get_algorithm(strategy).client_update
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
    args = parser.parse_args()
    torch.set_num_threads(1)
    fedavg, examples = time_rounds("fedavg", fedavg_instruction, args.epochs, args.repeats)
    bayesadmm, _ = time_rounds("bayesadmm", bayesadmm_instruction, args.epochs, args.repeats)
    result = {
        "examples": examples, "epochs": args.epochs, "model": "mlp 784-200-100-10",
        "fedavg_adam_seconds": fedavg, "bayesadmm_ivon_seconds": bayesadmm,
        "ratio_median": statistics.median(bayesadmm) / statistics.median(fedavg),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(f"one client round, {examples} examples x {args.epochs} epochs, MLP 784-200-100-10, 1 thread")
    print(f"{'client half':<28} {'median s':>9}  runs")
    print(f"{'FedAvg (Adam)':<28} {statistics.median(fedavg):>9.3f}  {', '.join(f'{s:.3f}' for s in fedavg)}")
    print(f"{'BayesADMM (IVON + duals)':<28} {statistics.median(bayesadmm):>9.3f}  {', '.join(f'{s:.3f}' for s in bayesadmm)}")
    print(f"ratio BayesADMM / FedAvg: {result['ratio_median']:.2f}")


if __name__ == "__main__":
    main()
