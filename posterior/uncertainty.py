"""A posterior predictive and its uncertainty per example, from the class probabilities of its members (weight
samples, particles, or the one model of a point estimate). In nats:

  entropy             H[p̄(y|x)], p̄ = mean_s p(y|x, θ_s)       total uncertainty
  expected_entropy    mean_s H[p(y|x, θ_s)]                      aleatoric: what each member is unsure of
  mutual_information  entropy − expected_entropy = I(y; θ | x)   epistemic: how much the members disagree

and what they are for (`uncertainty_metrics`): telling the predictive's mistakes, and inputs from elsewhere, apart
by AUROC, and its accuracy where it is surest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedbayes.bayes.metrics import misclassification_auroc, ood_auroc, selective_accuracy

SELECTIVE_COVERAGE = 0.8  # the share of the test set `selective_accuracy_80` keeps


@dataclass(frozen=True)
class Prediction:
    probs: torch.Tensor  # (N, C) float32: the posterior predictive p̄, averaged as the server averages its ensemble
    entropy: torch.Tensor  # (N,) float64
    expected_entropy: torch.Tensor  # (N,) float64
    mutual_information: torch.Tensor  # (N,) float64
    members: int  # weight settings averaged: 1 for the mean or a point estimate

    @property
    def predicted(self) -> torch.Tensor:
        return self.probs.argmax(dim=1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """−Σ_c p_c log p_c over the last dimension, in float64, with 0 log 0 = 0.

    Args:
        probs: class probabilities, classes in the last dimension.

    Returns:
        The entropies in nats, shape of `probs` without its last dimension.

    Examples:
        >>> entropy(torch.tensor([[0.5, 0.5], [1.0, 0.0]]))  # log 2 nats, and none for a sure class
        tensor([0.6931, 0.0000], dtype=torch.float64)
    """
    return torch.special.entr(probs.double()).sum(-1)


def predictive(member_probs: torch.Tensor) -> Prediction:
    """The predictive of S members' class probabilities `member_probs` (S, N, C) and its uncertainty.

    Args:
        member_probs: each member's class probabilities, shape (S, N, C).

    Returns:
        The mean probabilities (N, C) with their total, expected (aleatoric) and mutual-information entropies (N,).

    Raises:
        ValueError: `member_probs` is not 3-d.

    Examples:
        Two members sure of opposite classes: the predictive is 50/50, and all of its uncertainty is their
        disagreement.

        >>> p = predictive(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
        >>> p.probs, p.expected_entropy, p.mutual_information
        (tensor([[0.5000, 0.5000]]), tensor([0.], dtype=torch.float64), tensor([0.6931], dtype=torch.float64))
    """
    if member_probs.ndim != 3:
        raise ValueError(f"member probabilities must be (S, N, C), got {tuple(member_probs.shape)}")
    probs = member_probs.mean(0)
    total, aleatoric = entropy(probs), entropy(member_probs).mean(0)
    # Entropy is concave, so total >= aleatoric; rounding can leave -1e-16 where the members agree.
    return Prediction(probs, total, aleatoric, (total - aleatoric).clamp_min(0.0), len(member_probs))


def uncertainty_metrics(prediction: Prediction, labels: torch.Tensor, ood: Prediction | None) -> dict[str, Any]:
    """What a predictive's uncertainty is for, as a results row's keys (docs/running/local.md "Results"):

      misclassification_auroc     predictive entropy telling its wrong predictions from its right ones
      misclassification_auroc_mi  the same by mutual information (only with more than one member)
      selective_accuracy_80       accuracy on the 80% of the examples it is surest of (max probability)
      ood_auroc                   predictive entropy telling the `ood` inputs from the test inputs
      ood_auroc_mi                the same by mutual information (only with more than one member)

    An AUROC is None where it is undefined (every prediction right, or every one wrong), and the OOD AUROCs are None
    without OOD inputs (`ood` None: run config ood-inputs=none).

    Args:
        prediction: the predictive on the test inputs.
        labels: (N,) the test labels.
        ood: the same predictive on the OOD inputs, or None.

    Returns:
        The keys above.

    Raises:
        ValueError: `ood` has another number of members than `prediction`, or bad shapes (bayes/metrics.py).

    Examples:
        Two members: they agree on the two examples they get right and disagree on the one they get wrong.

        >>> members = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [1.0, 0.0]], [[0.9, 0.1], [0.2, 0.8], [0.0, 1.0]]])
        >>> metrics = uncertainty_metrics(predictive(members), torch.tensor([0, 1, 1]), None)
        >>> metrics["misclassification_auroc_mi"], metrics["ood_auroc"]  # MI 0, 0 and log 2: the mistake ranks first
        (1.0, None)
    """
    if ood is not None and ood.members != prediction.members:
        raise ValueError(f"the OOD predictive has {ood.members} members, the test one {prediction.members}")
    correct = prediction.predicted == labels
    scores = {"": (prediction.entropy, None if ood is None else ood.entropy)}
    if prediction.members > 1:
        scores["_mi"] = (prediction.mutual_information, None if ood is None else ood.mutual_information)
    metrics: dict[str, Any] = {
        "selective_accuracy_80": selective_accuracy(prediction.probs, labels, SELECTIVE_COVERAGE)
    }
    for suffix, (test_scores, ood_scores) in scores.items():
        metrics[f"misclassification_auroc{suffix}"] = misclassification_auroc(test_scores, correct)
        metrics[f"ood_auroc{suffix}"] = None if ood_scores is None else ood_auroc(test_scores, ood_scores)
    return metrics
