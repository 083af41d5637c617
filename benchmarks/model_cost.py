"""Cost of one client round of every strategy on the convolutional models, against FedAvg with Adam on the same
model and data: seconds, peak memory, ratio.

Each (model, strategy) pair is a one-client federation in this process: the strategy's real server half and client half
exchanging encoded payloads (decode, train, encode, write durable state). Round 1 warms up (allocators, the first
optimizer's torch._dynamo import, the stores); round 2, the steady state of a stateful strategy, is timed: the client
half only, from receiving the instruction to its reply. On the CPU the time is this process's CPU time (one compute
thread), so machines shared with other work still give comparable numbers; on a GPU it is wall time, synchronised.

Work per round, the same data for every strategy (the first --examples FMNIST training images, 1x28x28, batch 64):
--epochs epochs of minibatches for the optimisation-based strategies (BayesADMM: IVON, 1 MC sample; FedPA: a
sampling round, 0 discarded epochs and --epochs samples; FedLap-Cov: + the diagonal GGN over the client's data);
DSVGD / P-DSVGD: --particles particles, L = L' = as many steps as the epochs have minibatches, so each particle
sees the data FedAvg's model sees (N times FedAvg's gradient work, + the N² P kernel terms).

    python benchmarks/model_cost.py                            # CPU, one thread; results/model_cost-cpu.json
    python benchmarks/model_cost.py --device cuda              # on a GPU; results/model_cost-cuda.json
    python benchmarks/model_cost.py --models cnn-acar --strategies fedavg,bayesadmm

Peak memory over the timed round: CPU, the process's resident set sampled every 5 ms, as the growth over its size
when the round starts; GPU, torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("cnn-acar", "cnn-zenke", "resnet20")
STRATEGIES = ("fedavg", "fedprox", "bayesadmm", "feddyn", "fedlap", "fedlap-cov", "fedpa", "dsvgd", "p-dsvgd")
PRESETS = {  # on top of the run-config defaults; FedAvg/FedProx/FedDyn/FedLap/FedPA train with Adam at lr 1e-3
    "fedprox": {"proximal-mu": 0.01},
    "bayesadmm": {
        "lr": 5e-3,
        "hess-init": 0.1,
        "temperature": 0.1,
        "prior-precision": 0.5,
        "dual-damping": 0.1,
        "rho": 1.0,
        "beta2": 0.99998,
    },  # the authors' CIFAR-10 Acar IVON setting
    "feddyn": {"feddyn-alpha": 0.01, "weight-decay": 1e-4},
    "fedpa": {"burn-in-rounds": 1, "local-burnin-epochs": 0},
}


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakRSS:
    """The largest resident set seen while the block runs, sampled every 5 ms by a background thread."""

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def measure(model: str, strategy: str, examples: int, epochs: int, particles: int, device: str) -> dict:
    """One (model, strategy) pair: warm-up round 1, timed round 2."""
    import torch
    from flwr.app import Array, ArrayRecord
    from flwr.supercore.task_identity import TaskIdentity

    from fedbayes.bayes.params import get_parameters, parameter_layout
    from fedbayes.client.runtime import ClientRuntime, NodeSettings
    from fedbayes.server.round_core import RoundCore
    from fedbayes.strategies import default_run_config, get_algorithm, run_settings
    from fedbayes.tasks.compute import resolve_device
    from fedbayes.tasks.datasets import load_dataset
    from fedbayes.tasks.models import build_model
    from tests.support import reply_message

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # messages made outside a Flower run
    batch = 64
    steps = epochs * math.ceil(examples / batch)
    config = {
        **default_run_config(),
        "federation": "cost",
        "strategy": strategy,
        "model": model,
        "local-epochs": epochs,
        "batch-size": batch,
        "samples": epochs,
        "particles": particles,
        "local-steps": steps,
        "distill-steps": steps,
        "server-steps": 1,  # P-DSVGD's server half is not timed
        "device": device,
        **PRESETS.get(strategy, {}),
    }
    settings = run_settings(config)
    data = load_dataset("fmnist", train=True).subset(range(examples))
    torch.manual_seed(0)
    network = build_model(model, data.input_shape, data.num_classes)
    layout = parameter_layout(network)
    algorithm = get_algorithm(strategy)
    server = RoundCore(settings, algorithm.build_server(settings, layout))
    arrays = ArrayRecord({name: Array(value) for name, value in get_parameters(network).items()})
    target = resolve_device(device)
    with tempfile.TemporaryDirectory() as state_dir:
        node = NodeSettings("client-0", 0, 1, "", state_dir, device)
        runtime = ClientRuntime(settings, node, data, network, layout, target)
        for server_round in (1, 2):
            (message,) = server.configure(server_round, arrays, _Grid())
            if target.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            clock = time.perf_counter if target.type == "cuda" else time.process_time
            with PeakRSS() as memory:
                started = clock()
                reply = algorithm.client_half()(message.content, runtime)
                if target.type == "cuda":
                    torch.cuda.synchronize()
                seconds = clock() - started
            arrays, _ = server.aggregate(server_round, [reply_message(reply, 1)])
            if arrays is None:
                raise RuntimeError(f"{strategy} on {model}: the server rejected round {server_round}")
    result = {
        "model": model,
        "strategy": strategy,
        "parameters": sum(math.prod(s) for s in layout.values()),
        "seconds": seconds,
        "rss_growth_mb": memory.peak - memory.start,
        "device": str(target),
    }
    if target.type == "cuda":
        result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return result


class _Grid:
    def get_node_ids(self):
        return [1]


def table(results: list[dict], args: argparse.Namespace) -> str:
    memory = "peak CUDA MB" if args.device == "cuda" else "RSS growth MB"
    clock = "wall s" if args.device == "cuda" else "CPU s"
    lines = [
        f"one client round, {args.examples} FMNIST examples x {args.epochs} epochs, batch 64, "
        f"device {results[0]['device']}, 1 thread; DSVGD N = {args.particles}; {clock}",
        f"{'model':<10} {'params':>9} {'strategy':<11} {'seconds':>8} {'/ FedAvg':>8}  {memory}",
    ]
    fedavg = {r["model"]: r["seconds"] for r in results if r["strategy"] == "fedavg"}
    for r in results:
        ratio = f"{r['seconds'] / fedavg[r['model']]:.2f}" if r["model"] in fedavg else "-"
        peak = f"{r['peak_cuda_mb']:.0f}" if "peak_cuda_mb" in r else f"{r['rss_growth_mb']:.0f}"
        lines.append(
            f"{r['model']:<10} {r['parameters']:>9,} {r['strategy']:<11} {r['seconds']:>8.2f} {ratio:>8}  {peak}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated; fedavg is always timed")
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--particles", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    from fedbayes.tasks.compute import configure_threads

    configure_threads()
    strategies = ["fedavg"] + [s for s in args.strategies.split(",") if s != "fedavg"]
    results = []
    for model in args.models.split(","):
        for strategy in strategies:
            results.append(measure(model, strategy, args.examples, args.epochs, args.particles, args.device))
            print(table(results, args).splitlines()[-1], flush=True)
    path = RESULTS / f"model_cost-{args.device}.json"  # merged with earlier runs of other pairs, same settings
    settings = {"examples": args.examples, "epochs": args.epochs, "particles": args.particles}
    earlier = json.loads(path.read_text()) if path.exists() else {}
    if {key: earlier.get(key) for key in settings} == settings:
        ours = {(r["model"], r["strategy"]) for r in results}
        results = [r for r in earlier["results"] if (r["model"], r["strategy"]) not in ours] + results
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**settings, "results": results}, indent=1))
    print()
    print(table(results, args))


if __name__ == "__main__":
    main()
