"""Classification metrics of a predictive distribution: accuracy, NLL, expected and maximum calibration error, the
per-bin data of its reliability diagram; what its uncertainty is for: AUROC (rank-based, ties averaged) of a score for
telling misclassified or out-of-distribution inputs apart, and selective accuracy at a coverage; and the
membership-inference AUC of per-example losses."""

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

    Args:
        probs: (N, C) predictive class probabilities.
        labels: (N,) integer labels.
        bins: equal-width confidence bins of the ECE and the reliability diagram.

    Returns:
        "accuracy", "nll" and "ece" (floats) and "reliability" (`reliability_bins`).

    Raises:
        ValueError: `probs` is not (N, C) or `labels` not (N,).
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
    """The top-label ECE, Σ_b |Σ_{i∈b} (confidence_i − correct_i)| / N over equal-width bins (Guo et al., 2017).

    Args:
        confidence: (N,) top-label probabilities.
        correct: (N,) whether each top label is right (bool or 0/1).
        bins: equal-width confidence bins.

    Returns:
        The expected calibration error, in [0, 1].
    """
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
    `accuracy` (share correct), both None for an empty bin, and `count` (examples).

    Args:
        confidence: (N,) top-label probabilities.
        correct: (N,) whether each top label is right (bool or 0/1).
        bins: equal-width confidence bins.

    Returns:
        "confidence", "accuracy" and "count", each a list of one entry per bin.
    """
    count, confidence_sum, correct_sum = _bin_sums(confidence, correct, bins)
    return {
        "confidence": [total / n if n else None for total, n in zip(confidence_sum.tolist(), count.tolist())],
        "accuracy": [total / n if n else None for total, n in zip(correct_sum.tolist(), count.tolist())],
        "count": count.tolist(),
    }


def auroc(scores: torch.Tensor, positives: torch.Tensor) -> float | None:
    """Area under the ROC curve of `scores` for telling the `positives` from the rest: the chance that a random
    positive scores higher than a random negative, a tie counting one half (the Mann-Whitney U statistic over
    n_positive x n_negative, from ranks with tied scores given their mean rank).

    Args:
        scores: (N,) real scores, higher meaning "more likely positive".
        positives: (N,) booleans (or 0/1), which examples are positives.

    Returns:
        The AUROC in [0, 1]; None where it is undefined: no positives or no negatives (every prediction right, say).

    Raises:
        ValueError: the shapes differ, or a score is NaN.

    Examples:
        >>> auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))  # 3 of the 4 pairs ordered
        0.75
        >>> auroc(torch.tensor([1.0, 1.0]), torch.tensor([0, 1]))  # one tied pair
        0.5
        >>> auroc(torch.tensor([0.2, 0.3]), torch.tensor([1, 1])) is None
        True
    """
    scores, positives = scores.double().flatten(), positives.bool().flatten()
    if scores.shape != positives.shape:
        raise ValueError(
            f"scores and positives must have one entry per example, got {scores.numel()} and {positives.numel()}"
        )
    if scores.isnan().any():
        raise ValueError("a score is NaN: it has no rank")
    count = int(positives.sum())
    negatives = scores.numel() - count
    if count == 0 or negatives == 0:
        return None
    sorted_scores, order = torch.sort(scores, stable=True)
    _, group, group_size = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    last_rank = group_size.cumsum(0).double()  # 1-based rank of each run of equal scores' last member
    ranks = torch.empty_like(scores)
    ranks[order] = (last_rank - (group_size - 1) / 2.0)[group]  # the run's mean rank
    u_statistic = ranks[positives].sum().item() - count * (count + 1) / 2.0
    return u_statistic / (count * negatives)


def misclassification_auroc(uncertainty: torch.Tensor, correct: torch.Tensor) -> float | None:
    """AUROC of `uncertainty` (N,) for telling the wrong predictions from the right ones (`correct`, (N,) booleans):
    auroc with the mistakes as positives, so None where every prediction is right, or every one wrong.

    Args:
        uncertainty: (N,) uncertainty scores, higher meaning "more likely wrong".
        correct: (N,) whether each prediction is right (bool or 0/1).

    Returns:
        The AUROC in [0, 1], or None.

    Raises:
        ValueError: the shapes differ, or a score is NaN (`auroc`).
    """
    return auroc(uncertainty, ~correct.bool())


def ood_auroc(in_distribution: torch.Tensor, out_of_distribution: torch.Tensor) -> float | None:
    """AUROC of an uncertainty score for telling out-of-distribution inputs from in-distribution ones: `in_distribution`
    (N,) and `out_of_distribution` (M,) are the scores of each, the OOD inputs the positives. None where either is
    empty.

    Args:
        in_distribution: (N,) the scores of the in-distribution inputs.
        out_of_distribution: (M,) the scores of the out-of-distribution inputs.

    Returns:
        The AUROC in [0, 1], or None.

    Raises:
        ValueError: a score is NaN (`auroc`).
    """
    scores = torch.cat([in_distribution.double().flatten(), out_of_distribution.double().flatten()])
    positives = torch.arange(scores.numel()) >= in_distribution.numel()
    return auroc(scores, positives)


def selective_accuracy(probs: torch.Tensor, labels: torch.Tensor, coverage: float) -> float:
    """Accuracy on the `coverage` share of the examples the predictive is surest of (highest max probability):
    round(coverage x N) of them, at least one. Examples tied at the last kept confidence are all kept in part (their
    mean accuracy for the places left), so the result does not depend on their order: the expected accuracy under a
    random tie break.

    Args:
        probs: (N, C) predictive class probabilities.
        labels: (N,) integer labels.
        coverage: the share kept, in (0, 1].

    Returns:
        The accuracy on the kept examples.

    Raises:
        ValueError: bad shapes, no examples, or a coverage outside (0, 1].

    Examples:
        Confidences 0.9 (right), 0.8 (wrong), 0.7 (right), 0.6 (wrong); half kept: the first two.

        >>> probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3], [0.4, 0.6]])
        >>> selective_accuracy(probs, torch.tensor([0, 0, 0, 0]), 0.5)
        0.5
    """
    if probs.ndim != 2 or labels.shape != probs.shape[:1] or len(labels) == 0:
        raise ValueError(
            f"probs must be (N, C) and labels (N,), N > 0, got {tuple(probs.shape)} and {tuple(labels.shape)}"
        )
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    confidence, predicted = probs.max(dim=1)
    correct = (predicted == labels).double()
    kept = max(1, round(coverage * len(labels)))
    threshold = torch.sort(confidence, descending=True).values[kept - 1]
    above, tied = confidence > threshold, confidence == threshold
    places_left = kept - int(above.sum())
    return ((correct[above].sum() + places_left * correct[tied].mean()) / kept).item()


@torch.no_grad()
def predict_probs(model: torch.nn.Module, images: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Softmax class probabilities of `model` on `images`, batched, on the CPU.

    Args:
        model: a classifier returning logits (N, C), on `device`; put in eval mode.
        images: (N, ...) inputs.
        batch_size: images per forward pass.
        device: where to compute.

    Returns:
        (N, C) probabilities, on the CPU.
    """
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
    member_losses = torch.from_numpy(np.asarray(members, dtype=float)).flatten()
    other_losses = torch.from_numpy(np.asarray(others, dtype=float)).flatten()
    if not member_losses.numel() or not other_losses.numel():
        raise ValueError("the membership AUC needs at least one member and one other example")
    is_member = torch.cat([torch.ones(member_losses.numel()), torch.zeros(other_losses.numel())])
    area = auroc(-torch.cat([member_losses, other_losses]), is_member)  # a lower loss: more likely a member
    assert area is not None  # both groups are non-empty
    return area


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
