"""IVON with a prior mean, a per-parameter prior precision and BayesADMM's Lagrange terms.

ivon-opt's IVON (Shen et al., 2024) minimises  ess·E_q[loss(theta)] + KL(q || N(0, 1/(ess·wd))).
BayesADMM's client subproblem (paper Eq. 30, Alg. 2) needs

    ess·E_q[ loss(theta) + v^T theta - 1/2 theta^T (u theta) ] + KL(q || N(m_p, 1/(ess·delta)))

with delta and m_p per parameter. We keep IVON's sampling, gradient averaging and state handling and
replace only its update (Alg. 2, lines 3, 5 and 6). All terms are per unit of `ess`, like IVON's
gradient of the *mean* minibatch loss: divide sum-loss quantities by `ess`.

IVON's h0 and β2 for data the paper never saw (`hessian_init`, `hessian_momentum`; run config hess-init = 0,
beta2 = 0): the paper's values (h0 = 1e-3, β2 = 0.9998) are tuned for its FMNIST-10% client, and both depend on the
client's data and its steps a round.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import isfinite, pow
from typing import Any

import ivon
import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

# The paper's FMNIST-10% client (Möllenhoff et al., App. G.2; the authors' configs/fmnist_*/fedivon.yaml): IVON's
# Hessian momentum over one round of 10 epochs x ceil(600 / 32) = 190 steps, and h0 = 1e-3 on raw 0-255 pixels, twice
# the mean diagonal GGN per example of its MLP (784-200-100-10 sigmoid) at PyTorch's initial weights (4.4e-4 to 5.1e-4).
REFERENCE_BETA2 = 0.9998
REFERENCE_STEPS = 190
HESS_INIT_PER_GGN = 2.0
# The widest first posterior, in root-mean-square weights, that the curvature rule's h0 may give (above: the weights').
MAX_INITIAL_WIDTH = 3.0


def hessian_momentum(steps_per_round: int) -> float:
    """IVON's β2 for a client that takes `steps_per_round` steps a round: the one under which a round's Hessian
    samples get the weight they get in the paper's round, 1 - β2^T = 1 - 0.9998^190 = 3.7%.

    Why it must depend on T: the BayesADMM client starts every round at q̄ (`reset-posterior`), so its data Hessian
    h starts at 0 and ends at (1 - β2^T) times the round's estimate; its local precision is S̄ + ess·h. The server
    step S̄ <- (1 - α) Mean(S_k) + α (δ + Σ U_k) (Eq. 37) then shrinks S̄ by the factor 1 - α every round where
    ess·h is small, and IVON's step on the mean, lr / (S̄ / ess), grows until training diverges. With 0.9998 and
    5 steps a round (a client of 140 examples, 1 epoch of 32), 1 - β2^T is 0.1%: measured on breast_cancer, S̄'s
    median fell from 268 to 6.3 in 10 rounds and the training loss rose from 0.06 to 3.95.
    """
    if steps_per_round < 1:
        raise ValueError(f"steps_per_round must be >= 1, got {steps_per_round}")
    return pow(REFERENCE_BETA2, REFERENCE_STEPS / steps_per_round)


def hessian_init(diag_ggn_sum: Tensor, examples: int) -> float:
    """IVON's h0 from the data: HESS_INIT_PER_GGN x the mean over parameters of the diagonal GGN per example
    (`diag_ggn_sum`: bayes/curvature.py's diag_ggn over `examples` examples).

    IVON's first steps on the mean are lr / (h0 + δ) times the gradient: 1 x the gradient with the paper's
    lr = h0 = 1e-3 on its data, and 0.05-0.13 x on standardised tabular features, whose curvature is 8-19x the
    paper's (a fixed 1e-3 made those steps too long and the first posterior too wide). Not for networks whose
    parameters are mostly of low curvature: cnn-zenke's mean at its initial weights is 1.9e-6 (its largest entry
    0.093), and steps of 270 x the gradient turned its weights to NaN in the first round."""
    if examples < 1:
        raise ValueError(f"examples must be >= 1, got {examples}")
    derived = HESS_INIT_PER_GGN * float(diag_ggn_sum.mean()) / examples
    if not derived > 0.0 or not isfinite(derived):  # a flat loss (every output saturated), or NaN weights
        raise ValueError(f"no curvature to derive IVON's h0 from (diagonal GGN: {derived}): set hess-init > 0")
    return derived


def hessian_init_within_weights(curvature_h0: float, weights: Tensor, ess: float) -> float:
    """`curvature_h0` (from `hessian_init`), unless IVON's first posterior under it would be over
    MAX_INITIAL_WIDTH times as wide as the weights it starts from (`weights`: q̄'s mean, flat): then the h0 under
    which its standard deviation equals their root mean square, 1 / (ess · mean(w²)).

    Why: the curvature rule knows nothing of the weights' scale. Where most parameters have low curvature
    (cnn-zenke at its initial weights: mean diagonal GGN 1.6e-6; a client of 2,000 examples, ess 1e7), its first
    posterior's standard deviation is 11x the weights'; the sampled networks are noise and training turned to NaN
    in round 1. MLPs stay within the bound: standardised tabular features about 0.1-0.3x, the sigmoid MLP on [0, 1]
    pixels 1-3x for its 10 FMNIST-10% clients (none bounded), and there the curvature rule's h0 is the better one
    (measured: raising it to 1x the weights took FMNIST's ECE from 0.08 to 0.18)."""
    if ess <= 0.0:
        raise ValueError(f"ess must be > 0, got {ess}")
    mean_square = float(weights.double().square().mean())
    if not mean_square > 0.0 or not isfinite(mean_square):
        raise ValueError(f"no weight scale to bound IVON's h0 by (mean square {mean_square}): set hess-init > 0")
    width_one = 1.0 / (ess * mean_square)
    return width_one if width_one > MAX_INITIAL_WIDTH**2 * curvature_h0 else curvature_h0


def hessian_under_prior(hess: Tensor, prior_precision: Tensor) -> Tensor:
    """A carried Hessian estimate h under a new prior δ (per unit of ess): h where h + δ > 0, else 0.

    IVON keeps h + δ > 0 for the δ it ran under (Alg. 2 line 5), and h itself may be negative where the dual's
    -u outweighs the data (ĥ = g·(θ - m)/σ² - u, Alg. 2 line 3). A client that carries h into a round whose prior
    δ' = S̄'/ess is smaller there would sample with a negative variance: NaN weights (measured, `reset-posterior`
    off on digits, round 3). Zero leaves the new prior's precision there."""
    return torch.where(hess + prior_precision > 0, hess, torch.zeros_like(hess))


class IVONWithPrior(ivon.IVON):
    def __init__(
        self,
        params: ParamsT,
        lr: float,
        ess: float,
        prior_precision: float = 1e-4,
        hess_init: float = 1.0,
        beta1: float = 0.9,
        beta2: float = 0.99999,
        mc_samples: int = 1,
        hess_approx: str = "price",
        clip_radius: float = float("inf"),
        debias: bool = True,
        rescale_lr: bool = True,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            ess=ess,
            hess_init=hess_init,
            beta1=beta1,
            beta2=beta2,
            weight_decay=prior_precision,
            mc_samples=mc_samples,
            hess_approx=hess_approx,
            clip_radius=clip_radius,
            debias=debias,
            rescale_lr=rescale_lr,
        )
        for group in self.param_groups:
            # IVON's `weight_decay` is delta; a per-parameter vector works wherever IVON uses it.
            group["weight_decay"] = self._flat(group, prior_precision)
            group["prior_mean"] = self._flat(group, 0.0)
            group["dual_linear"] = self._flat(group, 0.0)  # v
            group["dual_quadratic"] = self._flat(group, 0.0)  # u

    def _flat(self, group: dict[str, Any], value: float) -> Tensor:
        return torch.full((group["numel"],), float(value), device=self._device, dtype=self._dtype)

    @property
    def _group(self) -> dict[str, Any]:
        if len(self.param_groups) != 1:
            raise ValueError("the posterior/prior accessors assume a single parameter group")
        group: dict[str, Any] = self.param_groups[0]
        return group

    def _as_flat(self, value: Tensor) -> Tensor:
        value = value.detach().flatten().to(self._device, self._dtype)
        if value.numel() != self._numel:
            raise ValueError(f"expected {self._numel} values, got {value.numel()}")
        return value.clone()

    # ---- prior, Lagrange terms, posterior: all flat vectors in parameter order -----------------
    def set_prior(self, mean: Tensor, precision: Tensor) -> None:
        """Prior N(mean, diag(precision)^-1); `precision` in absolute units (= ess·delta)."""
        group = self._group
        group["prior_mean"] = self._as_flat(mean)
        group["weight_decay"] = self._as_flat(precision) / group["ess"]
        group["hess"] = hessian_under_prior(group["hess"], group["weight_decay"])

    def set_lagrange(self, dual_linear: Tensor, dual_quadratic: Tensor) -> None:
        """v and u of Eq. 30, per unit of ess."""
        self._group["dual_linear"] = self._as_flat(dual_linear)
        self._group["dual_quadratic"] = self._as_flat(dual_quadratic)

    def posterior(self) -> tuple[Tensor, Tensor]:
        """(mean, precision) of q, precision = ess·(h + delta)."""
        group = self._group
        mean = torch.cat([p.detach().flatten() for p in group["params"]])
        return mean, group["ess"] * (group["hess"] + group["weight_decay"])

    def set_posterior(self, mean: Tensor, precision: Tensor) -> None:
        group = self._group
        mean = self._as_flat(mean)
        group["hess"] = self._as_flat(precision) / group["ess"] - group["weight_decay"]
        offset = 0
        for p in group["params"]:
            p.data = mean[offset : offset + p.numel()].view(p.shape).clone()
            offset += p.numel()

    # ---- what carries over from one round's optimizer to the next ------------------------------------------------
    def carried_state(self) -> dict[str, Tensor]:
        """The gradient momentum, the Hessian estimate and the step count, on the CPU: what `carry_on` continues
        from in a later optimizer (a BayesADMM client keeps them in its durable state between rounds)."""
        group = self._group
        return {
            "momentum": group["momentum"].cpu(),
            "hess": group["hess"].cpu(),
            "step": torch.tensor([self.current_step]),
        }

    def carry_on(self, state: Mapping[str, Tensor]) -> None:
        """Continue from an earlier optimizer's `carried_state()`, under this optimizer's prior (`set_prior` first:
        the carried h is kept where h + δ > 0, `hessian_under_prior`)."""
        group = self._group
        group["momentum"] = state["momentum"].to(self._device, self._dtype)
        group["hess"] = hessian_under_prior(state["hess"].to(self._device, self._dtype), group["weight_decay"])
        self.current_step = int(state["step"].item())

    @torch.no_grad()
    def _update(self) -> None:
        self.current_step += 1
        offset = 0
        for group in self.param_groups:
            window = slice(offset, offset + group["numel"])
            beta1, beta2, delta = group["beta1"], group["beta2"], group["weight_decay"]
            mean = torch.cat([p.flatten() for p in group["params"] if p is not None])
            group["momentum"] = self._new_momentum(self.state["avg_grad"][window], group["momentum"], beta1)
            hess = group["hess"]
            # Alg. 2 line 3: h_hat = g·(theta - m)/sigma^2 - u
            hess_sample = (
                self._get_nll_hess(self.hess_approx, hess + delta, self.state["avg_nxg"], self.state["avg_gsq"], window)
                * group["ess"]
                - group["dual_quadratic"]
            )
            # line 5: IVON's Hessian update, which keeps h + delta > 0
            hess = (
                beta2 * hess
                + (1.0 - beta2) * hess_sample
                + 0.5 * (1.0 - beta2) ** 2 * (hess - hess_sample).square() / (hess + delta)
            )
            group["hess"] = hess
            # line 6: m <- m - lr (g + v - u m + delta (m - m_p)) / (h + delta)
            lr = group["lr"] * (group["hess_init"] + delta) if self.rescale_lr else group["lr"]
            debias = 1.0 - pow(beta1, float(self.current_step)) if self.debias else 1.0
            direction = (
                group["momentum"] / debias
                + group["dual_linear"]
                - group["dual_quadratic"] * mean
                + delta * (mean - group["prior_mean"])
            ) / (hess + delta)
            mean = mean - lr * direction.clamp(-group["clip_radius"], group["clip_radius"])
            group_offset = 0
            for p in group["params"]:
                if p is not None:
                    p.data = mean[group_offset : group_offset + p.numel()].view(p.shape)
                    group_offset += p.numel()
            offset += group["numel"]
