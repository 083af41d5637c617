"""FedPA's client cost against FedAvg's, as in the paper's Table 1 (App. C): the time of one client round
that ends in a delta, on one compute thread.

Synthetic rows (d = 1e2..1e5): linear regression, 500 examples, batch 5, so 5 epochs x 100 SGD steps (the paper's
setting). Times are CPU time of one thread. FedAvg: 5 epochs, Δ = x_0 - θ_final. FedPA (DP): IASG for the same 5 epochs,
one sample per epoch (no local burn-in, ℓ = 5), streamed into the App. C dynamic programme. FedPA (dense): the same
samples, then Σ̂ = ρ_ℓ I + (1-ρ_ℓ) Ŝ built and solved as a d x d matrix, where that fits. MLP row: the real client
halves (`client_update`: decode, train, encode) of FedAvg (5 epochs) and of a FedPA sampling round (1 discarded + 4
sampled epochs) on an FMNIST-10% client, 784-200-100-10.

    python benchmarks/fedpa_client_cost.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch
from torch.nn.utils import parameters_to_vector

from fedbayes.bayes.params import get_parameters
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.client.training import train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, new_header
from fedbayes.strategies import default_run_config, get_algorithm, run_settings
from fedbayes.strategies.fedpa.client import IASG
from fedbayes.strategies.fedpa.math import ShrinkageDelta
from fedbayes.tasks.datasets import Dataset

RESULTS = Path(__file__).resolve().parent / "results" / "fedpa_client_cost.json"
EXAMPLES, BATCH, EPOCHS, SHRINKAGE, LR = 500, 5, 5, 0.01, 1e-3
PAPER_MS = {100: (72, 91, 82), 1_000: (76, 92, 104), 10_000: (80, 93, 797), 100_000: (149, 155, None)}


def half_squared_error(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return 0.5 * (output.squeeze(-1) - targets).square().mean()


def regression(size: int, seed: int = 0) -> tuple[Dataset, torch.nn.Module]:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(EXAMPLES, size, generator=generator) / size**0.5
    targets = features @ torch.randn(size, generator=generator) + 0.1 * torch.randn(EXAMPLES, generator=generator)
    return Dataset("regression", features, targets, 0, 1.0), torch.nn.Linear(size, 1, bias=False)


def fedavg_round(data: Dataset, model: torch.nn.Module) -> torch.Tensor:
    x0 = parameters_to_vector(model.parameters()).detach().clone()
    train_epochs(
        model,
        data,
        torch.optim.SGD(model.parameters(), lr=LR),
        EPOCHS,
        BATCH,
        torch.device("cpu"),
        seed=0,
        loss_fn=half_squared_error,
    )
    return x0 - parameters_to_vector(model.parameters()).detach()


def fedpa_round(data: Dataset, model: torch.nn.Module, dense: bool) -> torch.Tensor:
    x0 = parameters_to_vector(model.parameters()).detach().clone()
    sampler = IASG(
        model,
        data,
        torch.optim.SGD(model.parameters(), lr=LR),
        BATCH,
        torch.device("cpu"),
        seed=0,
        burnin_epochs=0,
        samples=EPOCHS,
        loss_fn=half_squared_error,
    )
    if not dense:
        estimate = ShrinkageDelta(x0, SHRINKAGE, capacity=EPOCHS)
        sampler(estimate.add_sample)
        return estimate.delta()
    samples: list[torch.Tensor] = []
    sampler(samples.append)
    stacked = torch.stack(samples).double()
    identity_weight = 1.0 / (1.0 + (len(samples) - 1) * SHRINKAGE)
    sigma = (1.0 - identity_weight) * torch.cov(stacked.T) + identity_weight * torch.eye(
        x0.numel(), dtype=torch.float64
    )
    return torch.linalg.solve(sigma, x0.double() - stacked.mean(0)).float()


def timed(run, repeats: int) -> float:
    """Median CPU milliseconds of `run()` (this process, one thread) over `repeats` runs after one warm-up.
    CPU rather than wall time: the shared machine this ran on was many times oversubscribed."""
    run()
    times = []
    for _ in range(repeats):
        started = time.process_time()
        run()
        times.append(time.process_time() - started)
    return 1000 * statistics.median(times)


def synthetic_row(size: int, repeats: int, dense_limit: int) -> dict:
    data, model = regression(size)
    initial = {name: value.clone() for name, value in model.state_dict().items()}

    def from_start(round_fn, *args):
        def run():
            model.load_state_dict(initial)
            return round_fn(data, model, *args)

        return run

    row = {
        "d": size,
        "fedavg_ms": timed(from_start(fedavg_round), repeats),
        "fedpa_dp_ms": timed(from_start(fedpa_round, False), repeats),
        "fedpa_dense_ms": None,
    }
    if size <= dense_limit:
        row["fedpa_dense_ms"] = timed(from_start(fedpa_round, True), repeats)
        row["dp_vs_dense_relative_error"] = float(
            (from_start(fedpa_round, False)() - from_start(fedpa_round, True)()).norm()
            / from_start(fedpa_round, True)().norm()
        )
    return row


def mlp_row(repeats: int) -> dict:
    defaults = default_run_config()
    settings = run_settings({**defaults, "strategy": "fedpa", "fraction": 0.1, "split": "dirichlet"})
    node = NodeSettings.from_node_config({"partition-id": 0, "num-partitions": 10, "state-dir": "/tmp"}, "cpu")
    runtime = ClientRuntime.create(settings, node)
    weights = get_parameters(runtime.model)
    training = pb.LocalTraining(epochs=5, batch_size=32, learning_rate=1e-3, optimizer="adam", seed=0)
    envelope = pb.Instruction(header=new_header("bench", 1))
    fedavg = encode(envelope, pb.FedAvgInstruction(training=training), {"weights": weights})
    sampling = pb.LocalTraining(epochs=5, batch_size=32, learning_rate=1e-3, optimizer="adam", seed=0)
    fedpa = encode(
        envelope,
        pb.FedPAInstruction(training=sampling, sampling=True, shrinkage=0.1, local_burnin_epochs=1, samples=4),
        {"weights": weights},
    )
    return {
        "d": sum(v.size for v in weights.values()),
        "examples": len(runtime.data.labels),
        "fedavg_ms": timed(lambda: get_algorithm("fedavg").client_half()(fedavg, runtime), repeats),
        "fedpa_dp_ms": timed(lambda: get_algorithm("fedpa").client_half()(fedpa, runtime), repeats),
        "fedpa_dense_ms": None,
    }


def table(rows: list[dict]) -> str:
    lines = [f"{'d':>8} {'FedAvg Δ':>10} {'FedPA Δ (DP)':>20} {'FedPA Δ (dense)':>22}   paper ms (FedAvg / DP / dense)"]
    for row in rows:
        base = row["fedavg_ms"]

        def cell(value, base=base):
            return "—" if value is None else f"{value:.0f} ({100 * (value / base - 1):+.0f}%)"

        paper = PAPER_MS.get(row["d"])
        paper_text = " / ".join("—" if v is None else str(v) for v in paper) if paper else "(MLP, not in paper)"
        lines.append(
            f"{row['d']:>8} {base:>10.0f} {cell(row['fedpa_dp_ms']):>20} {cell(row['fedpa_dense_ms']):>22}   "
            f"{paper_text}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--dense-limit", type=int, default=2000, help="largest d solved as a dense d x d matrix")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [synthetic_row(int(size), args.repeats, args.dense_limit) for size in args.sizes.split(",")]
    rows.append(mlp_row(args.repeats))
    print(table(rows))
    RESULTS.write_text(
        json.dumps({"repeats": args.repeats, "threads": 1, "clock": "process CPU time", "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
