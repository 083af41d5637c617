"""Robust statistics of a round's client updates: the screen that refuses an absurd update before it is
aggregated, and the robust aggregation rules (norm clipping, coordinate-wise median and trimmed mean).

An update is one client's change to the server's state, as a flat float64 vector in the strategy's own
parameters (weights for FedAvg, the global posterior's mean and log precision for the Gaussian strategies, particles
for DSVGD).

Guarantees (K updates, at most B of them bad):
  screen        each update comes with its expected size s_k > 0 (the strategy's `update_scale`: how an honest
                update grows with its client's examples, e.g. its local steps) and is judged per unit of it. Update
                k is refused when its norm is over `ratio` x max(c_k x median_{j≠k} norm_j / s_j, the state's norm,
                √P), c_k = min(s_k, `ratio` x median_{j≠k} s_j), P the update's length (√P: the norm of a change of
                1 in every entry). With B < (K-1)/2 the medians over the others are honest ones, so:
                - no client is refused for its size: an update no longer per unit of its expected size than
                  `ratio` x the honest median passes whenever s_k <= `ratio` x the others' median s_j (at the
                  default 100, a client of 100 x the others' examples may send an update 100 x 100 x theirs);
                - s_k is the client's own claim (num_examples, at most max-client-examples), and a claim widens
                  its bound by at most `ratio` x the others' median s_j: no update passes that is longer than
                  `ratio` x max(`ratio` x the honest median per unit x the others' median s_j, the state, √P), so
                  claiming more examples than it holds hides nothing past `ratio`² x an honest update per unit;
                - an update no longer than `ratio` x the larger of the state's norm and √P is never refused.
  clip          every update is scaled down to at most `ratio` x the median norm of the round's updates: a bad
                client moves the aggregate by at most ratio x median x its weight (with B < K/2).
  median        the coordinate-wise median: each coordinate of the aggregate lies within the honest updates'
                range of that coordinate when B < K/2.
  trimmed-mean  the coordinate-wise mean after dropping the `fraction` x K largest and smallest values of each
                coordinate: within the honest range when B <= fraction x K.
The median and the trimmed mean are unweighted: a bad client could otherwise claim many examples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RULES = ("none", "clip", "median", "trimmed-mean")


def norms(updates: Sequence[np.ndarray]) -> np.ndarray:
    """The Euclidean norm of each update (float64; inf for one too large to square).

    Args:
        updates: the updates, flat arrays.

    Returns:
        (K,) float64 norms.
    """
    return np.array([float(np.linalg.norm(update)) for update in updates], dtype=np.float64)


def screen_bounds(
    update_norms: np.ndarray, scales: np.ndarray, state_norm: float, size: int, ratio: float
) -> np.ndarray:
    """Per update (each of `size` entries, of expected size `scales[k]` > 0), the longest norm the screen lets
    through: `ratio` x the largest of
      - the median of the OTHER updates' norms per unit of their expected size (so an update cannot raise its own
        bound), times this update's expected size, capped at `ratio` x the others' median expected size (so a
        client's claim of its size, e.g. its num_examples, widens its bound by at most `ratio` x);
      - the state's norm;
      - √size, the norm of an RMS change of 1 per entry (so one reply in a round, DSVGD's, is bounded too, and
        neither a round of tiny updates nor a state near zero refuses an ordinary update).
    ValueError when the lengths differ or a scale is not positive and finite.

    Args:
        update_norms: (K,) the updates' norms.
        scales: (K,) their expected sizes s_k.
        state_norm: the norm of the server's state the updates change.
        size: P, the entries of each update.
        ratio: the screen's ratio.

    Returns:
        (K,) the bounds.

    Raises:
        ValueError: `scales` and `update_norms` differ in length, or a scale is not positive and finite.
    """
    if len(scales) != len(update_norms) or not (np.isfinite(scales) & (scales > 0)).all():
        raise ValueError(f"need one positive finite scale per update, got {scales!r} for {len(update_norms)}")
    per_unit = update_norms / scales
    bounds = np.empty_like(update_norms)
    for index in range(len(update_norms)):
        others = np.delete(np.arange(len(update_norms)), index)
        reference = max(state_norm, math.sqrt(size))
        if len(others):
            expected = min(float(scales[index]), ratio * float(np.median(scales[others])))
            reference = max(reference, expected * float(np.median(per_unit[others])))
        bounds[index] = ratio * reference
    return bounds


def clip_factors(update_norms: np.ndarray, ratio: float) -> np.ndarray:
    """min(1, ratio x median / norm) per update: the factor that scales it to at most ratio x the median norm.

    Args:
        update_norms: (K,) the updates' norms.
        ratio: the clip ratio.

    Returns:
        (K,) factors in [0, 1].
    """
    bound = ratio * float(np.median(update_norms))
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, np.where(update_norms > 0, bound / update_norms, 1.0))


def part_clip_factors(parts: Sequence[Sequence[np.ndarray]], ratio: float) -> np.ndarray:
    """Per item, the smallest `clip_factors` any of its parts needs: `parts[j][k]` is part j (e.g. a natural mean,
    a precision) of item k. Parts are measured apart, so one with large values cannot hide another's outlier.

    Args:
        parts: the parts, `parts[j][k]` an array, the same number of items K in each part.
        ratio: the clip ratio.

    Returns:
        (K,) factors in [0, 1].
    """
    factors: np.ndarray = np.min([clip_factors(norms(part), ratio) for part in parts], axis=0)
    return factors


def trimmed_mean(stacked: np.ndarray, fraction: float) -> np.ndarray:
    """The coordinate-wise mean of `stacked` (K, P) without the floor(fraction x K) smallest and largest values
    of each coordinate.

    Args:
        stacked: (K, P) the updates, one a row.
        fraction: the share trimmed at each end, in [0, 0.5).

    Returns:
        (P,) the trimmed mean.
    """
    cut = math.floor(fraction * len(stacked))
    ordered = np.sort(stacked, axis=0)
    mean: np.ndarray = ordered[cut : len(stacked) - cut].mean(axis=0)
    return mean


def robust_mean(
    updates: Sequence[np.ndarray], weights: Sequence[float], rule: str, clip_ratio: float, trim_fraction: float
) -> np.ndarray:
    """The aggregate of `updates` under `rule` (see the module docstring); `weights` (e.g. example counts) weight
    the mean for none and clip.

    Args:
        updates: the updates, flat arrays of one length P; not empty.
        weights: one per update (for "none" and "clip").
        rule: one of RULES.
        clip_ratio: the ratio of the "clip" rule.
        trim_fraction: the fraction of the "trimmed-mean" rule.

    Returns:
        (P,) float64 the aggregate.

    Raises:
        ValueError: `rule` is none of RULES.
    """
    stacked = np.stack(updates).astype(np.float64, copy=False)
    if rule == "median":
        return np.median(stacked, axis=0)
    if rule == "trimmed-mean":
        return trimmed_mean(stacked, trim_fraction)
    weight = np.asarray(weights, dtype=np.float64)
    if rule == "clip":
        stacked = stacked * clip_factors(norms(updates), clip_ratio)[:, None]
    elif rule != "none":
        raise ValueError(f"unknown robust aggregation rule {rule!r}; one of {', '.join(RULES)}")
    return np.tensordot(weight / weight.sum(), stacked, axes=1)
