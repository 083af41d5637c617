"""What one DSVGD client round costs as the number of particles N grows, for the project's MLP-sized
Bayesian network (784-200-100-10, P = 178,110 parameters per particle), and what a round puts on the wire.

Compute (one process, one thread, CPU): seconds per SVGD step of loop 1 (N minibatch gradients via vmap,
two KDE gradients, the SVGD direction: O(N·B·model + N²P)) and of loop 2 (three KDE gradients and the
direction, no data: O(N²P)), each the median over `--steps` timed steps after one warm-up step; a client
round is L·loop1 + L'·loop2 with the paper's L = L' = 200. Data: 600 random images (one client's share of
FMNIST-10%), batch 100, as in the paper's FMNIST runs.

Wire: the instruction (N x P float32 particles down) and the reply (the same up): bytes as our codec puts them
in a Flower message, and the seconds of one hop's (de)serialisation (codec encode, Flower deflate, inflate,
codec decode with its checks), plus what the bytes take on 100 Mbit/s and 1 Gbit/s links.

Timings move with the machine's load (reported); compare within one run.

    python benchmarks/dsvgd_cost.py [--particles 5,10,20,50 --steps 3]

Writes benchmarks/results/dsvgd_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from payload_codec import deflate_message, inflate_message, new_message

from fedbayes.bayes.params import parameter_layout
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode, encode, new_header, payload_bytes
from fedbayes.strategies.dsvgd.client import MinibatchLossGradient
from fedbayes.strategies.dsvgd.math import SVGDSettings, distill, gaussian_prior_score, initial_particles, tilted_update
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.models import build_model

RESULTS = Path(__file__).resolve().parent / "results" / "dsvgd_cost.json"
ROUND_STEPS = 200  # the paper's L = L'


def seconds_per_step(run_steps, steps: int) -> float:
    """Median seconds of one step: `run_steps(k)` runs k steps; one warm-up step first."""
    run_steps(1)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        run_steps(1)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def compute_cost(count: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = build_model("mlp", (1, 28, 28), 10, (200, 100), "sigmoid")
    layout = parameter_layout(model)
    data = Dataset("fmnist", torch.rand(600, 1, 28, 28), torch.randint(0, 10, (600,)), 10, 1.0)
    particles = torch.from_numpy(initial_particles(layout, count, 0))
    local = particles + 0.01 * torch.randn_like(particles)
    loss_gradient = MinibatchLossGradient(model, layout, data, 100, 0, torch.device("cpu"))
    prior = gaussian_prior_score(2.718)

    def loop_one(k: int) -> torch.Tensor:
        return tilted_update(particles, local, prior, loss_gradient, SVGDSettings(k, 0, 0.55, 1e-3, 1e-3))

    updated = loop_one(2)

    def loop_two(k: int) -> torch.Tensor:
        return distill(local, particles, updated, SVGDSettings(0, k, 0.55, 1e-3, 1e-3))

    gradient_only = seconds_per_step(lambda k: loss_gradient(particles), steps)
    first, second = seconds_per_step(loop_one, steps), seconds_per_step(loop_two, steps)
    return {
        "particles": count,
        "parameters": particles.shape[1],
        "loop1_step_seconds": first,
        "loop1_gradients_seconds": gradient_only,
        "loop2_step_seconds": second,
        "round_seconds_L200": ROUND_STEPS * (first + second),
    }


def wire_cost(count: int, size: int, repeats: int = 3) -> dict:
    particles = torch.randn(count, size, generator=torch.Generator().manual_seed(0)).numpy()  # incompressible
    layout = {"particles": (count, size)}
    header = new_header("bench", 1)
    header.accepted_rounds["client-0"] = 1  # a node is told its own client's accepted round
    envelope, instruction = pb.Instruction(header=header), pb.DSVGDInstruction(local_steps=200, distill_steps=200)

    def hop() -> None:
        content = encode(envelope, instruction, {"particles": {"particles": particles}})
        message_id, contents = deflate_message(new_message(content))
        decode(
            inflate_message(message_id, contents).content,
            pb.Instruction,
            pb.DSVGDInstruction,
            {"particles": layout},
            "bench",
        )

    hop()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        hop()
        times.append(time.perf_counter() - started)
    size_bytes = payload_bytes(encode(envelope, instruction, {"particles": {"particles": particles}}))
    return {
        "payload_bytes": size_bytes,
        "serialise_hop_seconds": statistics.median(times),
        "link_100mbit_seconds": size_bytes * 8 / 100e6,
        "link_1gbit_seconds": size_bytes * 8 / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--particles", default="5,10,20,50")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from flwr.supercore.task_identity import TaskIdentity  # a Message outside a Flower run needs one

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    load = os.getloadavg()
    rows = []
    print(
        f"{'N':>4} {'P':>8} {'loop1 s/step':>13} {'(grads)':>8} {'loop2 s/step':>13} {'round s (L=L2=200)':>19} "
        f"{'payload MB':>11} {'ser. hop s':>10} {'100Mb/s s':>10} {'1Gb/s s':>8}"
    )
    for count in (int(n) for n in args.particles.split(",")):
        row = compute_cost(count, args.steps)
        row |= wire_cost(count, row["parameters"])
        rows.append(row)
        print(
            f"{count:>4} {row['parameters']:>8} {row['loop1_step_seconds']:>13.3f} "
            f"{row['loop1_gradients_seconds']:>8.3f} {row['loop2_step_seconds']:>13.3f} "
            f"{row['round_seconds_L200']:>19.1f} {row['payload_bytes'] / 1e6:>11.2f} "
            f"{row['serialise_hop_seconds']:>10.3f} {row['link_100mbit_seconds']:>10.2f} "
            f"{row['link_1gbit_seconds']:>8.3f}",
            flush=True,
        )
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "dsvgd_cost",
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "load_average_at_start": load,
                "load_average_at_end": os.getloadavg(),
                "cpu_count": os.cpu_count(),
                "model": "mlp 784-200-100-10 sigmoid",
                "round_steps": ROUND_STEPS,
                "rows": rows,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
