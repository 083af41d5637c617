"""What running more trainings at once than there are cores costs: `--tasks` one-thread IVON trainings (the MLP,
10 epochs over 600 examples, batch 32, like one BayesADMM client of the FMNIST-10% 10-client setting, on random
data), each a forked process, run N at a time for each N in `--at-once`. Prints the wall time of all of them
and the CPU seconds each took (its rusage). This is why `fedbayes local` lets only as many ClientApps compute at
once as the machine has cores (tasks/slots.py).

Run:  python benchmarks/oversubscription.py [--tasks 10 --at-once 1 2 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ivon
import torch

from fedbayes.tasks.models import build_model


def train_one() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("mlp", (1, 28, 28), 10)
    optimizer = ivon.IVON(model.parameters(), lr=0.1, ess=600)
    inputs, labels = torch.randn(600, 1, 28, 28), torch.randint(0, 10, (600,))
    for _ in range(10):
        for start in range(0, 600, 32):
            with optimizer.sampled_params(train=True):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(
                    model(inputs[start : start + 32]), labels[start : start + 32]
                ).backward()
            optimizer.step()


def run(tasks: int, at_once: int) -> tuple[float, float]:
    """(wall seconds for all tasks, mean CPU seconds per task)."""
    started, running, cpu = time.monotonic(), [], []
    for _ in range(tasks):
        pid = os.fork()
        if pid == 0:
            train_one()
            os._exit(0)
        running.append(pid)
        if len(running) >= at_once:
            cpu.append(_reap(running.pop(0)))
    cpu += [_reap(pid) for pid in running]
    return time.monotonic() - started, sum(cpu) / tasks


def _reap(pid: int) -> float:
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        raise RuntimeError(f"training process {pid} failed (wait status {status})")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--at-once", type=int, nargs="+", default=[1, 2, 10])
    args = parser.parse_args()
    print(f"{args.tasks} trainings on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    train_one()  # warm the page cache and torch's lazy initialisation once, in this process
    print(f"{'at once':>8} {'wall s':>8} {'CPU s per training':>20}")
    for at_once in args.at_once:
        wall, cpu = run(args.tasks, at_once)
        print(f"{at_once:>8} {wall:>8.2f} {cpu:>20.3f}", flush=True)


if __name__ == "__main__":
    main()
