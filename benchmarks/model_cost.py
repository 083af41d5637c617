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
when the round starts; GPU, torch.cuda.max_memory_allocated. Each row names its ratio to FedAvg's round on the same
model in the same run (`bayesadmm_ratio_to_fedavg`, ...).

--paths: the single-tensor and the multi-tensor (`torch._foreach_*`) paths of the local training instead, each
strategy's `train_epochs` alone (no payloads): IVON's step for BayesADMM, Adam's with the proximal term for FedProx,
with the anchored penalty for FedDyn, Adam's for FedAvg (torch's own `foreach`), the same --epochs over the same
--examples. Per row: the local epochs' seconds, per step, and the ratio to FedAvg on this device's default path
(multi-tensor on CUDA, single-tensor on the CPU: what a client runs), the median of --repeats after one warm-up.

    python benchmarks/model_cost.py --paths --models mlp --examples 6000 --batch-size 32
    python benchmarks/model_cost.py --paths --models cnn-acar --examples 256  # results/model_cost-paths-cpu-256.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("cnn-acar", "cnn-zenke", "resnet20")  # and "mlp", the paper's FMNIST MLP 784-200-100-10, when named
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
PATH_STRATEGIES = ("fedavg", "fedprox", "feddyn", "bayesadmm")  # --paths: those whose training has the two paths
PATHS = {"single-tensor": False, "multi-tensor": True}


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


def measure(model: str, strategy: str, examples: int, epochs: int, particles: int, device: str, batch: int) -> dict:
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
            plan = server.configure(server_round, arrays, _Grid())
            (message,) = plan.messages
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
            arrays = server.aggregate(plan, [reply_message(reply, 1)]).arrays
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


def ratio_key(strategy: str) -> str:
    return f"{strategy.replace('-', '_')}_ratio_to_fedavg"


def with_ratios(results: list[dict], seconds: str, reference: dict[str, float]) -> list[dict]:
    """Each row with its ratio to FedAvg's `seconds` on the same model in this run (`reference`: model -> seconds)."""
    return [{**r, ratio_key(r["strategy"]): r[seconds] / reference[r["model"]]} for r in results]


def local_training(strategy: str, model, examples: int, foreach: bool) -> tuple:
    """The optimizer and `train_epochs` options of `strategy`'s local training on `model` (on its device), at the
    PRESETS' values, with every part that has the two paths on the one `foreach` picks."""
    import torch

    from fedbayes.bayes.ivon import IVONWithPrior
    from fedbayes.client.training import anchored_penalty
    from fedbayes.strategies.bayesadmm.settings import BayesADMMSettings
    from fedbayes.strategies.fedavg.client import proximal_term

    config = {**PRESETS.get(strategy, {})}
    parameters = list(model.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in parameters])
    if strategy == "bayesadmm":
        hp = BayesADMMSettings()
        rho, temperature = config["rho"], config["temperature"]
        ess = examples / (rho * temperature)
        optimizer = IVONWithPrior(
            parameters,
            lr=config["lr"],
            ess=ess,
            hess_init=config["hess-init"],
            beta1=hp.beta1,
            beta2=config["beta2"],
            rescale_lr=hp.rescale_lr,
            foreach=foreach,
        )
        optimizer.set_prior(flat, torch.full_like(flat, config["prior-precision"]))
        scale = temperature / examples  # duals of one dual step from q̄: small, of both signs
        optimizer.set_lagrange(scale * 0.01 * torch.randn_like(flat), scale * 0.01 * torch.randn_like(flat))
        return optimizer, {"sampled_weights": lambda: optimizer.sampled_params(train=True)}
    weight_decay = config.get("weight-decay", 0.0)
    optimizer = torch.optim.Adam(parameters, lr=1e-3, weight_decay=weight_decay, foreach=foreach)
    if strategy == "fedprox":
        anchor = [p.detach().clone() for p in parameters]
        return optimizer, {"extra_term": proximal_term(config["proximal-mu"], anchor, foreach=foreach)}
    if strategy == "feddyn":  # anchor w_g - λ_k/α_k and weight α_k, as a client with a λ_k of its own has them
        return optimizer, {"extra_term": anchored_penalty(flat - 0.01 * torch.randn_like(flat), config["feddyn-alpha"])}
    return optimizer, {}


