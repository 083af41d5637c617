"""Cost of one server evaluation (the global mean and S posterior samples, each a pass over the test images): seconds
per model, one pass per sample against one vmapped pass over all of them (`eval-batched`), on 1 thread against N
(`eval-threads`). The evaluation is the ServerApp's own (server/evaluation.py ServerEvaluation), on the first
--examples FMNIST test images, with samples drawn around the freshly built model's weights.

With --clients K it also measures what the evaluation does beside K local clients: K processes train the first model
(SGD, batch 32, one thread each, nice 0) while the evaluation runs as the round loop runs it, on a thread at nice 19
(server/loop.py yield_cpu); it reports the clients' training steps per second without and during the evaluation, and
the evaluation's wall time, with 1 and N threads.

    python benchmarks/evaluation_cost.py --examples 500                # small; results/evaluation_cost-cpu.json
    python benchmarks/evaluation_cost.py                               # the whole test set (10,000 images)
    python benchmarks/evaluation_cost.py --examples 500 --clients 2 --models cnn-zenke
    python benchmarks/evaluation_cost.py --device cuda                 # on a GPU (threads do not matter there)

Wall seconds are what the round waits for; the CPU seconds (this process's, all threads) show the work. Each
configuration runs once on 50 images first to warm up (oneDNN primitives, vmap), then --repeats times; the table
shows the fastest. `agree` is the largest difference between the batched and the one-pass-per-sample metrics.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as the ServerApp: threads only where the evaluation asks for them

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

from fedbayes.server.evaluation import ServerEvaluation, with_evaluation_defaults
from fedbayes.server.loop import yield_cpu
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.compute import resolve_device
from fedbayes.tasks.datasets import Dataset, load_dataset
from fedbayes.tasks.models import build_model

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mlp", "cnn-zenke", "cnn-acar", "resnet20")
METRICS = ("accuracy", "nll", "ece", "accuracy_ensemble", "nll_ensemble", "ece_ensemble")
WARM_UP_EXAMPLES = 50


class GaussianSamples:
    """A strategy's part in the evaluation: S weight samples, N(the model's weights, 0.01²), and no buffers."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.mean = {name: value.detach().numpy().copy() for name, value in model.named_parameters()}
        self.buffer_layout = {name: tuple(value.shape) for name, value in model.named_buffers()}

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        return [
            {
                name: value + 0.01 * torch.randn(value.shape, generator=generator).numpy()
                for name, value in self.mean.items()
            }
            for _ in range(count)
        ]


def evaluation(
    model_name: str, test: Dataset, samples: int, threads: int, batched: bool, device: str
) -> tuple[ServerEvaluation, ArrayRecord]:
    """The ServerApp's evaluation of the last round (the whole of `test`) of a fresh model, and its arrays."""
    torch.manual_seed(0)
    model = build_model(model_name, test.input_shape, test.num_classes)
    config = default_run_config() | {
        "model": model_name,
        "ensemble-samples": samples,
        "eval-threads": threads,
        "eval-batched": batched,
        "eval-fraction": 1.0,
        "num-server-rounds": 1,
        "device": device,
    }
    settings = with_evaluation_defaults(run_settings(config), model, test.input_shape)
    arrays = ArrayRecord({name: Array(value.detach().numpy().copy()) for name, value in model.state_dict().items()})
    return ServerEvaluation(model, test, GaussianSamples(model), settings.evaluation, resolve_device(device)), arrays


