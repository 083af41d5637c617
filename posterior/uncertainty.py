"""A posterior predictive and its uncertainty per example, from the class probabilities of its members (weight
samples, particles, or the one model of a point estimate). In nats:

  entropy             H[p̄(y|x)], p̄ = mean_s p(y|x, θ_s)       total uncertainty
  expected_entropy    mean_s H[p(y|x, θ_s)]                      aleatoric: what each member is unsure of
  mutual_information  entropy − expected_entropy = I(y; θ | x)   epistemic: how much the members disagree
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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

    Examples:
        >>> entropy(torch.tensor([[0.5, 0.5], [1.0, 0.0]]))  # log 2 nats, and none for a sure class
        tensor([0.6931, 0.0000], dtype=torch.float64)
    """
    return torch.special.entr(probs.double()).sum(-1)


def predictive(member_probs: torch.Tensor) -> Prediction:
    """The predictive of S members' class probabilities `member_probs` (S, N, C) and its uncertainty.

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