def measure_paths(model_name: str, examples: int, epochs: int, batch: int, device: str, repeats: int) -> list[dict]:
    """Every PATH_STRATEGIES x PATHS pair's local epochs on `model_name`: the median of `repeats` timed runs after one
    warm-up, each from the same initial weights. A strategy's two paths take turns (in alternating order), so a load
    that drifts while they run weighs on both alike."""
    import torch

    from fedbayes.client.training import train_epochs
    from fedbayes.tasks.compute import resolve_device
    from fedbayes.tasks.datasets import load_dataset
    from fedbayes.tasks.models import build_model

    target = resolve_device(device)
    data = load_dataset("fmnist", train=True).subset(range(examples))
    steps = epochs * math.ceil(examples / batch)
    clock = time.perf_counter if target.type == "cuda" else time.process_time
    torch.manual_seed(0)
    model = build_model(model_name, data.input_shape, data.num_classes).to(target)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    rows = []
    for strategy in PATH_STRATEGIES:
        seconds: dict[str, list[float]] = {path: [] for path in PATHS}
        for run in range(repeats + 1):
            for path in list(PATHS)[:: 1 if run % 2 == 0 else -1]:
                model.load_state_dict(initial)
                optimizer, options = local_training(strategy, model, examples, PATHS[path])
                if target.type == "cuda":
                    torch.cuda.synchronize()
                started = clock()
                train_epochs(model, data, optimizer, epochs, batch, target, seed=run, **options)
                if run > 0:  # the first run warms up allocators, caches and torch._dynamo's import
                    seconds[path].append(clock() - started)
        for path, runs in seconds.items():
            median = statistics.median(runs)
            rows.append(
                {
                    "model": model_name,
                    "strategy": strategy,
                    "path": path,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "tensors": len(list(model.parameters())),
                    "steps": steps,
                    "epochs_seconds": median,
                    "step_ms": 1e3 * median / steps,
                    "runs_seconds": runs,
                    "device": str(target),
                }
            )
            print(f"{model_name:<10} {strategy:<10} {path:<13} {median:>8.3f} s {1e3 * median / steps:>8.3f} ms/step")
    return rows


def paths_table(rows: list[dict], args: argparse.Namespace, load: str) -> str:
    clock = "wall s" if args.device == "cuda" else "CPU s"
    lines = [
        f"local training, {args.examples} FMNIST examples x {args.epochs} epochs, batch {args.batch_size}, device "
        f"{rows[0]['device']}, 1 thread, median of {args.repeats}; {clock}; / FedAvg: to FedAvg on the default path "
        f"({default_path(args.device)}); load average {load}",
        f"{'model':<10} {'params':>9} {'strategy':<10} {'path':<13} {'seconds':>8} {'ms/step':>8} {'/ FedAvg':>8}",
    ]
    for r in rows:
        lines.append(
            f"{r['model']:<10} {r['parameters']:>9,} {r['strategy']:<10} {r['path']:<13} {r['epochs_seconds']:>8.3f} "
            f"{r['step_ms']:>8.3f} {r[ratio_key(r['strategy'])]:>8.2f}"
        )
    return "\n".join(lines)


def default_path(device: str) -> str:
    import torch

    from fedbayes.bayes.params import uses_multi_tensor

    return "multi-tensor" if uses_multi_tensor(None, torch.device(device)) else "single-tensor"


def run_paths(args: argparse.Namespace) -> None:
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    rows = []
    for model in args.models.split(","):
        rows += measure_paths(model, args.examples, args.epochs, args.batch_size, args.device, args.repeats)
    fedavg = {
        r["model"]: r["epochs_seconds"]
        for r in rows
        if r["strategy"] == "fedavg" and r["path"] == default_path(args.device)
    }
    rows = with_ratios(rows, "epochs_seconds", fedavg)
    path = RESULTS / f"model_cost-paths-{args.device}-{args.examples}.json"
    settings = {"examples": args.examples, "epochs": args.epochs, "batch_size": args.batch_size, "load_average": load}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**settings, "results": rows}, indent=1))
    print()
    print(paths_table(rows, args, load))


def table(results: list[dict], args: argparse.Namespace) -> str:
    memory = "peak CUDA MB" if args.device == "cuda" else "RSS growth MB"
    clock = "wall s" if args.device == "cuda" else "CPU s"
    lines = [
        f"one client round, {args.examples} FMNIST examples x {args.epochs} epochs, batch {args.batch_size}, "
        f"device {results[0]['device']}, 1 thread; DSVGD N = {args.particles}; {clock}",
        f"{'model':<10} {'params':>9} {'strategy':<11} {'seconds':>8} {'/ FedAvg':>8}  {memory}",
    ]
    for r in results:
        ratio = f"{r[ratio_key(r['strategy'])]:.2f}" if ratio_key(r["strategy"]) in r else "-"
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
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--paths", action="store_true", help="the single- and multi-tensor local training instead")
    parser.add_argument("--repeats", type=int, default=3, help="--paths: timed runs per row, after one warm-up")
    args = parser.parse_args()
    from fedbayes.tasks.compute import configure_threads

    configure_threads()
    if args.paths:
        run_paths(args)
        return
    strategies = ["fedavg"] + [s for s in args.strategies.split(",") if s != "fedavg"]
    results = []
    for model in args.models.split(","):
        fedavg = {}
        for strategy in strategies:  # FedAvg first: the reference of the model's rows
            row = measure(model, strategy, args.examples, args.epochs, args.particles, args.device, args.batch_size)
            fedavg.setdefault(model, row["seconds"])
            results += with_ratios([row], "seconds", fedavg)
            print(table(results, args).splitlines()[-1], flush=True)
    path = RESULTS / f"model_cost-{args.device}.json"  # merged with earlier runs of other pairs, same settings
    settings = {
        "examples": args.examples,
        "epochs": args.epochs,
        "particles": args.particles,
        "batch_size": args.batch_size,
    }
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
