"""FedPA's math: the shrinkage-covariance delta of App. C, and the mean of the deltas."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch

SampleSink = Callable[[torch.Tensor], None]  # receives one flat posterior sample x_t


class ShrinkageDelta:
    """Δ̂_t = Σ̂_t⁻¹(x_0 - x̄_t), updated online as each sample x_t arrives (App. C, Eqs. 20-28).

    Σ̃_t = I + (t-1)ρ Ŝ_t = Σ̃_{t-1} + γ_t u_t u_tᵀ (Eq. 18) is a rank-1 update, so Sherman-Morrison
    gives Δ̃_t = Σ̃_t⁻¹(x_0 - x̄_t) from Δ̃_{t-1} and the vectors v_{k-1,k} = Σ̃_{k-1}⁻¹ u_k; Σ̂_t = ρ_t Σ̃_t.
    Keeps the t-1 vectors v_{k-1,k} as rows of one matrix, so Eq. 28's t-2 dot products and axpys are
    two matrix-vector products: O(td) per sample, O(ℓ²d) time and O(ℓd) memory in all. Works in the
    dtype and on the device of `x0`, without host syncs. Any-time: `delta()` is valid after every sample.
    `capacity`: the number of samples expected (the buffer grows if more arrive)."""

    def __init__(self, x0: torch.Tensor, shrinkage: float, capacity: int = 8) -> None:
        self.x0 = x0
        self.shrinkage = float(shrinkage)  # ρ
        self.count = 0  # t
        self.mean: torch.Tensor | None = None  # x̄_t
        self.scaled_delta: torch.Tensor | None = None  # Δ̃_t
        self.directions = x0.new_empty((max(capacity - 1, 1), x0.numel()))  # row k-2: v_{k-1,k}, k = 2..t
        self.weights = x0.new_empty(max(capacity - 1, 1))  # row k-2: γ_k / (1 + γ_k u_kᵀ v_{k-1,k})

    def gamma(self, t: int) -> float:
        """γ_t = β_t / t with β_t = (t-1)ρ (Eq. 17).

        Args:
            t: the sample count, >= 1.

        Returns:
            γ_t.
        """
        return self.shrinkage * (t - 1) / t  # γ_t = β_t / t, β_t = (t-1)ρ (Eq. 17)

    @torch.no_grad()
    def add_sample(self, x: torch.Tensor) -> None:
        """Fold one posterior sample x_t into x̄_t and Δ̃_t (Eqs. 21-23, 25, 28).

        Args:
            x: the flat sample x_t, shape and dtype of `x0`.
        """
        self.count += 1
        t = self.count
        if t == 1:
            self.mean = x.clone()
            self.scaled_delta = self.x0 - x  # Eq. 21
            return
        mean, scaled_delta = self.mean, self.scaled_delta
        assert mean is not None and scaled_delta is not None  # set by the first sample
        stored = t - 2
        directions = self.directions[:stored]
        u = x - mean  # Eq. 22
        v = u - directions.T @ (self.weights[:stored] * (directions @ u))  # Eqs. 25, 28: v_{t-1,t} = Σ̃_{t-1}⁻¹ u_t
        gamma = self.gamma(t)
        denominator = 1.0 + gamma * torch.dot(u, v)  # >= 1: Σ̃_{t-1} is positive definite
        # Eq. 23, its coefficient simplified: 1 + γ(t uᵀΔ̃ - uᵀv)/den = (1 + γ t uᵀΔ̃)/den.
        coefficient = (1.0 + gamma * t * torch.dot(u, scaled_delta)) / (denominator * t)
        scaled_delta.sub_(coefficient * v)
        self._store(stored, v, gamma / denominator)
        mean.add_(u, alpha=1.0 / t)  # Eq. 13, only after u_t was used

    def _store(self, row: int, direction: torch.Tensor, weight: torch.Tensor) -> None:
        if row == len(self.directions):  # more samples than the capacity: double it
            self.directions = torch.cat([self.directions, torch.empty_like(self.directions)])
            self.weights = torch.cat([self.weights, torch.empty_like(self.weights)])
        self.directions[row] = direction
        self.weights[row] = weight

    def delta(self) -> torch.Tensor:
        """Δ̂_t = Δ̃_t / ρ_t (Eq. 24).

        Returns:
            Δ̂_t, shape of `x0`.

        Raises:
            ValueError: no sample was added yet.
        """
        if self.scaled_delta is None:  # count 0
            raise ValueError("no posterior sample yet")
        return self.scaled_delta * (1.0 + (self.count - 1) * self.shrinkage)

    def iterate_average_delta(self) -> torch.Tensor:
        """x_0 - x̄_t: the delta with Σ̂ = I (ρ = 0).

        Returns:
            x_0 - x̄_t, shape of `x0`.

        Raises:
            ValueError: no sample was added yet.
        """
        if self.mean is None:  # count 0
            raise ValueError("no posterior sample yet")
        return self.x0 - self.mean


def weighted_mean_delta(deltas: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Alg. 1 line 8 as both official codes compute it: Σ n_i Δ_i / Σ n_i (spec §2.1, pitfall 7).

    Args:
        deltas: the clients' Δ_i, each of the same shape; not empty.
        weights: n_i, one per delta (the clients' example counts).

    Returns:
        The weighted mean delta.
    """
    total = sum(weights)
    # a tensor: 0 + the first weighted delta, ... (the round's accepted replies: never none)
    return cast(torch.Tensor, sum(w / total * delta for w, delta in zip(weights, deltas)))
