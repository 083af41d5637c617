"""FedLap's math, shared by both halves: the cavity, the site step, the global from the sites, clipping."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedbayes.bayes.robust import part_clip_factors


@dataclass
class Site:
    mean: torch.Tensor  # v_k, natural (precision times mean)
    precision: torch.Tensor  # V_k (zeros for FedLap)
    round: int = 0  # the round it was last updated in (0: never)


def cavity(global_mean: torch.Tensor, global_precision: torch.Tensor, site: Site, prior_precision: float):
    """(m_k, P_k): q_g / t̂_k. P_k = δ + Σ_{j≠k} V_j ≥ δ exactly; the clamp only absorbs float32 rounding of S_g.

    Args:
        global_mean: w_g, (P,).
        global_precision: S_g, (P,).
        site: client k's site t̂_k.
        prior_precision: δ, the floor of P_k.

    Returns:
        The cavity's mean m_k and precision P_k, each (P,).
    """
    precision = (global_precision - site.precision).clamp(min=prior_precision)
    return (global_precision * global_mean - site.mean) / precision, precision


def site_step(
    site: Site,
    local_mean: torch.Tensor,
    curvature: torch.Tensor,
    global_mean: torch.Tensor,
    global_precision: torch.Tensor,
    rho: float | torch.Tensor,
    server_round: int,
) -> Site:
    """[P] Eq. 21: S_k = H_k − V_k + S_g (old V_k); v_k += ρ(S_k w_k − S_g w_g); V_k += ρ(H_k − V_k); ρ a number or
    one per coordinate.

    Args:
        site: client k's site before the step.
        local_mean: w_k, the client's local mean, (P,).
        curvature: H_k, the client's curvature at w_k, (P,) (zeros for FedLap).
        global_mean: w_g, (P,).
        global_precision: S_g, (P,).
        rho: the damping ρ_k, a number or (P,).
        server_round: the round of the step, recorded on the new site.

    Returns:
        The new site.
    """
    local_precision = curvature - site.precision + global_precision
    return Site(
        site.mean + rho * (local_precision * local_mean - global_precision * global_mean),
        site.precision + rho * (curvature - site.precision),
        server_round,
    )


def global_from_sites(natural_sum: torch.Tensor, precision_sum: torch.Tensor, prior_precision: float):
    """q_g ∝ p_0 Π_k t̂_k: S_g = δ + Σ V_k, w_g = Σ v_k / S_g.

    Args:
        natural_sum: Σ v_k, (P,).
        precision_sum: Σ V_k, (P,).
        prior_precision: δ.

    Returns:
        w_g and S_g, each (P,).
    """
    precision = prior_precision + precision_sum
    return natural_sum / precision, precision


def site_change(old: Site, new: Site, global_mean: torch.Tensor, global_precision: torch.Tensor) -> torch.Tensor:
    """(w_g' − w_g, log S_g' − log S_g) for q_g' = q_g · t̂_new / t̂_old: what replacing one site alone does to the
    global posterior. S_g' ≥ δ > 0, since S_g ≥ δ + V_old and V_new ≥ 0.

    Args:
        old: the site replaced.
        new: the site that replaces it.
        global_mean: w_g, (P,).
        global_precision: S_g, (P,).

    Returns:
        w_g' − w_g followed by log S_g' − log S_g, (2P,).
    """
    precision = global_precision + new.precision - old.precision
    mean = (global_precision * global_mean + new.mean - old.mean) / precision
    return torch.cat([mean - global_mean, precision.log() - global_precision.log()])


def tempered_sums(sites: list[Site], clip_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ f_k v_k, Σ f_k V_k) with f_k the smallest min(1, clip-ratio x median / norm) of v_k's and V_k's: each
    site t̂_k^f_k has natural parameters of at most clip-ratio x the median site's.

    Args:
        sites: every client's site, on the CPU; not empty.
        clip_ratio: the `clip` rule's ratio.

    Returns:
        Σ f_k v_k and Σ f_k V_k, each (P,).
    """
    parts = [[site.mean.numpy() for site in sites], [site.precision.numpy() for site in sites]]
    factors = torch.from_numpy(part_clip_factors(parts, clip_ratio))
    return (
        sum(f * site.mean for f, site in zip(factors, sites)),
        sum(f * site.precision for f, site in zip(factors, sites)),
    )


def client_damping(
    covariance: bool, num_examples: int, known_clients: int, known_examples: int, site_damping: float = 0.0
) -> float:
    """ρ_k: run config `site-damping` where set (> 0), else the paper's rule ([P] App. E): 1/K for FedLap-Cov, N_k/N
    for FedLap; 1/K while no sizes are known (round 1).

    Args:
        covariance: whether the strategy is FedLap-Cov.
        num_examples: N_k, the client's examples.
        known_clients: K, the number of known clients, >= 1.
        known_examples: N, the examples of the known clients (0 while none is known).
        site_damping: the run config's `site-damping`; 0 for the paper's rule.

    Returns:
        ρ_k.
    """
    if site_damping > 0.0:
        return site_damping
    if covariance or known_examples == 0:
        return 1.0 / known_clients
    return num_examples / known_examples


def curvature_damping(rho: float, curvature: torch.Tensor, cavity_precision: torch.Tensor) -> torch.Tensor:
    """ρ_k per coordinate for `site-damping-rule=curvature`: ρ_k + (1 − ρ_k)·H_k / (H_k + P_k).

    The local posterior's precision H_k + P_k has two parts. Where it is the cavity's (H_k ≪ P_k), the client's step
    away from the cavity mean m_k is driven by its gradient against the others' sites, and K clients stepping at once
    from the same global add their displacements: with ρ_k = 1 the global moves by Σ_k (w_k − w_g), the double
    counting of parallel PVI that the paper's 1/K ([P] App. E, after Ashman et al. 2022) turns into their mean. Where
    the precision is the client's own curvature (H_k ≫ P_k), the site is the Laplace estimate of its own likelihood
    and taking all of it is PVI's exact step on quadratic losses. So the cavity's share moves by ρ_k, the client's own
    share in full. FedLap (H_k = 0) keeps ρ_k; the fixed point, where each site no longer changes, is the same for
    every ρ_k > 0.

    Args:
        rho: ρ_k, the damping of the cavity's share.
        curvature: H_k, (P,), >= 0.
        cavity_precision: P_k, (P,), > 0.

    Returns:
        ρ_k per coordinate, (P,).
    """
    own_share = curvature / (curvature + cavity_precision)
    return rho + (1.0 - rho) * own_share


def as_sent(flat: torch.Tensor) -> torch.Tensor:
    """`flat` rounded to float32, as it crosses the wire, back in float64.

    Args:
        flat: a float64 vector.

    Returns:
        `flat` rounded through float32, in float64.
    """
    return flat.to(torch.float32).double()
