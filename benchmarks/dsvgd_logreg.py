"""DSVGD's Bayesian logistic regression (Kassab & Simeone Sec. 7, Fig. 4) on Twonorm, against FedAvg scheduled the
same way (one agent per round, round-robin), and U-DSVGD; in one process with the strategies' own math
(strategies/dsvgd.py), no network: the model has 21 parameters and the question is the algorithm.

Twonorm is defined by a formula (Breiman 1996): 20 dimensions, y = ±1 equally likely, x ~ N(y·(2/√20)·1, I);
7,400 points as in Gershman et al. (2012), a random 80/20 train/test split per trial, the training set split into K
equal random parts. Its Bayes accuracy is Φ(2) = 97.7%.
Model (Gershman et al.): θ = [w, log ξ], p_0(w | ξ) = N(0, ξ⁻¹ I), p_0(ξ) = Gamma(1, 0.01) read as the authors'
code does (docs/algorithms/dsvgd.md: shape 1, rate b0 = 100 in the initialisation and the score, E[ξ] = 0.01, so
the initial weights have std ≈ 10); L_k = Σ log(1 + exp(-y w·x)) over agent k's data, estimated on a minibatch of 10
(the paper's Table 2) x |D_k|/10. DSVGD: L = L' = 200, KDE bandwidth 0.55, AdaGrad-with-momentum lr 0.05, β 0.9,
fudge 1e-9 (the paper's Table 3); decisions from the particle-averaged predictive. FedAvg: the scheduled agent runs
L = 200 steps of the same step rule on its loss from the global weights, which it sends back (one agent per round,
so the server's average is its weights); it starts from the first particle's w.

    python benchmarks/dsvgd_logreg.py                    # K = 2, 10, 20; N = 2, 6; 40 rounds; 3 trials
    python benchmarks/dsvgd_logreg.py --trials 1 --rounds 10 --agents 2

Writes benchmarks/results/dsvgd/twonorm.json (accuracy per round, mean over trials) and twonorm.png.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.strategies.dsvgd.math import SVGDSettings, Visit, agent_round, unconstrained_tilted_update

RESULTS = Path(__file__).resolve().parent / "results" / "dsvgd"
DIMENSION, EXAMPLES, BATCH = 20, 7400, 10
PRIOR_SHAPE, PRIOR_RATE = 1.0, 100.0  # Gamma(a = 1, b = 0.01) as the authors' code uses it (rate 1/0.01)
SETTINGS = SVGDSettings(
    local_steps=200, distill_steps=200, kde_bandwidth=0.55, lr=0.05, distill_lr=0.05, beta=0.9, fudge=1e-9
)


def twonorm(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Breiman's Twonorm: labels ±1, inputs N(label·(2/√20)·1, I_20)."""
    labels = torch.randint(0, 2, (count,), generator=generator, dtype=torch.float64) * 2 - 1
    inputs = torch.randn(count, DIMENSION, generator=generator, dtype=torch.float64)
    return inputs + labels[:, None] * (2 / math.sqrt(DIMENSION)), labels


def prior_score(theta: torch.Tensor) -> torch.Tensor:
    """∇log p_0 for θ = [w, s = log ξ]: log p_0 = (d/2 + a) s - e^s (‖w‖²/2 + b0) + const (the +s is the Jacobian)."""
    w, s = theta[:, :-1], theta[:, -1:]
    precision = s.exp()
    return torch.cat(
        [-precision * w, DIMENSION / 2 + PRIOR_SHAPE - precision * (w.square().sum(1, keepdim=True) / 2 + PRIOR_RATE)],
        dim=1,
    )


def prior_sample(count: int, generator: torch.Generator) -> torch.Tensor:
    precision = torch.distributions.Gamma(PRIOR_SHAPE, PRIOR_RATE).sample((count, 1))  # uses torch's global RNG
    w = torch.randn(count, DIMENSION, generator=generator, dtype=torch.float64) / precision.double().sqrt()
    return torch.cat([w, precision.double().log()], dim=1)


class LossGradient:
    """∇L_k at every particle, on one minibatch of `BATCH` per call (a seeded permutation) x |D_k|/BATCH; the
    log-precision gets no gradient from the data."""

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, generator: torch.Generator) -> None:
        self.inputs, self.labels, self.generator = inputs, labels, generator
        self.order, self.position = torch.randperm(len(labels), generator=generator), 0

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        if self.position + BATCH > len(self.labels):
            self.order, self.position = torch.randperm(len(self.labels), generator=self.generator), 0
        batch = self.order[self.position : self.position + BATCH]
        self.position += BATCH
        x, y = self.inputs[batch], self.labels[batch]
        margins = y[None, :] * (theta[:, :-1] @ x.T)  # (N, B)
        weights = -torch.sigmoid(-margins) * y[None, :]  # d/dm log(1 + e^-m) = -σ(-m), times dm/dw = y x
        gradient_w = weights @ x * (len(self.labels) / BATCH)
        return torch.cat([gradient_w, torch.zeros_like(theta[:, -1:])], dim=1)


