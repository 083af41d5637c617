"""A small federated convex problem with exact local solves (../shared/specs/feddyn-fedlap-splits.md §7):
K = 4 heterogeneous clients, N_k = (10, 10, 20, 40), d = 5 with a bias column; ridge (least squares) or
logistic regression. ℓ_k is the SUM loss over the client's data. Everything in float64 numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIZES = (10, 10, 20, 40)


@dataclass
class Problem:
    kind: str  # "ridge" or "logistic"
    xs: list[np.ndarray]
    ys: list[np.ndarray]

    @property
    def dim(self) -> int:
        return self.xs[0].shape[1]

    @property
    def sizes(self) -> list[int]:
        return [len(y) for y in self.ys]

    def grad(self, k: int, w: np.ndarray) -> np.ndarray:
        x, y = self.xs[k], self.ys[k]
        residual = x @ w - y if self.kind == "ridge" else sigmoid(x @ w) - y
        return x.T @ residual

    def hess(self, k: int, w: np.ndarray) -> np.ndarray:
        x = self.xs[k]
        if self.kind == "ridge":
            return x.T @ x
        p = sigmoid(x @ w)
        return (x * (p * (1 - p))[:, None]).T @ x

    def solve_local(self, k: int, scale: float, weight, anchor: np.ndarray, start: np.ndarray) -> np.ndarray:
        """argmin scale·ℓ_k(w) + ½ Σ_j weight_j (w_j − anchor_j)²  (exact: damped Newton to round-off)."""
        weight = np.broadcast_to(np.asarray(weight, dtype=float), (self.dim,))
        return newton(lambda w: (scale * self.grad(k, w) + weight * (w - anchor),
                                 scale * self.hess(k, w) + np.diag(weight)), start)

    def optimum(self, delta: float) -> np.ndarray:
        """w*(δ) = argmin Σ_k ℓ_k(w) + (δ/2)‖w‖², computed centrally."""
        ks = range(len(self.xs))
        return newton(lambda w: (sum(self.grad(k, w) for k in ks) + delta * w,
                                 sum(self.hess(k, w) for k in ks) + delta * np.eye(self.dim)), np.zeros(self.dim))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def newton(gradient_and_hessian, start: np.ndarray, tolerance: float = 1e-12) -> np.ndarray:
    """Newton's method; halves a step whose gradient norm does not drop (plain Newton can diverge on logistic)."""
    w = start.copy()
    for _ in range(200):
        g, h = gradient_and_hessian(w)
        norm = np.linalg.norm(g)
        if norm < tolerance:
            return w
        step = np.linalg.solve(h, g)
        size = 1.0
        while size > 1e-8 and np.linalg.norm(gradient_and_hessian(w - size * step)[0]) >= norm:
            size /= 2
        w = w - size * step
    return w


def make_problem(kind: str, seed: int = 0) -> Problem:
    rng = np.random.default_rng(seed)
    d = 5
    w_true = rng.normal(size=d)
    xs, ys = [], []
    for size in SIZES:
        shift = rng.normal(0.0, 0.5, size=d)
        x = rng.normal(shift, 1.0, size=(size, d))
        x[:, 0] = 1.0
        w_client = w_true + 0.5 * rng.normal(size=d)  # heterogeneous clients
        if kind == "ridge":
            y = x @ w_client + 0.3 * rng.normal(size=size)
        else:
            y = (rng.random(size) < sigmoid(x @ w_client)).astype(float)
        xs.append(x)
        ys.append(y)
    return Problem(kind, xs, ys)


def relative_error(w: np.ndarray, target: np.ndarray) -> float:
    return float(np.linalg.norm(w - target) / np.linalg.norm(target))
