"""Robust statistics (bayes/robust.py) against closed forms, and the isolation search and quarantine
(server/isolation.py) against scripted rounds."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import trim_mean

from fedbayes.bayes.robust import clip_factors, norms, part_clip_factors, robust_mean, screen_bounds, trimmed_mean
from fedbayes.server.isolation import Quarantine, usable_subset
from fedbayes.strategies.base import RoundRejected


def test_screen_bounds_use_the_median_of_the_others_the_state_and_a_unit_change():
    ones = np.ones(4)
    bounds = screen_bounds(np.array([1.0, 2.0, 3.0, 1e30]), ones, state_norm=0.5, size=1, ratio=10.0)
    np.testing.assert_array_equal(bounds, [10 * 3.0, 10 * 3.0, 10 * 2.0, 10 * 2.0])  # medians of the other three
    one = np.ones(1)
    assert screen_bounds(np.array([5.0]), one, state_norm=2.0, size=1, ratio=10.0).tolist() == [20.0]  # the state
    assert screen_bounds(np.array([5.0]), one, state_norm=0.0, size=16, ratio=10.0).tolist() == [40.0]  # 10 x √16
    assert screen_bounds(np.array([1.0, 1e30]), np.ones(2), state_norm=0.0, size=1, ratio=100.0).tolist() == [
        1e32,
        100.0,
    ]


def test_screen_bounds_judge_each_update_by_what_is_expected_of_its_size():
    """Client sizes 1000, 30, 30, 30 with updates growing as the size (0.1 per example): each bound is 10 x the others'
    median per example x its own size, the large client's capped at 10 x theirs (300), and none is refused."""
    scales = np.array([1000.0, 30.0, 30.0, 30.0])
    update_norms = 0.1 * scales
    bounds = screen_bounds(update_norms, scales, state_norm=0.0, size=1, ratio=10.0)
    np.testing.assert_allclose(bounds, [10 * 0.1 * 300.0, 10 * 0.1 * 30.0, 10 * 0.1 * 30.0, 10 * 0.1 * 30.0])
    assert (update_norms <= bounds).all()
    same_sizes = screen_bounds(update_norms, np.ones(4), state_norm=0.0, size=1, ratio=10.0)
    assert same_sizes[0] == 10 * 3.0 < update_norms[0]  # measured by raw norms, the large client was refused


def test_a_claimed_size_widens_a_bound_by_at_most_ratio_times_the_others_median():
    """A rogue claiming 10^8 examples against clients of 30: its expected size is capped at ratio x 30, so an update
    of ratio² x an honest one per example of theirs is its limit, and a millionfold honest update is refused."""
    honest = 0.1 * 30.0
    scales = np.array([1e8, 30.0, 30.0, 30.0])
    for norm, refused in ((100 * honest, False), (1e6 * honest, True)):
        bounds = screen_bounds(np.array([norm, honest, honest, honest]), scales, state_norm=0.0, size=1, ratio=10.0)
        assert bounds[0] == 10.0 * (10.0 * 30.0) * (honest / 30.0)  # ratio x (ratio x the others' size) x per unit
        assert (norm > bounds[0]) == refused


@pytest.mark.parametrize("scales", [np.array([1.0, 0.0]), np.array([1.0, np.inf]), np.array([1.0, -2.0]), np.ones(3)])
def test_screen_bounds_refuse_scales_that_are_not_one_positive_number_per_update(scales):
    with pytest.raises(ValueError, match="one positive finite scale per update"):
        screen_bounds(np.array([1.0, 2.0]), scales, state_norm=0.0, size=1, ratio=10.0)


def test_clip_factors_bring_every_norm_to_at_most_ratio_times_the_median():
    update_norms = np.array([1.0, 2.0, 3.0, 100.0, 0.0])
    factors = clip_factors(update_norms, ratio=2.0)
    np.testing.assert_allclose(factors, [1.0, 1.0, 1.0, 4.0 / 100.0, 1.0])
    assert (factors * update_norms <= 2.0 * np.median(update_norms) + 1e-12).all()


def test_part_clip_factors_take_the_smallest_factor_of_any_part():
    means = [np.array([1.0]), np.array([1.0]), np.array([50.0])]
    precisions = [np.array([1e6]), np.array([2e6]), np.array([1e6])]  # its large values hide nothing
    np.testing.assert_allclose(part_clip_factors([means, precisions], ratio=1.0), [1.0, 0.5, 1.0 / 50.0])
    combined = [np.concatenate([m, p]) for m, p in zip(means, precisions)]  # one norm would miss the 50x mean
    assert clip_factors(norms(combined), ratio=1.0)[2] == 1.0


