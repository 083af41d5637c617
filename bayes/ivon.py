"""IVON with a prior mean, a per-parameter prior precision and BayesADMM's Lagrange terms.

ivon-opt's IVON (Shen et al., 2024) minimises  ess·E_q[loss(theta)] + KL(q || N(0, 1/(ess·wd))).
BayesADMM's client subproblem (paper Eq. 30, Alg. 2) needs

    ess·E_q[ loss(theta) + v^T theta - 1/2 theta^T (u theta) ] + KL(q || N(m_p, 1/(ess·delta)))

with delta and m_p per parameter. We keep IVON's sampling, gradient averaging and state handling and
replace only its update (Alg. 2, lines 3, 5 and 6). All terms are per unit of `ess`, like IVON's
gradient of the *mean* minibatch loss: divide sum-loss quantities by `ess`.

Two implementations of one step, as torch.optim.Adam has (`foreach`): the single-tensor path works on IVON's flat
vectors (ivon-opt's own layout: the parameters and gradients concatenated every step); the multi-tensor path works on
the lists of parameter tensors, their gradients and views of the flat state with `torch._foreach_*` kernels and fused
updates (lerp, addcmul), so a GPU launches one kernel per list where the other launches several per tensor. They agree
to float32 round-off (tests/unit/test_bayes_ivon.py).

IVON's h0 and β2 for data the paper never saw (`hessian_init`, `hessian_momentum`; run config hess-init = 0,
beta2 = 0): the paper's values (h0 = 1e-3, β2 = 0.9998) are tuned for its FMNIST-10% client, and both depend on the
client's data and its steps a round.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from math import isfinite, pow
from typing import Any

import ivon
import torch
from torch import Tensor
from torch.optim.optimizer import ParamsT

from fedbayes.bayes.params import TensorList, parameter_views, uses_multi_tensor

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

    Args:
        steps_per_round: T, the optimizer steps the client takes a round, >= 1.

    Returns:
        β2 = 0.9998^(190 / T).

    Raises:
        ValueError: `steps_per_round` is below 1.
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
    0.093), and steps of 270 x the gradient turned its weights to NaN in the first round.

    Args:
        diag_ggn_sum: the diagonal GGN summed over `examples` examples, one entry per parameter.
        examples: the number of examples the sum is over, >= 1.

    Returns:
        h0, per unit of ess.

    Raises:
        ValueError: `examples` is below 1, or the derived h0 is not a positive finite number (no curvature).
    """
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
    (measured: raising it to 1x the weights took FMNIST's ECE from 0.08 to 0.18).

    Args:
        curvature_h0: the h0 of the curvature rule, per unit of ess.
        weights: q̄'s mean, flat.
        ess: IVON's effective sample size, > 0.

    Returns:
        `curvature_h0`, or the smaller h0 1 / (ess · mean(w²)) where the curvature rule's is over the bound.

    Raises:
        ValueError: `ess` is not positive, or the weights' mean square is not a positive finite number.
    """
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
    off on digits, round 3). Zero leaves the new prior's precision there.

    Args:
        hess: the carried Hessian estimate h, per unit of ess, flat.
        prior_precision: the new prior's δ, per unit of ess, shape of `hess`.

    Returns:
        h where h + δ > 0, else 0, shape of `hess`.
    """
    return torch.where(hess + prior_precision > 0, hess, torch.zeros_like(hess))


# ---- the step's math: one function per line of Alg. 2, single-tensor (flat vectors) and multi-tensor (lists) ---------
def momentum_step(momentum: Tensor, grad: Tensor, beta1: float) -> Tensor:
    """IVON's gradient momentum, β1 g + (1 - β1) ĝ (ivon-opt's own update).

    Args:
        momentum: the gradient momentum g, flat.
        grad: the mean gradient at the samples ĝ, shape of `momentum`.
        beta1: β1, in [0, 1).

    Returns:
        The new momentum, shape of `momentum`.
    """
    return beta1 * momentum + (1.0 - beta1) * grad


def hessian_sample(nll_hess: Tensor, ess: float, dual_quadratic: Tensor) -> Tensor:
    """Alg. 2 line 3: ĥ = g·(θ - m)/σ² - u, from IVON's estimate of the loss's Hessian (`nll_hess`, per example:
    Price's g·(θ - m)·(h + δ), or g² for `hess_approx` "gradsq").

    Args:
        nll_hess: IVON's estimate of the loss's Hessian per example, flat.
        ess: IVON's effective sample size.
        dual_quadratic: u, per unit of ess, shape of `nll_hess`.

    Returns:
        ĥ, shape of `nll_hess`.
    """
    return nll_hess * ess - dual_quadratic


def hessian_step(hess: Tensor, sample: Tensor, delta: Tensor, beta2: float) -> Tensor:
    """Alg. 2 line 5: IVON's Hessian update, which keeps h + δ > 0.

    Args:
        hess: the Hessian estimate h, per unit of ess, flat.
        sample: ĥ from `hessian_sample`, shape of `hess`.
        delta: the prior precision δ, per unit of ess, shape of `hess`.
        beta2: β2, in [0, 1).

    Returns:
        The new h, shape of `hess`.
    """
    return beta2 * hess + (1.0 - beta2) * sample + 0.5 * (1.0 - beta2) ** 2 * (hess - sample).square() / (hess + delta)


def mean_step(
    mean: Tensor,
    momentum: Tensor,
    debias: float,
    terms: Mapping[str, Tensor],
    hess: Tensor,
    lr: Tensor | float,
    clip_radius: float,
) -> Tensor:
    """Alg. 2 line 6: m <- m - lr (g + v - u m + δ (m - m_p)) / (h + δ), the direction clipped to ±`clip_radius`.
    `terms`: the group's prior and Lagrange terms (weight_decay δ, prior_mean m_p, dual_linear v, dual_quadratic u).

    Args:
        mean: the posterior mean m, flat.
        momentum: the gradient momentum g, shape of `mean`.
        debias: the momentum's debiasing divisor, 1 - β1^t (1 without debiasing).
        terms: flat vectors, shape of `mean`, under the names of `TERMS`.
        hess: the Hessian estimate h, per unit of ess, shape of `mean`.
        lr: the step size, a scalar or per parameter (IVON's rescale_lr).
        clip_radius: the bound on each entry of the direction (inf: no clipping).

    Returns:
        The new mean, shape of `mean`.
    """
    delta = terms["weight_decay"]
    direction = (
        momentum / debias + terms["dual_linear"] - terms["dual_quadratic"] * mean + delta * (mean - terms["prior_mean"])
    ) / (hess + delta)
    return mean - lr * direction.clamp(-clip_radius, clip_radius)


def foreach_momentum_step_(momenta: TensorList, grads: TensorList, beta1: float) -> None:
    """`momentum_step` in place, as one lerp: g + (1 - β1)(ĝ - g).

    Args:
        momenta: the gradient momentum g, one tensor per parameter; updated in place.
        grads: the mean gradients at the samples ĝ, shapes of `momenta`.
        beta1: β1, in [0, 1).
    """
    torch._foreach_lerp_(momenta, grads, 1.0 - beta1)


def foreach_hessian_gap(
    hess: TensorList,
    nll_hess: TensorList,
    scale: TensorList | None,
    ess: float,
    dual_quadratic: TensorList,
) -> TensorList:
    """h - ĥ of Alg. 2 line 3, = h + u - ess·nll_hess·scale (`scale`: h + δ for Price's estimate, None for g²).

    Args:
        hess: the Hessian estimate h, per unit of ess, one tensor per parameter.
        nll_hess: the mean products g·(θ - m) (Price) or g² at the samples, per example, shapes of `hess`.
        scale: h + δ per parameter for Price's estimate, None for g².
        ess: IVON's effective sample size.
        dual_quadratic: u, per unit of ess, shapes of `hess`.

    Returns:
        h - ĥ, a new list, shapes of `hess`.
    """
    gap = torch._foreach_add(hess, dual_quadratic)
    if scale is None:
        torch._foreach_add_(gap, nll_hess, alpha=-ess)
    else:
        torch._foreach_addcmul_(gap, nll_hess, scale, value=-ess)
    return gap


def foreach_hessian_step_(hess: TensorList, gap: TensorList, hess_plus_delta: TensorList, beta2: float) -> None:
    """`hessian_step` in place, from the gap h - ĥ: h - (1 - β2)(h - ĥ) + ½(1 - β2)²(h - ĥ)²/(h + δ).

    Args:
        hess: the Hessian estimate h, one tensor per parameter; updated in place.
        gap: h - ĥ from `foreach_hessian_gap`, shapes of `hess`.
        hess_plus_delta: h + δ before the step, shapes of `hess`.
        beta2: β2, in [0, 1).
    """
    torch._foreach_addcmul_(hess, gap, torch._foreach_div(gap, hess_plus_delta), value=0.5 * (1.0 - beta2) ** 2)
    torch._foreach_add_(hess, gap, alpha=-(1.0 - beta2))


def foreach_mean_step_(
    means: TensorList,
    momenta: TensorList,
    debias: float,
    terms: Mapping[str, TensorList],
    hess: TensorList,
    lr: float,
    lr_scale: TensorList | None,
    clip_radius: float,
) -> None:
    """`mean_step` in place; the step size is `lr`, times `lr_scale` elementwise where given (IVON's rescale_lr).

    Args:
        means: the parameters (the posterior mean m); updated in place.
        momenta: the gradient momentum g, shapes of `means`.
        debias: the momentum's debiasing divisor, 1 - β1^t (1 without debiasing).
        terms: lists shaped as `means`, under the names of `TERMS`.
        hess: the Hessian estimate h, per unit of ess, shapes of `means`.
        lr: the step size.
        lr_scale: per-entry factors on `lr`, shapes of `means`, or None.
        clip_radius: the bound on each entry of the direction (inf: no clipping).
    """
    delta = terms["weight_decay"]
    direction = torch._foreach_add(terms["dual_linear"], momenta, alpha=1.0 / debias)
    torch._foreach_addcmul_(direction, terms["dual_quadratic"], means, value=-1.0)
    torch._foreach_addcmul_(direction, delta, torch._foreach_sub(means, terms["prior_mean"]))
    torch._foreach_div_(direction, torch._foreach_add(hess, delta))
    if isfinite(clip_radius):  # the single-tensor path's clamp to ±inf changes no number
        torch._foreach_clamp_min_(direction, -clip_radius)
        torch._foreach_clamp_max_(direction, clip_radius)
    if lr_scale is None:
        torch._foreach_add_(means, direction, alpha=-lr)
    else:
        torch._foreach_addcmul_(means, lr_scale, direction, value=-lr)


def foreach_running_mean(mean: TensorList | None, sample: TensorList, count: int) -> TensorList:
    """The mean of `count` samples, `sample` the last (ivon-opt's Welford mean), as a new list: the caller may change
    its gradients in place later (gradient clipping), and IVON's single-tensor path copies them too.

    Args:
        mean: the mean of the first `count` - 1 samples, or None before the first.
        sample: the latest sample, one tensor per parameter.
        count: the number of samples including `sample`, >= 1.

    Returns:
        The running mean, a new list shaped as `sample`.
    """
    if mean is None:
        return torch._foreach_mul(sample, 1.0)
    step = torch._foreach_sub(sample, mean)
    torch._foreach_div_(step, float(count))
    torch._foreach_add_(step, mean)
    return step


def sampled_gradient(parameter: Tensor) -> Tensor:
    """A parameter's gradient at the sample, as ivon-opt takes it: 0 for one that requires none.

    Args:
        parameter: a parameter, after the backward pass at the sampled weights.

    Returns:
        Its gradient, or zeros of its shape where it requires none.

    Raises:
        ValueError: a parameter that requires a gradient has none (the loss does not reach it)."""
    if not parameter.requires_grad:
        return torch.zeros_like(parameter)
    if parameter.grad is None:
        raise ValueError(f"a parameter of shape {tuple(parameter.shape)} has no gradient at the sampled weights")
    return parameter.grad


# The group's flat vectors the step reads: δ, m_p, v and u, per parameter (IVON's own: momentum, hess).
TERMS = ("weight_decay", "prior_mean", "dual_linear", "dual_quadratic")


class IVONWithPrior(ivon.IVON):
    """IVON with a prior N(m_p, 1/(ess·δ)) per parameter and BayesADMM's Lagrange terms v, u (Alg. 2); the prior,
    Lagrange and posterior accessors take one parameter group.

    Args:
        params: the model's parameters, all on one device and of one dtype.
        lr, ess, hess_init, beta1, beta2, mc_samples, hess_approx, clip_radius, debias, rescale_lr: IVON's.
        prior_precision: δ, the prior's precision per unit of ess, until `set_prior`.
        foreach: the multi-tensor path (True), the single-tensor one (False), or None: multi-tensor on CUDA, the
            single-tensor path elsewhere (`fedbayes.bayes.params.uses_multi_tensor`).

    Raises:
        ValueError: for IVON's invalid arguments.

    The step (`step`, after the gradients at `sampled_params`), with g the gradient momentum, h the Hessian estimate:

        g <- β1 g + (1 - β1) ĝ                                          ĝ: the mean gradient at the samples
        ĥ  = ess · ĝ·(θ - m)·(h + δ) - u                                 Alg. 2 line 3 (Price's estimate)
        h <- β2 h + (1 - β2) ĥ + ½ (1 - β2)² (h - ĥ)² / (h + δ)          line 5
        m <- m - lr · clip((g / (1 - β1^t) + v - u m + δ (m - m_p)) / (h + δ))   line 6

    and a sample is θ = m + ε / sqrt(ess (h + δ)), ε ~ N(0, I): the same draws on both paths.
    """

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
        foreach: bool | None = None,
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
        self.foreach = uses_multi_tensor(foreach, self._device)
        # The multi-tensor path's views of the flat vectors, per (group, name): rebuilt when a setter replaces one.
        self._views: dict[tuple[int, str], tuple[Tensor, list[Tensor]]] = {}
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
        """Prior N(mean, diag(precision)^-1); `precision` in absolute units (= ess·delta).

        Args:
            mean: m_p, flat in parameter order.
            precision: the prior's precision ess·δ, flat in parameter order.

        Raises:
            ValueError: more than one parameter group, or a vector's length is not the parameter count.
        """
        group = self._group
        group["prior_mean"] = self._as_flat(mean)
        group["weight_decay"] = self._as_flat(precision) / group["ess"]
        group["hess"] = hessian_under_prior(group["hess"], group["weight_decay"])

    def set_lagrange(self, dual_linear: Tensor, dual_quadratic: Tensor) -> None:
        """v and u of Eq. 30, per unit of ess.

        Args:
            dual_linear: v, per unit of ess, flat in parameter order.
            dual_quadratic: u, per unit of ess, flat in parameter order.

        Raises:
            ValueError: more than one parameter group, or a vector's length is not the parameter count.
        """
        self._group["dual_linear"] = self._as_flat(dual_linear)
        self._group["dual_quadratic"] = self._as_flat(dual_quadratic)

    def posterior(self) -> tuple[Tensor, Tensor]:
        """(mean, precision) of q, precision = ess·(h + delta).

        Returns:
            q's mean and precision, each flat in parameter order.

        Raises:
            ValueError: the optimizer has more than one parameter group.
        """
        group = self._group
        mean = torch.cat([p.detach().flatten() for p in group["params"]])
        return mean, group["ess"] * (group["hess"] + group["weight_decay"])

    def set_posterior(self, mean: Tensor, precision: Tensor) -> None:
        """Set q to N(mean, diag(precision)^-1): the parameters to `mean`, h to precision/ess - delta.

        Args:
            mean: q's mean, flat in parameter order.
            precision: q's precision ess·(h + δ), flat in parameter order.

        Raises:
            ValueError: more than one parameter group, or a vector's length is not the parameter count.
        """
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
        from in a later optimizer (a BayesADMM client keeps them in its durable state between rounds).

        Returns:
            "momentum" and "hess" (flat, per unit of ess) and "step" (a 1-element tensor), copies on the CPU.

        Raises:
            ValueError: the optimizer has more than one parameter group.
        """
        group = self._group
        return {  # copies: the multi-tensor path changes its vectors in place
            "momentum": group["momentum"].to("cpu", copy=True),
            "hess": group["hess"].to("cpu", copy=True),
            "step": torch.tensor([self.current_step]),
        }

    def carry_on(self, state: Mapping[str, Tensor]) -> None:
        """Continue from an earlier optimizer's `carried_state()`, under this optimizer's prior (`set_prior` first:
        the carried h is kept where h + δ > 0, `hessian_under_prior`).

        Args:
            state: an earlier optimizer's `carried_state()`.

        Raises:
            ValueError: the optimizer has more than one parameter group.
        """
        group = self._group
        # a copy: the multi-tensor path updates it in place, and the caller's tensor is its durable state
        group["momentum"] = state["momentum"].to(self._device, self._dtype, copy=True)
        group["hess"] = hessian_under_prior(state["hess"].to(self._device, self._dtype), group["weight_decay"])
        self.current_step = int(state["step"].item())

    # ---- the step ------------------------------------------------------------------------------------------------
    @contextmanager
    def sampled_params(self, train: bool = False) -> Iterator[None]:
        """The parameters at one sample θ = m + ε / sqrt(ess (h + δ)) inside the block, the mean after it; with
        `train`, the gradients there join the step's averages.

        Args:
            train: whether the gradients at the sample join the step's averages.

        Yields:
            None, once: the block runs with the parameters at the sample.

        Raises:
            ValueError: with `train` on the multi-tensor path, a parameter that requires a gradient has none.
        """
        if not self.foreach:
            with super().sampled_params(train):
                yield
            return
        means, noise = self._foreach_sample()
        yield
        self._foreach_restore(train, means, noise)

    @torch.no_grad()
    def _update(self) -> None:
        if self.foreach:
            self._foreach_update()
        else:
            self._single_tensor_update()

    def _single_tensor_update(self) -> None:
        self.current_step += 1
        offset = 0
        for group in self.param_groups:
            window = slice(offset, offset + group["numel"])
            delta = group["weight_decay"]
            mean = torch.cat([p.flatten() for p in group["params"] if p is not None])
            group["momentum"] = momentum_step(group["momentum"], self.state["avg_grad"][window], group["beta1"])
            nll_hess = self._get_nll_hess(
                self.hess_approx, group["hess"] + delta, self.state["avg_nxg"], self.state["avg_gsq"], window
            )
            sample = hessian_sample(nll_hess, group["ess"], group["dual_quadratic"])
            group["hess"] = hessian_step(group["hess"], sample, delta, group["beta2"])
            lr = group["lr"] * (group["hess_init"] + delta) if self.rescale_lr else group["lr"]
            terms = {name: group[name] for name in TERMS}
            mean = mean_step(
                mean, group["momentum"], self._debias(group), terms, group["hess"], lr, group["clip_radius"]
            )
            group_offset = 0
            for p in group["params"]:
                if p is not None:
                    p.data = mean[group_offset : group_offset + p.numel()].view(p.shape)
                    group_offset += p.numel()
            offset += group["numel"]

    def _debias(self, group: dict[str, Any]) -> float:
        return 1.0 - pow(group["beta1"], float(self.current_step)) if self.debias else 1.0

    # ---- the multi-tensor path: lists of parameters, gradients and views of the flat vectors -----------------------
    def _parameters(self, group: dict[str, Any]) -> list[Tensor]:
        return [p for p in group["params"] if p is not None]

    def _views_of(self, index: int, name: str) -> list[Tensor]:
        group = self.param_groups[index]
        flat = group[name]
        cached = self._views.get((index, name))
        if cached is None or cached[0] is not flat:
            cached = (flat, parameter_views(flat, self._parameters(group)))
            self._views[(index, name)] = cached
        return cached[1]

    def _foreach_sample(self) -> tuple[list[list[Tensor]], list[list[Tensor]]]:
        """Each group's means (the parameters' own tensors, kept) and noise ε / sqrt(ess (h + δ)), drawn as one
        vector per group as ivon-opt draws it; the parameters hold m + noise until `_foreach_restore`."""
        means, noises = [], []
        for group in self.param_groups:
            parameters = self._parameters(group)
            noise = torch.randn(group["numel"], device=self._device, dtype=self._dtype)
            noise.div_((group["hess"] + group["weight_decay"]).mul_(group["ess"]).sqrt_())
            noise_views = parameter_views(noise, parameters)
            group_means = [p.data for p in parameters]
            for p, sampled in zip(parameters, torch._foreach_add(group_means, noise_views)):
                p.data = sampled
            means.append(group_means)
            noises.append(noise_views)
        return means, noises

    def _foreach_restore(self, train: bool, means: list[list[Tensor]], noises: list[list[Tensor]]) -> None:
        grads: list[Tensor] = []
        products: list[Tensor] = []
        for group, group_means, noise in zip(self.param_groups, means, noises):
            parameters = self._parameters(group)
            for p, mean in zip(parameters, group_means):
                p.data = mean
            if train:
                group_grads = [sampled_gradient(p) for p in parameters]
                grads += group_grads
                if self.hess_approx == "price":
                    products += torch._foreach_mul(noise, group_grads)
                else:
                    products += torch._foreach_mul(group_grads, group_grads)
        if not train:
            return
        count = self.state["count"] + 1
        self.state["count"] = count
        self.state["avg_grad"] = foreach_running_mean(self.state["avg_grad"], grads, count)
        self.state["avg_nll_hess"] = (
            products if count == 1 else foreach_running_mean(self.state["avg_nll_hess"], products, count)
        )

    def _reset_samples(self) -> None:
        super()._reset_samples()
        self.state["avg_nll_hess"] = None  # the multi-tensor path's g·(θ - m) (Price) or g² per parameter

    def _foreach_update(self) -> None:
        self.current_step += 1
        offset = 0
        for index, group in enumerate(self.param_groups):
            parameters = self._parameters(group)
            window = slice(offset, offset + len(parameters))
            grads, nll_hess = self.state["avg_grad"][window], self.state["avg_nll_hess"][window]
            momenta, hess = self._views_of(index, "momentum"), self._views_of(index, "hess")
            terms = {name: self._views_of(index, name) for name in TERMS}
            foreach_momentum_step_(momenta, grads, group["beta1"])
            hess_plus_delta = torch._foreach_add(hess, terms["weight_decay"])
            scale = hess_plus_delta if self.hess_approx == "price" else None
            gap = foreach_hessian_gap(hess, nll_hess, scale, group["ess"], terms["dual_quadratic"])
            foreach_hessian_step_(hess, gap, hess_plus_delta, group["beta2"])
            lr_scale = torch._foreach_add(terms["weight_decay"], group["hess_init"]) if self.rescale_lr else None
            foreach_mean_step_(
                parameters, momenta, self._debias(group), terms, hess, group["lr"], lr_scale, group["clip_radius"]
            )
            offset += len(parameters)
