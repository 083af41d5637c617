"""BayesADMM's math, shared by both halves: the dual step, the server step, the client's Newton step, bounded
influence, forgetting (by the client's share of q̄, at the fixed point, and by redoing the last server step without
the client), and how a family's precision is shaped on the wire."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from fedbayes.bayes.gaussian import Gaussian, scaled_identity, solve
from fedbayes.bayes.params import TensorLayout, Tensors, flatten, unflatten
from fedbayes.bayes.robust import part_clip_factors

COLLAPSE_SHARE = 0.01  # clients adding under 1% to q̄'s precision: it collapses towards δ (measured, data.md)
DUAL_CHECK_RTOL = 1e-5  # per entry, of the magnitudes that make it: float32 transport rounds each to ~6e-8


FAMILIES = ("diagonal", "isotropic", "full")  # the shape of a precision (bayes/gaussian.py)


@dataclass
class Duals:
    mean: torch.Tensor  # v_k, shaped like a mean
    precision: torch.Tensor  # U_k, shaped like the family's precision
    round: int = 0  # last round these duals were updated in


@dataclass
class LocalPosterior:
    """Client k's local posterior q_k = N(m_k, S_k⁻¹) as the server step of its last accepted round used it (moved
    towards q̄ where the `clip` rule moved it), and that round: what `server_natural_without` redoes the step with."""

    mean: torch.Tensor
    precision: torch.Tensor  # shaped like the family's precision
    round: int = 0  # the round of the reply it came from

    @classmethod
    def held(cls, q: Gaussian, server_round: int) -> LocalPosterior:
        """Client k's local posterior `q` as held from the reply of `server_round`.

        Args:
            q: the local posterior as the server step used it.
            server_round: the round of the reply it came from.

        Returns:
            The held local posterior.
        """
        return cls(q.mean, q.precision, server_round)

    def gaussian(self) -> Gaussian:
        """q_k as a Gaussian.

        Returns:
            N(m_k, S_k⁻¹), sharing this record's tensors.
        """
        return Gaussian(self.mean, self.precision)


def dual_step(duals: Duals, local: Gaussian, global_: Gaussian, step: float, server_round: int) -> Duals:
    """Alg. 1 lines 5-6 / Eq. 36: v += γ (S_k m_k - S̄ m̄), U += γ (S_k - S̄).

    Args:
        duals: client k's duals (v_k, U_k) before the step.
        local: q_k, the client's local posterior.
        global_: q̄, the global posterior it was fitted against, of `local`'s family.
        step: the dual step size γ.
        server_round: the round the step is taken in, recorded on the result.

    Returns:
        The new duals, shaped as `duals`.
    """
    local_eta, _ = local.natural()
    global_eta, _ = global_.natural()
    return Duals(
        duals.mean + step * (local_eta - global_eta),
        duals.precision + step * (local.precision - global_.precision),
        server_round,
    )


def shares_step(
    shares: Mapping[str, Duals],
    repliers: Mapping[str, Gaussian],
    all_duals: Mapping[str, Duals],
    global_: Gaussian,
    rho: float,
    server_round: int,
) -> dict[str, Duals]:
    """Every known client's share c_k of q̄ after one server step, in natural parameters (as Duals: the shape the
    sums take). With R of the K known clients replying (`repliers`: their local posteriors as the step used them;
    `all_duals`: as it summed them; `global_`: the q̄ they were fitted against), Eqs. 37-38 read, as (1-α)/R = αρK/R,
        S̄ m̄ <- (1-α) S̄ m̄ + α [Σ_k a_k + prior's],  a_k = v_k + [k replied] (ρK/R)(S_k m_k - S̄ m̄),
    and likewise S̄ with U_k and S_k: linear in each client's term a_k. So c_k <- (1-α) c_k + α a_k (0 before k's first
    reply) keeps q̄ = Π(1-α) q̄_0 + the prior's part + Σ_k c_k at every round, whatever the local solver: q̄ - c_k is
    q̄ without any term k's duals and local posteriors added. For the diagonal and full families (the isotropic one
    resets its precision after each step).

    Args:
        shares: each client's share c_k before the step; a client without one starts at 0.
        repliers: the replying clients' local posteriors as the step used them, by client id; not empty.
        all_duals: every known client's duals as the step summed them, by client id.
        global_: q̄ before the step.
        rho: the penalty ρ.
        server_round: the round of the step, recorded on each share.

    Returns:
        Every client of `all_duals`'s share after the step, by client id.
    """
    clients = len(all_duals)
    alpha = prior_weight(rho, clients)
    weight = rho * clients / len(repliers)
    global_eta, _ = global_.natural()
    updated = {}
    for client, duals in all_duals.items():
        term_eta, term_precision = duals.mean, duals.precision
        if client in repliers:
            local = repliers[client]
            term_eta = term_eta + weight * (local.natural()[0] - global_eta)
            term_precision = term_precision + weight * (local.precision - global_.precision)
        kept = shares.get(client, Duals(torch.zeros_like(term_eta), torch.zeros_like(term_precision)))
        updated[client] = Duals(
            (1 - alpha) * kept.mean + alpha * term_eta,
            (1 - alpha) * kept.precision + alpha * term_precision,
            server_round,
        )
    return updated


def without_share(
    global_: Gaussian, share: Duals, floor: float | None = None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """q̄'s natural parameters (S̄ m̄, S̄) less client k's share c_k (`shares_step`). `floor` (diagonal family): where
    less precision than that would remain (the other shares carry IVON's negative curvature estimates), q̄ keeps its
    own entry. Returns (S̄' m̄', S̄', how many entries were kept).

    Args:
        global_: q̄.
        share: client k's share c_k (`shares_step`), shaped as q̄'s natural parameters.
        floor: the least precision an entry may keep (diagonal family), or None for no floor.

    Returns:
        S̄' m̄', S̄', and the number of entries where q̄ kept its own (0 without `floor`).
    """
    eta, _ = global_.natural()
    eta_without, precision_without = eta - share.mean, global_.precision - share.precision
    if floor is None:
        return eta_without, precision_without, 0
    kept = precision_without < floor
    return (
        torch.where(kept, eta, eta_without),
        torch.where(kept, global_.precision, precision_without),
        int(kept.sum()),
    )


def prior_weight(rho: float, clients: int) -> float:
    """α = 1 / (1 + ρK), the weight of δ + Σ U_k against Mean_k S_k in the server step (Eq. 37).

    Args:
        rho: the penalty ρ.
        clients: K, the number of known clients.

    Returns:
        α.
    """
    return 1.0 / (1.0 + rho * clients)


def server_natural(
    locals_: list[Gaussian], all_duals: list[Duals], rho: float, prior_precision: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 1 lines 9-11 / Eqs. 37-38 for any family, in natural parameters: (S̄ m̄, S̄). `locals_`: this round's
    replies; `all_duals`: every known client's duals (K = len(all_duals)).

    Args:
        locals_: this round's local posteriors q_k, of one family; not empty.
        all_duals: every known client's duals, shaped as the family's; not empty.
        rho: the penalty ρ.
        prior_precision: δ, the prior's precision.

    Returns:
        S̄ m̄ (P,) and S̄, shaped as the family's precision.
    """
    alpha = prior_weight(rho, len(all_duals))
    mean_eta = torch.stack([q.natural()[0] for q in locals_]).mean(0)
    mean_precision = torch.stack([q.precision for q in locals_]).mean(0)
    sum_v = torch.stack([d.mean for d in all_duals]).sum(0)
    sum_u = torch.stack([d.precision for d in all_duals]).sum(0)
    precision = (1 - alpha) * mean_precision + alpha * (scaled_identity(mean_precision, prior_precision) + sum_u)
    return (1 - alpha) * mean_eta + alpha * sum_v, precision


def server_step(locals_: list[Gaussian], all_duals: list[Duals], rho: float, prior_precision: float) -> Gaussian:
    """Eqs. 37-38 as a Gaussian: m̄ = S̄⁻¹ (S̄ m̄).

    Args:
        locals_: this round's local posteriors q_k, of one family; not empty.
        all_duals: every known client's duals, shaped as the family's; not empty.
        rho: the penalty ρ.
        prior_precision: δ, the prior's precision.

    Returns:
        The new q̄.
    """
    eta, precision = server_natural(locals_, all_duals, rho, prior_precision)
    return Gaussian(solve(precision, eta), precision)


def fixed_point_natural(
    all_duals: list[Duals], prior_precision: float, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 37-38 at the fixed point (docs/guides/forgetting.md): where Eq. 36 stands still, every S_k = S̄ and
    S_k m_k = S̄ m̄, so S̄ = (1-α) S̄ + α [δI + Σ U_k] whatever α: (S̄ m̄, S̄) = (Σ_k v_k, δI + Σ_k U_k) over
    `all_duals`. `like`: a precision of the family's shape.

    Args:
        all_duals: every known client's duals; not empty.
        prior_precision: δ, the prior's precision.
        like: a precision of the family's shape.

    Returns:
        Σ_k v_k (P,) and δI + Σ_k U_k, shaped as `like`.
    """
    sum_v = torch.stack([d.mean for d in all_duals]).sum(0)
    sum_u = torch.stack([d.precision for d in all_duals]).sum(0)
    return sum_v, scaled_identity(like, prior_precision) + sum_u


class RedoneStep(NamedTuple):
    """A server step redone without a client (`server_natural_without`)."""

    round: int  # the round whose step it redoes
    repliers: int  # how many local posteriors its Mean(...) took
    eta: torch.Tensor  # S̄' m̄'
    precision: torch.Tensor  # S̄'


def server_natural_without(
    client: str,
    held_locals: Mapping[str, LocalPosterior],
    all_duals: Mapping[str, Duals],
    rho: float,
    prior_precision: float,
    clip_ratio: float | None = None,
) -> RedoneStep | None:
    """Alg. 1 lines 9-11 / Eqs. 37-38 redone without client k, in natural parameters (S̄' m̄', S̄'):
    S̄' = (1-α') Mean_{j≠k}(S_j) + α' [δI + Σ_{j≠k} U_j],  S̄' m̄' = (1-α') Mean_{j≠k}(S_j m_j) + α' Σ_{j≠k} v_j,
    α' = 1/(1 + ρ(K-1)): k's local posterior out of the mean, its duals out of the sums, K - 1 clients.

    The step redone is the last one a remaining client replied in: Mean(...) runs over the `held_locals` of the latest
    round among the remaining clients (that round's repliers, as Eq. 37 took them), Σ over every remaining client's
    duals. Where k alone replied in the rounds after it, those rounds without k have no reply and leave q̄ as it was;
    nothing of the remaining clients changed since (a reply updates a client's duals and local posterior together).
    `clip_ratio`: the `clip` rule's, which tempers the remaining duals among themselves as the server step does (the
    held local posteriors stay as that step moved them). None where no remaining client's local posterior is held.

    At the fixed point (every S_j = S̄ = δI + Σ_j U_j, S_j m_j = S̄ m̄ = Σ_j v_j) this is S̄' = S̄ - α' U_k and
    S̄' m̄' = S̄ m̄ - α' v_k: only α' of k's site leaves q̄, not all of it as in `fixed_point_natural`, since the
    remaining local posteriors were fitted against a q̄ that held k.

    Args:
        client: k, the client to leave out.
        held_locals: the local posteriors the server holds, by client id.
        all_duals: every known client's duals, by client id.
        rho: the penalty ρ.
        prior_precision: δ, the prior's precision.
        clip_ratio: the `clip` rule's ratio, or None where the server step did not temper.

    Returns:
        The redone step, or None where no remaining client's local posterior is held.
    """
    remaining = {c: q for c, q in held_locals.items() if c != client}
    if not remaining:
        return None
    last_round = max(q.round for q in remaining.values())
    step_locals = [q.gaussian() for q in remaining.values() if q.round == last_round]
    duals = [d for c, d in all_duals.items() if c != client]
    if clip_ratio is not None:
        duals = tempered_duals(duals, clip_ratio)
    return RedoneStep(last_round, len(step_locals), *server_natural(step_locals, duals, rho, prior_precision))


def fixed_point_residual(global_: Gaussian, all_duals: list[Duals], prior_precision: float) -> float:
    """How far q̄ is from the Gaussian its duals make at the fixed point (forget.md: "measure, do not assume"): the
    larger relative distance of the means and of the precisions (the means alone for the fixed-covariance family,
    where θ̄ = Σ v_k/δ at the fixed point). 0 at the fixed point.

    Args:
        global_: q̄.
        all_duals: every known client's duals; not empty.
        prior_precision: δ, the prior's precision.

    Returns:
        The relative distance, >= 0.
    """
    eta, precision = fixed_point_natural(all_duals, prior_precision, global_.precision)
    distances = [relative_distance(solve(precision, eta), global_.mean)]
    if global_.kind != "isotropic":
        distances.append(relative_distance(precision, global_.precision))
    return max(distances)


def relative_distance(value: torch.Tensor, reference: torch.Tensor) -> float:
    """‖value - reference‖ / ‖reference‖ (the denominator kept above 0).

    Args:
        value: the tensor measured.
        reference: the tensor it is measured against, shape of `value`.

    Returns:
        The relative distance, >= 0.
    """
    return ((value - reference).norm() / reference.norm().clamp_min(1e-300)).item()


def replay_tolerance(previous: Duals, local: Gaussian, global_: Gaussian, step: float, reported: Duals) -> Duals:
    """Per entry, how far a reported dual may lie from the server's replay of Eq. 36: DUAL_CHECK_RTOL of the
    magnitudes that make the entry (old dual, γ·local, γ·global, the result), since each crossed the wire as
    float32. Per entry: a tolerance scaled by a tensor's largest entry let one huge entry hide errors in the rest.

    Args:
        previous: the client's duals before the step.
        local: q_k as the client reported it.
        global_: q̄ as the client received it.
        step: the dual step size γ.
        reported: the duals the client reported after the step.

    Returns:
        The tolerances per entry, shaped as the duals (round 0).
    """
    mean = (
        previous.mean.abs()
        + step * (natural_mean_magnitude(local) + natural_mean_magnitude(global_))
        + reported.mean.abs()
    )
    precision = (
        previous.precision.abs() + step * (local.precision.abs() + global_.precision.abs()) + reported.precision.abs()
    )
    return Duals(DUAL_CHECK_RTOL * mean + 1e-30, DUAL_CHECK_RTOL * precision + 1e-30)


def natural_mean_magnitude(q: Gaussian) -> torch.Tensor:
    """|S| |m| entry by entry: what bounds the float32 rounding error of each entry of S m (for a full S, each entry
    sums a whole row, so its error scales with |S| |m|, not with |S m|).

    Args:
        q: a Gaussian of any family.

    Returns:
        |S| |m|, shape (P,).
    """
    return Gaussian(q.mean.abs(), q.precision.abs()).precision_times(q.mean.abs())


def tempering(means: list[torch.Tensor], precisions: list[torch.Tensor], clip_ratio: float) -> list[float]:
    """Per item, the factor that brings both its natural mean and its precision part to at most clip-ratio x the
    median of theirs (bayes/robust.py part_clip_factors).

    Args:
        means: each item's natural-mean part, on the CPU.
        precisions: each item's precision part, on the CPU, one per mean.
        clip_ratio: the `clip` rule's ratio.

    Returns:
        One factor in (0, 1] per item.
    """
    parts = [[mean.numpy() for mean in means], [precision.numpy().ravel() for precision in precisions]]
    return [float(factor) for factor in part_clip_factors(parts, clip_ratio)]


def tempered_duals(all_duals: list[Duals], clip_ratio: float) -> list[Duals]:
    """Every client's duals tempered to at most clip-ratio x the median dual, in natural parameters.

    Args:
        all_duals: every known client's duals, on the CPU.
        clip_ratio: the `clip` rule's ratio.

    Returns:
        The tempered duals, in the order of `all_duals`, their rounds kept.
    """
    factors = tempering([d.mean for d in all_duals], [d.precision for d in all_duals], clip_ratio)
    return [Duals(f * d.mean, f * d.precision, d.round) for f, d in zip(factors, all_duals)]


def bounded_influence(
    locals_: list[Gaussian], all_duals: list[Duals], global_: Gaussian, clip_ratio: float
) -> tuple[list[Gaussian], list[Duals]]:
    """What the clip rule feeds the server step: duals tempered to at most clip-ratio x the median dual (in
    natural parameters), and local posteriors moved towards q̄, in natural parameters, to at most clip-ratio x the
    median distance of the round's.

    Args:
        locals_: this round's local posteriors, on the CPU.
        all_duals: every known client's duals, on the CPU.
        global_: q̄ before the step.
        clip_ratio: the `clip` rule's ratio.

    Returns:
        The moved local posteriors in the order of `locals_`, and the tempered duals in the order of `all_duals`.
    """
    duals = tempered_duals(all_duals, clip_ratio)
    global_eta = global_.natural()[0]
    eta_offsets = [q.natural()[0] - global_eta for q in locals_]
    precision_offsets = [q.precision - global_.precision for q in locals_]
    moved = []
    for f, eta, precision in zip(tempering(eta_offsets, precision_offsets, clip_ratio), eta_offsets, precision_offsets):
        precision = global_.precision + f * precision  # between S̄ and S_k: positive definite like both
        moved.append(Gaussian(solve(precision, global_eta + f * eta), precision))
    return moved, duals


def newton_client_step(
    loss_sum,
    global_: Gaussian,
    duals: Duals,
    rho: float,
    start: Gaussian,
    step_size: float = 1.0,
) -> Gaussian:
    """One VON step (delta approximation) on Eq. 34 for a full or isotropic-fixed family:
    minimise (1/ρ)·[loss(θ) + v·θ - ½θ·Uθ] + KL(q ‖ q̄). `loss_sum(theta)` is the client's summed
    loss. With a quadratic loss and step 1 this is the exact minimiser.

    Args:
        loss_sum: the client's summed loss, a function of the flat parameters θ (P,) to a scalar tensor.
        global_: q̄, of the full or isotropic family.
        duals: the client's duals (v_k, U_k).
        rho: the penalty ρ.
        start: the client's posterior before the step, of `global_`'s family.
        step_size: the VON step size (1: the full Newton step).

    Returns:
        The client's posterior after the step.

    Raises:
        ValueError: `global_` is of the diagonal family.
    """
    if global_.kind not in ("full", "isotropic"):
        raise ValueError("newton_client_step is for the full and fixed-isotropic families; diagonal uses IVON")
    theta = start.mean.detach()
    gradient = torch.func.grad(loss_sum)(theta)
    # jacrev∘jacrev: torch.func.hessian's forward mode costs ~8 s on its first call in a process (~2 s here).
    hessian = torch.func.jacrev(torch.func.jacrev(loss_sum))(theta)
    identity = torch.eye(theta.numel(), dtype=theta.dtype)
    if global_.kind == "isotropic":  # fixed unit covariance: KL = ½‖m - m̄‖², U = 0, only m moves
        precision = identity + hessian / rho
        direction = solve(precision, (gradient + duals.mean) / rho + (theta - global_.mean))
        return Gaussian(theta - step_size * direction, start.precision)
    target_precision = global_.precision + (hessian - duals.precision) / rho
    precision = (1 - step_size) * start.precision + step_size * target_precision
    direction = solve(
        precision, (gradient + duals.mean - duals.precision @ theta) / rho + global_.precision @ (theta - global_.mean)
    )
    return Gaussian(theta - step_size * direction, precision)


def delta_objective(loss_sum, global_: Gaussian, duals: Duals, rho: float):
    """Eq. 34 under the delta approximation as a function of the mean θ (what `newton_client_step`
    descends): (1/ρ)·[loss(θ) + v·θ - ½θ·Uθ] + ½(θ - m̄)·S̄(θ - m̄).

    Args:
        loss_sum: the client's summed loss, a function of the flat parameters θ (P,) to a scalar tensor.
        global_: q̄, of the full family.
        duals: the client's duals (v_k, U_k).
        rho: the penalty ρ.

    Returns:
        The objective, a function of θ (P,) to a scalar tensor.
    """

    def objective(theta: torch.Tensor) -> torch.Tensor:
        offset = theta - global_.mean
        lagrange = duals.mean @ theta - 0.5 * theta @ (duals.precision @ theta)
        return (loss_sum(theta) + lagrange) / rho + 0.5 * offset @ (global_.precision @ offset)

    return objective


# fixed unit covariance, U_k = 0) --------------------------------------------------------------------------------
def unit_precision() -> torch.Tensor:
    """The fixed-covariance family's precision: the 0-d float64 tensor 1.

    Returns:
        tensor(1.0, dtype=torch.float64).
    """
    return torch.tensor(1.0, dtype=torch.float64)


def precision_layout(family: str, layout: TensorLayout) -> TensorLayout:
    """What a precision of `family` looks like on the wire, for parameters of `layout`.

    Args:
        family: one of FAMILIES.
        layout: the parameters' layout.

    Returns:
        No arrays for "isotropic", one (P, P) "matrix" for "full", `layout` itself for "diagonal".
    """
    if family == "isotropic":
        return {}
    if family == "full":
        size = sum(math.prod(shape) for shape in layout.values())
        return {"matrix": (size, size)}
    return layout


def precision_to_wire(precision: torch.Tensor, family: str, layout: TensorLayout) -> Tensors:
    """A precision of `family` as the named float32 arrays it travels as (`precision_layout`).

    Args:
        precision: a precision of `family`, on the CPU.
        family: one of FAMILIES.
        layout: the parameters' layout.

    Returns:
        The arrays, named and shaped as `precision_layout(family, layout)`.
    """
    if family == "isotropic":
        return {}
    if family == "full":
        return {"matrix": precision.numpy().astype(np.float32)}
    return unflatten(precision.numpy(), layout)


def precision_from_wire(arrays: Mapping[str, np.ndarray], family: str, layout: TensorLayout) -> torch.Tensor:
    """A precision of `family` from its arrays on the wire: the inverse of `precision_to_wire`, in float64.

    Args:
        arrays: the arrays as received, named as `precision_layout(family, layout)`.
        family: one of FAMILIES.
        layout: the parameters' layout.

    Returns:
        The precision: unit for "isotropic", (P, P) for "full", (P,) for "diagonal".
    """
    if family == "isotropic":
        return unit_precision()
    wire_layout = precision_layout(family, layout)
    flat = torch.from_numpy(flatten(arrays, wire_layout))
    return flat.view(wire_layout["matrix"]) if family == "full" else flat


def reply_effect(local: Gaussian, global_: Gaussian, weight: float) -> torch.Tensor:
    """What one reply alone does to q̄: Eqs. 37-38 with this local posterior as the round's only one and q̄ standing
    for the prior's and the duals' part, i.e. q̄'s natural parameters moved `weight` (1 − α) of the way to q_k's,
        S̄' = (1 − w) S̄ + w S_k,   m̄' − m̄ = S̄'⁻¹ w S_k (m_k − m̄),
    as (m̄' − m̄, log diag S̄' − log diag S̄); w (m_k − m̄) for the fixed-covariance family. The server adds local
    means weighted by their precisions, so a mean far from m̄ where the client's posterior is far wider than q̄
    (S_k ≪ S̄: its data say little there) moves q̄ little, and is measured so.

    Args:
        local: q_k, the client's local posterior.
        global_: q̄, of `local`'s family.
        weight: w, the weight of one reply in the step (1 − α).

    Returns:
        m̄' − m̄ (P,), followed by the change in log diag S̄ (P,) except for the fixed-covariance family.
    """
    if global_.kind == "isotropic":
        return weight * (local.mean - global_.mean)
    precision = (1.0 - weight) * global_.precision + weight * local.precision
    shift = solve(precision, weight * local.precision_times(local.mean - global_.mean))
    return torch.cat([shift, _diagonal(precision).log() - _diagonal(global_.precision).log()])


def mean_log_precision(q: Gaussian) -> torch.Tensor:
    """(m, log diag S) as one flat vector; m alone for the fixed-covariance family.

    Args:
        q: a Gaussian of any family.

    Returns:
        The vector, shape (2P,), or (P,) for the fixed-covariance family.
    """
    if q.kind == "isotropic":
        return q.mean
    return torch.cat([q.mean, _diagonal(q.precision).log()])


def precision_summary(q: Gaussian) -> dict[str, float]:
    """The median of the global precision S̄ (its diagonal for the full family): how fast q̄ concentrates,
    which is what shared training noise speeds up (README, Results).

    Args:
        q: the global posterior q̄.

    Returns:
        {"global-precision-median": the median}, or {} for the fixed-covariance family.
    """
    if q.kind == "isotropic":
        return {}
    return {"global-precision-median": float(_diagonal(q.precision).median())}


def added_precision_share(locals_: list[Gaussian], global_: Gaussian) -> float:
    """The median over parameters of (Mean_k S_k - S̄) / S̄: how much precision this round's clients added to the q̄
    they started from (diagonals for the full family).

    Why it matters: with duals that hardly move (the paper's γ = 0.001 ρ), Eq. 37 is S̄' ≈ (1 - α) Mean_k S_k + α δ,
    so where the clients add a share s, S̄' ≈ (1 - α)(1 + s) S̄ + α δ: where s < α / (1 - α) = 1 / (ρK), S̄ falls
    towards δ (by the factor 1 - α a round at s = 0) until IVON's weight samples are noise and training diverges
    (docs/extending/data.md: the CNNs, small tabular clients and FMNIST-10% at the defaults).

    Args:
        locals_: this round's local posteriors, of `global_`'s family; not empty.
        global_: the q̄ they started from.

    Returns:
        The median share, a fraction (0.01: 1%).
    """
    local = torch.stack([_diagonal(q.precision) for q in locals_]).mean(0)
    start = _diagonal(global_.precision)
    return float(((local - start) / start).median())


def collapse_warning(share: float, rho: float, clients: int, before: Gaussian, after: Gaussian) -> str:
    """What to tell the operator when the clients added under COLLAPSE_SHARE to q̄'s precision (`added_precision_share`),
    else "".

    Args:
        share: the round's `added_precision_share`.
        rho: the penalty ρ.
        clients: K, the number of known clients.
        before: q̄ before the round's server step.
        after: q̄ after it.

    Returns:
        The warning, or "" where `share` is at least COLLAPSE_SHARE.
    """
    if share >= COLLAPSE_SHARE:
        return ""
    shrink = 1.0 - prior_weight(rho, clients)
    before_median = float(_diagonal(before.precision).median())
    after_median = float(_diagonal(after.precision).median())
    return (
        f"the clients added {share:.1%} to q̄'s precision (median); while that lasts it shrinks to about "
        f"{shrink:.3f} of itself a round towards the prior's (median {before_median:.4g} -> {after_median:.4g}) "
        "until training diverges: with few clients or a CNN set reset-posterior=false hess-init=0.001, with the "
        "paper's hess-init and beta2 set them to 0 (docs/extending/data.md)"
    )


def _diagonal(precision: torch.Tensor) -> torch.Tensor:
    return precision.diagonal() if precision.ndim == 2 else precision


def as_sent(q: Gaussian) -> Gaussian:
    """`q` rounded to float32, as the clients receive it: the server replays their dual steps from the same q̄.

    Args:
        q: a Gaussian in float64.

    Returns:
        `q` rounded through float32, back in float64.
    """
    return Gaussian(q.mean.to(torch.float32).double(), q.precision.to(torch.float32).double())
