"""Problems with closed-form answers, shared by the math tests: a small federated convex problem with exact local
solves (least squares or logistic regression, per client), a ridge problem, Gaussian losses, and FedLap rounds on
the convex problem with exact local solves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedbayes.strategies.fedlap.math import (
    Site,
    cavity,
    client_damping,
    curvature_damping,
    global_from_sites,
    site_step,
)

# K = 4 heterogeneous clients, N_k below; d = 5 with a bias column. ℓ_k is the SUM loss over the client's data.
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
        return newton(
            lambda w: (scale * self.grad(k, w) + weight * (w - anchor), scale * self.hess(k, w) + np.diag(weight)),
            start,
        )

    def optimum(self, delta: float) -> np.ndarray:
        """w*(δ) = argmin Σ_k ℓ_k(w) + (δ/2)‖w‖², computed centrally."""
        ks = range(len(self.xs))
        return newton(
            lambda w: (
                sum(self.grad(k, w) for k in ks) + delta * w,
                sum(self.hess(k, w) for k in ks) + delta * np.eye(self.dim),
            ),
            np.zeros(self.dim),
        )


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


# ---- a ridge problem (BayesADMM) --------------------------------------------------------------------------------
def ridge_problem(clients=3, features=4, per_client=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    data = []
    for k in range(clients):
        x = torch.randn(per_client, features, generator=generator, dtype=torch.float64) + k  # heterogeneous clients
        y = x @ torch.linspace(-1, 1, features, dtype=torch.float64) + 0.3 * torch.randn(
            per_client, generator=generator, dtype=torch.float64
        )
        data.append((x, y))
    return data


# ---- Gaussian losses (DSVGD) ------------------------------------------------------------------------------------
def gaussian_loss_gradient(mean, variance):
    return lambda theta: (theta - mean) / variance


# ---- FedLap on the convex problem ---------------------------------------------------------------------------------
def initial_sites(problem, delta, w0):
    """The consistent init: v_k = δ w_0 / K, V_k = 0, so S_g = δ and w_g = w_0."""
    count = len(problem.sizes)
    return [Site(torch.full_like(w0, delta) * w0 / count, torch.zeros_like(w0)) for _ in range(count)]


def fedlap_round(problem, sites, delta, covariance, server_round=1, curvature_rule=False):
    """One round, every client: exact local solve of ℓ_k + ½(w − m_k)·P_k(w − m_k), H_k = diag Hessian (Cov); the
    paper's ρ_k, or with `curvature_rule` `site-damping-rule=curvature`'s."""
    total, count = sum(problem.sizes), len(problem.sizes)
    global_mean, global_precision = global_from_sites(
        torch.stack([s.mean for s in sites]).sum(0), torch.stack([s.precision for s in sites]).sum(0), delta
    )
    new_sites, locals_, local_precisions = [], [], []
    for k, site in enumerate(sites):
        anchor, precision = cavity(global_mean, global_precision, site, delta)
        local = torch.from_numpy(problem.solve_local(k, 1.0, precision.numpy(), anchor.numpy(), global_mean.numpy()))
        curvature = (
            torch.from_numpy(np.diag(problem.hess(k, local.numpy())).copy()) if covariance else torch.zeros_like(local)
        )
        rho = client_damping(covariance, problem.sizes[k], count, total)
        if curvature_rule:
            rho = curvature_damping(rho, curvature, precision)
        new_sites.append(site_step(site, local, curvature, global_mean, global_precision, rho, server_round))
        locals_.append(local)
        local_precisions.append(curvature - site.precision + global_precision)
    return new_sites, locals_, local_precisions


def run_fedlap(problem, delta, covariance, rounds, seed=0, curvature_rule=False):
    w0 = torch.from_numpy(np.random.default_rng(seed).normal(size=problem.dim))
    sites = initial_sites(problem, delta, w0)
    for server_round in range(1, rounds + 1):
        sites, locals_, _ = fedlap_round(problem, sites, delta, covariance, server_round, curvature_rule)
    mean, precision = global_from_sites(
        torch.stack([s.mean for s in sites]).sum(0), torch.stack([s.precision for s in sites]).sum(0), delta
    )
    return mean, precision, sites, locals_


# ---- an exact sampler (FedPA) --------------------------------------------------------------------------------
@dataclass
class ExactGaussianSampler:
    """`count` exact samples of N(mean, covariance_factor covariance_factorᵀ) (the spec's T3 sampler,
    [C-JAX] ExactQuadraticSampler): the local posterior of a least-squares client, no SGD."""

    mean: torch.Tensor
    covariance_factor: torch.Tensor  # L with Σ_i = L Lᵀ
    count: int
    generator: torch.Generator

    def __call__(self, emit: Callable[[torch.Tensor], None]) -> None:
        for _ in range(self.count):
            noise = torch.randn(self.mean.numel(), generator=self.generator, dtype=self.mean.dtype)
            emit(self.mean + self.covariance_factor @ noise)