def test_robust_means_match_their_closed_forms():
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=6) for _ in range(7)]
    weights = rng.integers(1, 50, size=7).astype(float)
    stacked = np.stack(updates)
    np.testing.assert_allclose(robust_mean(updates, weights, "none", 3.0, 0.2), weights @ stacked / weights.sum())
    np.testing.assert_allclose(robust_mean(updates, weights, "median", 3.0, 0.2), np.median(stacked, axis=0))
    for fraction in (0.0, 0.15, 0.3, 0.45):
        np.testing.assert_allclose(
            robust_mean(updates, weights, "trimmed-mean", 3.0, fraction), trim_mean(stacked, fraction, axis=0)
        )
    factors = clip_factors(norms(updates), 1.0)
    np.testing.assert_allclose(
        robust_mean(updates, weights, "clip", 1.0, 0.2), (weights * factors) @ stacked / weights.sum()
    )
    with pytest.raises(ValueError, match="unknown robust aggregation rule 'mean'"):
        robust_mean(updates, weights, "mean", 3.0, 0.2)


def test_trimmed_mean_drops_floor_fraction_times_k_from_each_end():
    stacked = np.array([[1.0], [2.0], [3.0], [1000.0], [-1000.0]])
    assert trimmed_mean(stacked, 0.2).tolist() == [2.0]
    assert trimmed_mean(stacked, 0.19).tolist() == [1.2]  # floor(0.95) = 0: nothing dropped


def attempt_where(bad):
    """An `attempt` that fails when the replies include any set in `bad` (frozensets of ids)."""
    calls = []

    def attempt(replies):
        calls.append(list(replies))
        if any(combination <= set(replies) for combination in bad):
            raise RoundRejected("overflow")
        return sorted(replies)

    return attempt, calls


def test_usable_subset_commits_all_replies_of_a_good_round_in_one_attempt():
    attempt, calls = attempt_where([])
    found = usable_subset(["a", "b", "c"], attempt, {})
    assert found.used == ["a", "b", "c"] and found.left_out == [] and len(calls) == 1


def test_usable_subset_leaves_out_a_reply_that_is_unusable_on_its_own():
    attempt, _ = attempt_where([frozenset("b")])
    found = usable_subset(["a", "b", "c"], attempt, {})
    assert found.used == ["a", "c"] and found.result == ["a", "c"]
    assert [(reply, "on its own" in why) for reply, why in found.left_out] == [("b", True)]


def test_usable_subset_leaves_out_the_longest_of_a_pair_that_only_fails_together():
    attempt, _ = attempt_where([frozenset("bc")])
    found = usable_subset(["a", "b", "c"], attempt, {id("b"): 1.0, id("c"): 5.0})
    assert found.used == ["a", "b"] and [reply for reply, _ in found.left_out] == ["c"]


def test_usable_subset_gives_up_on_a_round_no_subset_saves():
    attempt, _ = attempt_where([frozenset("a"), frozenset("b")])
    found = usable_subset(["a", "b"], attempt, {})
    assert found.used == [] and {reply for reply, _ in found.left_out} == {"a", "b"}
    found = usable_subset([], attempt, {})
    assert found.used == [] and found.left_out == []


def test_quarantine_counts_consecutive_refusals_and_forgives_an_accepted_round():
    quarantine = Quarantine(max_rejections=2, rounds=3)
    assert quarantine.record(1, refused={7, 8}, accepted={9}) == []
    assert quarantine.record(2, refused={8}, accepted={7, 9}) == [8]  # 7 was forgiven, 8 refused twice
    assert [quarantine.excludes(8, r) for r in (2, 3, 5, 6)] == [True, True, True, False]
    assert quarantine.record(3, refused={7}, accepted=set()) == []
    assert quarantine.refusals == {7: 1}
    restored = Quarantine(2, 3)
    restored.restore(quarantine.to_metadata())
    assert (restored.refusals, restored.until) == ({7: 1}, {8: 5})
    quarantine.record(6, refused=set(), accepted=set())
    assert quarantine.active(7) == {} and quarantine.until == {}