def accuracy(weights: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """Decision = the maximum of the averaged predictive over the rows of `weights` (one row: a point estimate)."""
    probability = torch.sigmoid(inputs @ weights.T).mean(1)  # p(y = +1 | x)
    return ((probability > 0.5).double() * 2 - 1 == labels).double().mean().item()


def run_trial(agents: int, particles: int, rounds: int, trial: int) -> dict[str, list[float]]:
    generator = torch.Generator().manual_seed(1000 * trial + agents)
    torch.manual_seed(1000 * trial + agents)
    inputs, labels = twonorm(EXAMPLES, generator)
    order = torch.randperm(EXAMPLES, generator=generator)
    train, test = order[: int(0.8 * EXAMPLES)], order[int(0.8 * EXAMPLES) :]
    parts = [train[k::agents] for k in range(agents)]
    gradients = {
        method: [
            LossGradient(inputs[p], labels[p], torch.Generator().manual_seed(trial * 7919 + k))
            for k, p in enumerate(parts)
        ]
        for method in ("dsvgd", "u-dsvgd", "fedavg")
    }
    start = prior_sample(particles, generator)
    dsvgd, local = start.clone(), [start.clone() for _ in parts]
    unconstrained, visits = start.clone(), [[] for _ in parts]
    fedavg = start[:1].clone()
    curves = {"dsvgd": [], "u-dsvgd": [], "fedavg": []}
    test_x, test_y = inputs[test], labels[test]
    for i in range(rounds):
        k = i % agents
        dsvgd, local[k] = agent_round(dsvgd, local[k], prior_score, gradients["dsvgd"][k], SETTINGS)
        updated = unconstrained_tilted_update(
            unconstrained, i == 0, visits[k], prior_score, gradients["u-dsvgd"][k], SETTINGS
        )
        visits[k].append(Visit(None if i == 0 else unconstrained, updated))
        unconstrained = updated
        stepper, point = SETTINGS.stepper(SETTINGS.lr), fedavg
        for _ in range(SETTINGS.local_steps):
            point = stepper.step(point, -gradients["fedavg"][k](point))
        fedavg = point
        for method, state in (("dsvgd", dsvgd), ("u-dsvgd", unconstrained), ("fedavg", fedavg)):
            curves[method].append(accuracy(state[:, :-1], test_x, test_y))
    return curves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", default="2,10,20")
    parser.add_argument("--particles", default="2,6")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    results, started = [], time.monotonic()
    for agents in (int(k) for k in args.agents.split(",")):
        for particles in (int(n) for n in args.particles.split(",")):
            trials = [run_trial(agents, particles, args.rounds, t) for t in range(args.trials)]
            mean = {m: [sum(t[m][i] for t in trials) / len(trials) for i in range(args.rounds)] for m in trials[0]}
            results.append({"agents": agents, "particles": particles, "accuracy": mean})
            print(row(results[-1], args.rounds), flush=True)
    seconds = time.monotonic() - started
    print(f"{args.trials} trials, {seconds / 60:.1f} min")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "twonorm.json").write_text(
        json.dumps({"rounds": args.rounds, "trials": args.trials, "wall_seconds": seconds, "runs": results}, indent=1)
    )
    plot(results, RESULTS / "twonorm.png")


def row(result: dict, rounds: int) -> str:
    checkpoints = [r for r in (1, 2, 5, 10, 20, 40) if r <= rounds]
    cells = "  ".join(
        f"{m} " + "/".join(f"{100 * result['accuracy'][m][r - 1]:.1f}" for r in checkpoints)
        for m in ("dsvgd", "u-dsvgd", "fedavg")
    )
    return f"K={result['agents']:<2} N={result['particles']}  acc % at rounds {checkpoints}:  {cells}"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agents = sorted({r["agents"] for r in results})
    figure, axes = plt.subplots(1, len(agents), figsize=(4.5 * len(agents), 3.6), squeeze=False)
    for axis, k in zip(axes[0], agents):
        for result in (r for r in results if r["agents"] == k):
            rounds = range(1, len(result["accuracy"]["dsvgd"]) + 1)
            n = result["particles"]
            axis.plot(rounds, result["accuracy"]["dsvgd"], label=f"DSVGD N={n}")
            axis.plot(rounds, result["accuracy"]["u-dsvgd"], ":", label=f"U-DSVGD N={n}")
            if n == max(r["particles"] for r in results):
                axis.plot(rounds, result["accuracy"]["fedavg"], "k--", label="FedAvg")
        axis.axhline(0.977, color="grey", lw=0.5)
        axis.set(title=f"Twonorm, K = {k}", xlabel="round", ylabel="test accuracy", ylim=(0.5, 1.0))
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
