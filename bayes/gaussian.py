"""Gaussians N(m, S^-1) as exponential families, in the three covariance shapes BayesADMM uses.

The shape of `precision` says which family it is:
  isotropic  S = s·I       precision is a 0-d tensor s
  diagonal   S = diag(s)   precision is a (P,) vector s
  full       S             precision is a (P, P) symmetric positive-definite matrix
Natural parameters  lambda = (S m, -1/2 S); expectation parameters mu = (m, E[T2]) with
T(theta) = (theta, theta^2) (diagonal), (theta, theta theta^T) (full), (theta, ||theta||^2) (isotropic);
BayesADMM paper Eq. 12 (diagonal) and Eq. 32 (full).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Gaussian:
    mean: torch.Tensor  # (P,)
    precision: torch.Tensor  # (), (P,) or (P, P)

    def __post_init__(self) -> None:
        size = self.mean.shape[0]
        allowed = [(), (size,), (size, size)]
        if self.mean.ndim != 1 or tuple(self.precision.shape) not in allowed:
            raise ValueError(
                f"mean must be (P,) and precision (), (P,) or (P, P); got {tuple(self.mean.shape)}, "
                f"{tuple(self.precision.shape)}"
            )

    @property
    def kind(self) -> str:
        return ("isotropic", "diagonal", "full")[self.precision.ndim]

    def precision_times(self, vector: torch.Tensor) -> torch.Tensor:
        """S v for any of the three precision shapes.

        Args:
            vector: v, (P,).

        Returns:
            S v, (P,).
        """
        return self.precision @ vector if self.precision.ndim == 2 else self.precision * vector

    def natural(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The natural parameters lambda = (S m, -1/2 S).

        Returns:
            S m (P,) and -1/2 S, shaped as `precision`.
        """
        return self.precision_times(self.mean), -0.5 * self.precision

    def expectation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The expectation parameters mu = (m, E[T2]) (the module docstring's T).

        Returns:
            m (P,) and E[T2]: (P, P) for the full family, (P,) for the diagonal one, 0-d for the isotropic one.
        """
        m = self.mean
        if self.kind == "full":
            return m, torch.outer(m, m) + torch.linalg.inv(self.precision)
        if self.kind == "diagonal":
            return m, m.square() + 1.0 / self.precision
        return m, m.square().sum() + m.numel() / self.precision

    def sample(self, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`count` draws, shape (count, P).

        Args:
            count: the number of draws.
            generator: the source of the draws; torch's default where None.

        Returns:
            The draws, (count, P), in the mean's dtype and on its device.
        """
        noise = torch.randn(
            count, self.mean.numel(), generator=generator, dtype=self.mean.dtype, device=self.mean.device
        )
        if self.kind == "full":
            # theta = m + L^-T eps with S = L L^T has covariance S^-1.
            cholesky = torch.linalg.cholesky(self.precision)
            offsets: torch.Tensor = torch.linalg.solve_triangular(cholesky.T, noise.T, upper=True).T
            return self.mean + offsets
        return self.mean + noise / self.precision.sqrt()


def solve(precision: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """S^-1 v for any of the three precision shapes.

    Args:
        precision: S: (), (P,) or (P, P).
        vector: v, (P,).

    Returns:
        S^-1 v, (P,).
    """
    if precision.ndim == 2:
        solution: torch.Tensor = torch.linalg.solve(precision, vector)
        return solution
    return vector / precision


def scaled_identity(like: torch.Tensor, value: float) -> torch.Tensor:
    """value·I in the same shape as the precision `like` (the prior precision delta·I).

    Args:
        like: a precision of the shape wanted: (), (P,) or (P, P).
        value: the scale.

    Returns:
        value·I, shaped as `like`, in its dtype and on its device.
    """
    if like.ndim == 2:
        return value * torch.eye(like.shape[0], dtype=like.dtype, device=like.device)
    return torch.full_like(like, value)


def kl_divergence(q: Gaussian, p: Gaussian) -> float:
    """KL(q ‖ p) = ½ [tr(S_p S_q⁻¹) + (m_p − m_q)ᵀ S_p (m_p − m_q) − P + log|S_q| − log|S_p|] for two Gaussians of the
    same family (precision shape).

    Args:
        q: the first Gaussian.
        p: the second Gaussian, of `q`'s family.

    Returns:
        KL(q ‖ p) in nats.

    Raises:
        ValueError: `q` and `p` are of different families.
    """
    if q.kind != p.kind:
        raise ValueError(f"KL between a {q.kind} and a {p.kind} Gaussian")
    size = q.mean.numel()
    offset = p.mean - q.mean
    if q.kind == "full":
        trace = torch.linalg.solve(q.precision, p.precision).diagonal().sum()  # tr(S_q⁻¹ S_p) = tr(S_p S_q⁻¹)
        log_ratio = torch.linalg.slogdet(q.precision)[1] - torch.linalg.slogdet(p.precision)[1]
    else:  # diagonal, or isotropic (s·I: each of the P entries alike)
        entries = 1 if q.kind == "diagonal" else size
        trace = entries * (p.precision / q.precision).sum()
        log_ratio = entries * (q.precision.log() - p.precision.log()).sum()
    return 0.5 * float((trace + offset @ p.precision_times(offset) - size + log_ratio).item())
