"""Reliability diagrams for DSVGD against FedAvg on the FMNIST BNN (Kassab & Simeone Fig. 8, App. A.3): after the
runs of benchmarks/dsvgd_fmnist.py (same presets, through the real local federation), the final server
checkpoint's model is evaluated on the FMNIST test set: DSVGD by its particle-averaged predictive (eq. 27), FedAvg
by its weights. Per confidence bin (j-1)/B < confidence <= j/B: accuracy, mean confidence and count; the paper's
MCE (max over non-empty bins of |accuracy - confidence|) and the ECE.

    python benchmarks/dsvgd_calibration.py --rounds 10            # runs both, then the diagrams
    python benchmarks/dsvgd_calibration.py --reuse                 # diagrams from the checkpoints on disk

Writes benchmarks/results/dsvgd/reliability.png and reliability.json. The paper's setting is K = 20, N = 20,
L = L' = 200, I = 10; ours is dsvgd_fmnist.py's (K = 10, N = 10, L = L' = 50, see there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dsvgd_fmnist import MODEL, RESULTS, record_summary, run, run_name

from fedbayes.bayes.metrics import predict_probs
from fedbayes.bayes.params import parameter_layout, set_parameters, unflatten
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import build_model, parse_hidden

BINS = 10


def reliability(confidence: torch.Tensor, correct: torch.Tensor, bins: int = BINS) -> dict[str, list[float] | float]:
    """Per bin (j-1)/B < c <= j/B: accuracy, mean confidence, count; MCE and ECE over the non-empty bins."""
    index = (confidence * bins).ceil().long().clamp(1, bins) - 1
    count = torch.bincount(index, minlength=bins).double()
    accuracy = torch.bincount(index, weights=correct.double(), minlength=bins) / count.clamp_min(1)
    mean_confidence = torch.bincount(index, weights=confidence.double(), minlength=bins) / count.clamp_min(1)
    gap = (accuracy - mean_confidence).abs()
    return {
        "accuracy": accuracy.tolist(),
        "confidence": mean_confidence.tolist(),
        "count": count.tolist(),
        "mce": gap[count > 0].max().item(),
        "ece": (gap * count).sum().item() / count.sum().item(),
    }


def checkpoint_probs(strategy: str, seed: int, tag: str) -> torch.Tensor:
    """Test-set class probabilities of the run's final checkpoint (DSVGD: averaged over its particles)."""
    name = run_name(strategy, seed, tag)
    workdir = Path("runs") / f"dsvgd-{name}"
    path = workdir / "server-state" / workdir.name / "checkpoint.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: run benchmarks/dsvgd_fmnist.py (or this script without --reuse) first")
    test = load_dataset("fmnist", train=False)
    model = build_model(
        MODEL["model"], test.input_shape, test.num_classes, parse_hidden(MODEL["hidden"]), MODEL["activation"]
    )
    layout = parameter_layout(model)
    with safe_open(path, framework="np") as checkpoint:
        if strategy.endswith("dsvgd"):
            weights = [unflatten(p, layout) for p in checkpoint.get_tensor("strategy/particles")]
        else:
            weights = [{n: checkpoint.get_tensor(f"global/{n}") for n in layout}]
    probs = []
    for arrays in weights:
        set_parameters(model, arrays)
        probs.append(predict_probs(model, test.images, 2000, torch.device("cpu")))
    return torch.stack(probs).mean(0)


def plot(diagrams: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(diagrams), figsize=(4 * len(diagrams), 4), squeeze=False)
    centres = (np.arange(BINS) + 0.5) / BINS
    for axis, (strategy, diagram) in zip(axes[0], diagrams.items()):
        accuracy = np.where(np.array(diagram["count"]) > 0, diagram["accuracy"], np.nan)
        axis.bar(centres, accuracy, width=1 / BINS, edgecolor="k", label="accuracy")
        axis.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        axis.set(
            title=f"{strategy}: MCE {diagram['mce']:.3f}, ECE {diagram['ece']:.3f}",
            xlabel="confidence",
            ylabel="accuracy",
            xlim=(0, 1),
            ylim=(0, 1),
        )
        axis.legend(loc="upper left", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="dsvgd,fedavg")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="only evaluate the checkpoints already on disk")
    args = parser.parse_args()
    diagrams = {}
    for strategy in args.strategies.split(","):
        if not args.reuse:
            record_summary(run(strategy, args.rounds, args.seed, {}, ""))
        probs = checkpoint_probs(strategy, args.seed, "")
        confidence, predicted = probs.max(1)
        correct = predicted == load_dataset("fmnist", train=False).labels
        diagrams[strategy] = reliability(confidence, correct)
        print(
            f"{strategy}: accuracy {correct.double().mean().item():.4f}, MCE {diagrams[strategy]['mce']:.3f}, "
            f"ECE {diagrams[strategy]['ece']:.3f}; per bin accuracy "
            + " ".join(f"{a:.2f}" for a in diagrams[strategy]["accuracy"]),
            flush=True,
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reliability.json").write_text(json.dumps(diagrams, indent=1))
    plot(diagrams, RESULTS / "reliability.png")


if __name__ == "__main__":
    main()
