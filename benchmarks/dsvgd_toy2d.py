"""DSVGD's stability in 2-D against the KDE bandwidth (spec §7.5, §9.4): two agents with Gaussian
likelihoods, prior N(0, 4I), so the posterior is known exactly. Per round: the error of the particle mean,
the ratio of the particle covariance's trace to the posterior's, and the largest particle norm (particles
running off to infinity show there). N = 100, L = L' = 200, AdaGrad-with-momentum lr 0.05.

    python benchmarks/dsvgd_toy2d.py [--bandwidths 0.55,1.0 --seeds 0,1,2 --rounds 8]

Writes benchmarks/results/dsvgd_toy2d.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from fedbayes.strategies.dsvgd.math import SVGDSettings, agent_round, gaussian_prior_score

RESULTS = Path(__file__).resolve().parent / "results" / "dsvgd_toy2d.json"
PRIOR_VARIANCE = 4.0
LIKELIHOODS = [  # (mean, covariance) of each agent's Gaussian likelihood in θ
    (torch.tensor([1.0, -1.0]), torch.tensor([[2.0, 0.5], [0.5, 1.0]])),
    (torch.tensor([-0.5, 1.0]), torch.tensor([[3.0, -0.4], [-0.4, 2.0]])),
]


def posterior() -> tuple[torch.Tensor, torch.Tensor]:
    precision = torch.eye(2) / PRIOR_VARIANCE + sum(torch.linalg.inv(cov) for _, cov in LIKELIHOODS)
    covariance = torch.linalg.inv(precision)
    return covariance @ sum(torch.linalg.solve(cov, mean) for mean, cov in LIKELIHOODS), covariance


def loss_gradient(mean: torch.Tensor, covariance: torch.Tensor):
    precision = torch.linalg.inv(covariance).double()
    return lambda theta: (theta - mean.double()) @ precision


def run(bandwidth: float, seed: int, rounds: int, count: int) -> list[dict]:
    settings = SVGDSettings(200, 200, bandwidth, 0.05, 0.05)
    particles = PRIOR_VARIANCE**0.5 * torch.randn(
        count, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    local = [particles.clone() for _ in LIKELIHOODS]
    gradients = [loss_gradient(mean, cov) for mean, cov in LIKELIHOODS]
    exact_mean, exact_covariance = posterior()
    rows = []
    for i in range(rounds):
        k = i % len(LIKELIHOODS)
        particles, local[k] = agent_round(
            particles, local[k], gaussian_prior_score(1 / PRIOR_VARIANCE), gradients[k], settings
        )
        finite = bool(torch.isfinite(particles).all())
        rows.append(
            {
                "round": i + 1,
                "mean_error": (particles.mean(0) - exact_mean.double()).norm().item() if finite else None,
                "trace_ratio": (torch.cov(particles.T).trace() / exact_covariance.trace()).item() if finite else None,
                "max_norm": particles.norm(dim=1).max().item() if finite else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidths", default="0.55,1.0")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--particles", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = []
    print(f"{'λ':>5} {'seed':>4}  per round: mean error / trace ratio / max norm")
    for bandwidth in (float(b) for b in args.bandwidths.split(",")):
        for seed in (int(s) for s in args.seeds.split(",")):
            rows = run(bandwidth, seed, args.rounds, args.particles)
            runs.append({"kde_bandwidth": bandwidth, "seed": seed, "rows": rows})
            cells = [
                "diverged"
                if r["mean_error"] is None
                else f"{r['mean_error']:.2f}/{r['trace_ratio']:.2f}/{r['max_norm']:.1f}"
                for r in rows
            ]
            print(f"{bandwidth:>5} {seed:>4}  " + "  ".join(cells), flush=True)
    RESULTS.write_text(
        json.dumps(
            {"benchmark": "dsvgd_toy2d", "particles": args.particles, "prior_variance": PRIOR_VARIANCE, "runs": runs},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