def time_evaluation(
    model_name: str, test: Dataset, samples: int, threads: int, batched: bool, device: str, repeats: int
) -> dict:
    warm_up, arrays = evaluation(model_name, test.subset(range(WARM_UP_EXAMPLES)), samples, threads, batched, device)
    warm_up(arrays, 1)
    evaluate, arrays = evaluation(model_name, test, samples, threads, batched, device)
    runs = []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        row = evaluate(arrays, 1)
        if device == "cuda":
            torch.cuda.synchronize()
        runs.append({"wall_seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu})
    return min(runs, key=lambda run: run["wall_seconds"]) | {
        "metrics": {key: row[key] for key in METRICS if key in row}
    }


def cost_table(models: list[str], test: Dataset, samples: int, threads: int, device: str, repeats: int) -> list[dict]:
    results = []
    for model_name in models:
        for thread_count in sorted({1, threads}):
            timed = {
                batched: time_evaluation(model_name, test, samples, thread_count, batched, device, repeats)
                for batched in (False, True)
            }
            agree = max(
                abs(timed[True]["metrics"][key] - timed[False]["metrics"][key]) for key in timed[False]["metrics"]
            )
            results.append(
                {
                    "model": model_name,
                    "threads": thread_count,
                    "one_pass_each": timed[False],
                    "batched": timed[True],
                    "agree": agree,
                }
            )
            print(table_line(results[-1]), flush=True)
    return results


def table_line(result: dict) -> str:
    one, batched = result["one_pass_each"], result["batched"]
    return (
        f"{result['model']:<10} {result['threads']:>7} {one['wall_seconds']:>10.2f} {one['cpu_seconds']:>9.2f} "
        f"{batched['wall_seconds']:>10.2f} {batched['cpu_seconds']:>9.2f} "
        f"{batched['wall_seconds'] / one['wall_seconds']:>8.2f} {result['agree']:>9.1e}"
    )


# ---- beside local clients ----------------------------------------------------------------------------------------


def train_client(model_name: str, input_shape: tuple[int, ...], steps, ready, stop) -> None:
    """A local client: SGD steps on random batches of 32, one thread, nice 0, counted in `steps`."""
    torch.set_num_threads(1)
    torch.manual_seed(os.getpid())
    model = build_model(model_name, input_shape, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    images, labels = torch.rand(32, *input_shape), torch.randint(0, 10, (32,))
    ready.release()
    while not stop.is_set():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        with steps.get_lock():
            steps.value += 1


def steps_per_second(steps, seconds: float) -> float:
    before = steps.value
    time.sleep(seconds)
    return (steps.value - before) / seconds


def beside_clients(model_name: str, test: Dataset, samples: int, threads: int, clients: int) -> list[dict]:
    """The clients' step rate alone and during the evaluation, and the evaluation's wall seconds, per thread count."""
    context = multiprocessing.get_context("spawn")
    steps, ready, stop = context.Value("q", 0), context.Semaphore(0), context.Event()
    workers = [
        context.Process(target=train_client, args=(model_name, test.input_shape, steps, ready, stop))
        for _ in range(clients)
    ]
    for worker in workers:
        worker.start()
    results = []
    try:
        for _ in workers:
            ready.acquire()
        with ThreadPoolExecutor(max_workers=1, initializer=yield_cpu) as pool:  # as server/loop.py RoundFinisher
            for thread_count in sorted({1, threads}):
                warm_up, warm_up_arrays = evaluation(
                    model_name, test.subset(range(WARM_UP_EXAMPLES)), samples, thread_count, False, "cpu"
                )
                pool.submit(warm_up, warm_up_arrays, 1).result()
                evaluate, arrays = evaluation(model_name, test, samples, thread_count, False, "cpu")
                alone = steps_per_second(steps, 3.0)
                started, before = time.perf_counter(), steps.value
                pool.submit(evaluate, arrays, 1).result()
                wall = time.perf_counter() - started
                results.append(
                    {
                        "threads": thread_count,
                        "clients": clients,
                        "client_steps_per_second_alone": alone,
                        "client_steps_per_second_during": (steps.value - before) / wall,
                        "evaluation_wall_seconds": wall,
                    }
                )
                print(
                    f"{thread_count:>7} {alone:>14.1f} {results[-1]['client_steps_per_second_during']:>15.1f} "
                    f"{wall:>11.2f}",
                    flush=True,
                )
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10_000, help="the first this many FMNIST test images")
    parser.add_argument("--samples", type=int, default=32, help="posterior samples besides the mean (S)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="N (default: the cores)")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--clients", type=int, default=0, help="also measure beside this many training clients")
    args = parser.parse_args()
    models = args.models.split(",")
    test = load_dataset("fmnist", train=False)
    test = test.subset(range(min(args.examples, len(test))))
    print(
        f"one evaluation: the mean + {args.samples} samples over {len(test)} FMNIST test images, {args.device}; "
        f"seconds (wall, CPU); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print(
        f"{'model':<10} {'threads':>7} {'1 pass ea':>10} {'cpu':>9} {'batched':>10} {'cpu':>9} {'b / 1':>8} "
        f"{'agree':>9}"
    )
    result = {
        "examples": len(test),
        "samples": args.samples,
        "device": args.device,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "evaluations": cost_table(models, test, args.samples, args.threads, args.device, args.repeats),
    }
    if args.clients:
        print(f"\n{models[0]} beside {args.clients} clients training it (nice 0, 1 thread each); evaluation at nice 19")
        print(f"{'threads':>7} {'steps/s alone':>14} {'steps/s during':>15} {'eval wall s':>11}")
        result["beside_clients"] = beside_clients(models[0], test, args.samples, args.threads, args.clients)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"evaluation_cost-{args.device}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"\n{path}")


if __name__ == "__main__":
    main()
