"""Why shared training noise speeds BayesADMM's early rounds: the Table 1 homogeneous preset (FMNIST-10%, 10 clients,
MLP 784-200-100-10) with run config noise=shared and noise=independent, side by side, per round: the test accuracy
of m̄ and the median of the global precision S̄ (how fast q̄ concentrates; Eq. 37 sums the clients' duals U_k).

The real client and server halves exchange real encoded payloads in this one process (no network, no Flower
run: the question is the algorithm's random numbers, not the transport), with the preset's hyperparameters.

    python benchmarks/bayesadmm_noise.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from flwr.app import Array, ArrayRecord
from reproduce_table1 import COMMON, PRESETS

from fedbayes.bayes.metrics import predict_probs
from fedbayes.bayes.params import get_parameters, set_parameters
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.server.round_core import RoundCore
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.strategies.bayesadmm.client import client_update
from fedbayes.strategies.bayesadmm.server import BayesADMM
from fedbayes.tasks.datasets import load_dataset
from tests.support import FakeGrid, reply_message

RESULTS = Path(__file__).resolve().parent / "results" / "table1"
CLIENTS = 10


def run(noise: str, rounds: int, seed: int, state_dir: Path) -> list[dict]:
    config = {
        **default_run_config(),
        **COMMON,
        **PRESETS[("bayesadmm", "iid")],
        "strategy": "bayesadmm",
        "fraction": 0.1,
        "split": "iid",
        "seed": seed,
        "noise": noise,
        "federation": f"noise-{noise}",
        "num-server-rounds": rounds,
    }
    settings = run_settings(config)
    runtimes = {}
    for node in range(1, CLIENTS + 1):
        torch.manual_seed(seed)
        runtimes[node] = ClientRuntime.create(
            settings, NodeSettings(f"client-{node - 1}", node - 1, CLIENTS, "", str(state_dir / noise), "cpu")
        )
    model = runtimes[1].model
    server = RoundCore(settings, BayesADMM(settings, runtimes[1].layout))
    arrays = ArrayRecord({n: Array(v) for n, v in get_parameters(model).items()})
    test = load_dataset("fmnist", train=False).scaled(settings.input_scale)
    rows = []
    for server_round in range(1, rounds + 1):
        started = time.monotonic()
        plan = server.configure(server_round, arrays, FakeGrid(runtimes))
        messages = plan.messages
        replies = [
            reply_message(client_update(m.content, runtimes[m.metadata.dst_node_id]), m.metadata.dst_node_id)
            for m in messages
        ]
        outcome = server.aggregate(plan, replies)
        arrays, metrics = outcome.arrays, outcome.metrics
        set_parameters(model, {n: arrays[n].numpy() for n in arrays})
        probs = predict_probs(model, test.images, 2000, torch.device("cpu"))
        accuracy = (probs.argmax(1) == test.labels).double().mean().item()
        rows.append(
            {
                "round": server_round,
                "accuracy": accuracy,
                "global_precision_median": metrics["global-precision-median"],
                "seconds": time.monotonic() - started,
            }
        )
        print(
            f"{noise:<12} round {server_round:>2}: accuracy {100 * accuracy:5.2f}  "
            f"median S̄ {rows[-1]['global_precision_median']:10.1f}  ({rows[-1]['seconds']:.0f} s)",
            flush=True,
        )
    return rows


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # what a Flower run would set
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with TemporaryDirectory() as state_dir:
        results = {noise: run(noise, args.rounds, args.seed, Path(state_dir)) for noise in ("shared", "independent")}
    print(f"{'round':>5}  {'acc shared':>10}  {'acc indep.':>10}  {'S̄ shared':>10}  {'S̄ indep.':>10}")
    for shared, independent in zip(results["shared"], results["independent"]):
        print(
            f"{shared['round']:>5}  {100 * shared['accuracy']:>10.2f}  {100 * independent['accuracy']:>10.2f}  "
            f"{shared['global_precision_median']:>10.1f}  {independent['global_precision_median']:>10.1f}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"noise-seed{args.seed}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
