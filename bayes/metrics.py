"""Classification metrics of a predictive distribution: accuracy, NLL, expected and maximum calibration error, the
per-bin data of its reliability diagram; and the membership-inference AUC of per-example losses."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from fedbayes.bayes.params import set_parameters

ECE_BINS = 15
PROBABILITY_FLOOR = 1e-12  # the NLL clamps p(y|x) here, so one confident mistake cannot make it infinite
MAX_NLL = -math.log(PROBABILITY_FLOOR)  # so no NLL exceeds this


def classification_metrics(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> dict[str, Any]:
    """Metrics of predictive class probabilities `probs` (N, C) against integer `labels` (N,).

    NLL is the mean of -log p(y|x) (p clamped at PROBABILITY_FLOOR so one confident mistake cannot make it
    infinite, nor any NLL over MAX_NLL); ECE is the top-label calibration error over `bins` equal-width confidence bins,
    weighted by the fraction of examples in each bin (Guo et al., 2017). `reliability` holds those bins
    (reliability_bins), so that a results row can be drawn as a reliability diagram (`fedbayes report`).
    """
    if probs.ndim != 2 or labels.shape != probs.shape[:1]:
        raise ValueError(f"probs must be (N, C) and labels (N,), got {tuple(probs.shape)} and {tuple(labels.shape)}")
    probs = probs.double()
    confidence, predicted = probs.max(dim=1)
    correct = (predicted == labels).double()
    true_class_prob = probs.gather(1, labels.view(-1, 1)).squeeze(1)
    return {
        "accuracy": correct.mean().item(),
        "nll": -true_class_prob.clamp_min(PROBABILITY_FLOOR).log().mean().item(),
        "ece": expected_calibration_error(confidence, correct, bins),
        "reliability": reliability_bins(confidence, correct, bins),
    }


def _bin_sums(confidence: torch.Tensor, correct: torch.Tensor, bins: int) -> tuple[torch.Tensor, ...]:
    """Per bin: the examples, their confidences summed and their correct predictions summed. Bin b holds confidences
    in (b/bins, (b+1)/bins]; confidence 0 goes to the first bin."""
    bin_index = (confidence * bins).ceil().long().clamp(1, bins) - 1
    count = torch.bincount(bin_index, minlength=bins)
    confidence_sum = torch.bincount(bin_index, weights=confidence.double(), minlength=bins)
    correct_sum = torch.bincount(bin_index, weights=correct.double(), minlength=bins)
    return count, confidence_sum, correct_sum


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    _, confidence_sum, correct_sum = _bin_sums(confidence, correct, bins)
    return ((confidence_sum - correct_sum).abs().sum() / confidence.numel()).item()


def maximum_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    """The largest gap between a bin's mean confidence and its accuracy, over the non-empty bins (Naeini et al., 2015;
    the bins are the ECE's).

    Args:
        confidence: (N,) top-label probabilities.
        correct: (N,) whether each top label is right (bool or 0/1).
        bins: equal-width confidence bins.

    Returns:
        The maximum calibration error, in [0, 1].
    """
    count, confidence_sum, correct_sum = _bin_sums(confidence, correct, bins)
    filled = count > 0
    return ((confidence_sum - correct_sum)[filled].abs() / count[filled]).max().item()


def reliability_bins(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> dict[str, list[Any]]:
    """The reliability diagram's data, per equal-width confidence bin (as the ECE bins them): `confidence` (mean),
    `accuracy` (share correct), both None for an empty bin, and `count` (examples)."""
    count, confidence_sum, correct_sum = _bin_sums(confidence, correct, bins)
    return {
        "confidence": [total / n if n else None for total, n in zip(confidence_sum.tolist(), count.tolist())],
        "accuracy": [total / n if n else None for total, n in zip(correct_sum.tolist(), count.tolist())],
        "count": count.tolist(),
    }


@torch.no_grad()
def predict_probs(model: torch.nn.Module, images: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Softmax class probabilities of `model` on `images`, batched, on the CPU."""
    model.eval()
    chunks = [
        torch.softmax(model(images[i : i + batch_size].to(device)), dim=1).cpu()
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(chunks)


def member_probs(
    model: torch.nn.Module,
    members: Sequence[Mapping[str, np.ndarray]],
    images: torch.Tensor,
    batch_size: int,
    device: torch.device,
) -> torch.Tensor:
    """Each member's softmax probabilities on `images`, one pass per member.

    Args:
        model: the model the members are states of; each is loaded into it in turn, and it is left on the CPU.
        members: model states by name (its parameters, and its buffers where they differ from the model's).
        images: (N, ...) inputs.
        batch_size: images per forward pass.
        device: where to compute.

    Returns:
        (S, N, C) probabilities, on the CPU.
    """
    probs = []
    for weights in members:
        set_parameters(model, weights)
        probs.append(predict_probs(model.to(device), images, batch_size, device))
        model.cpu()
    return torch.stack(probs)


def membership_auc(members: npt.ArrayLike, others: npt.ArrayLike) -> float:
    """The loss-threshold membership attack's AUC: the probability that a member's loss is below another example's,
    ties counted half, over every pair (a model that remembers its training examples gives them lower losses).

    Args:
        members: per-example losses of the examples trained on.
        others: per-example losses of examples not trained on.

    Returns:
        The AUC, in [0, 1]: 0.5 where members and others look alike.

    Raises:
        ValueError: `members` or `others` is empty.
    """
    member_losses, ranked = np.asarray(members, dtype=float), np.sort(np.asarray(others, dtype=float))
    if not member_losses.size or not ranked.size:
        raise ValueError("the membership AUC needs at least one member and one other example")
    below, up_to = np.searchsorted(ranked, member_losses, "left"), np.searchsorted(ranked, member_losses, "right")
    wins = (ranked.size - up_to).sum() + (up_to - below).sum() / 2
    return float(wins / (member_losses.size * ranked.size))


def class_matched_membership_auc(
    members: npt.ArrayLike, member_labels: npt.ArrayLike, others: npt.ArrayLike, other_labels: npt.ArrayLike
) -> float:
    """The membership attack with one threshold per class (Song & Mittal 2021, their class-dependent threshold): each
    class's AUC of the members against the others of that class, weighted by the members' count in it. Under a skewed
    split the plain AUC also measures how well the model knows the members' classes; this one asks only whether the
    members look more familiar than unseen examples of their class.

    Args:
        members: per-example losses of the examples trained on.
        member_labels: their classes.
        others: per-example losses of examples not trained on.
        other_labels: their classes.

    Returns:
        The weighted AUC over the members' classes that the others have too.

    Raises:
        ValueError: no class of the members is among the others'.
    """
    member_losses, member_classes = np.asarray(members, dtype=float), np.asarray(member_labels)
    other_losses, other_classes = np.asarray(others, dtype=float), np.asarray(other_labels)
    classes = [c for c in np.unique(member_classes) if (other_classes == c).any()]
    if not classes:
        raise ValueError("no class of the members is among the other examples'")
    weights = np.array([(member_classes == c).sum() for c in classes], dtype=float)
    aucs = [membership_auc(member_losses[member_classes == c], other_losses[other_classes == c]) for c in classes]
    return float(np.dot(weights, aucs) / weights.sum())
