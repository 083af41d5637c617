"""The round loop's straggler deadlines (server/loop.py straggler_deadlines, Stragglers): once half the replies are
in after h seconds, a client still waited for is allowed h x (1 + w x its size), its size being its examples over
the median of the replies in, at least 1; one of unknown size is waited for up to round-timeout once."""

from __future__ import annotations

import math

from fedbayes.server.loop import Stragglers, straggler_deadlines


def test_each_client_is_allowed_its_share_of_the_time_by_its_examples():
    waiting = {"small": 50, "median": 200, "large": 1000}
    deadlines = straggler_deadlines(2.0, waiting, [100, 200, 300], 2.0, set())
    # sizes against the median 200: 0.25 -> 1 (at least), 1, 5
    assert deadlines == {"small": 2.0 * (1 + 2.0), "median": 2.0 * (1 + 2.0), "large": 2.0 * (1 + 2.0 * 5)}


def test_a_client_of_unknown_size_is_waited_for_once_then_as_a_median_one():
    deadlines = straggler_deadlines(1.0, {"new": None, "seen": None}, [10, 30], 3.0, {"seen"})
    assert deadlines == {"new": math.inf, "seen": 1.0 * (1 + 3.0)}
    # no reply of known size yet (round 1 of a resumed server): every known client counts as size 1
    assert straggler_deadlines(1.0, {"known": 500}, [], 3.0, set()) == {"known": 4.0}


def test_the_policy_remembers_whom_it_waited_for_and_knows_sizes_from_accepted_replies():
    examples = {1: 10, 2: 10, 3: None}
    stragglers = Stragglers(2.0, examples.get)
    assert stragglers.deadlines(0.5, [3], [1, 2]) == {3: math.inf}
    assert stragglers.deadlines(0.5, [3], [1, 2]) == {3: 1.5}  # waited for once: now as a median client
    examples[3] = 40  # accepted meanwhile: 4 x the median of the replies in
    assert stragglers.deadlines(0.5, [3], [1, 2]) == {3: 0.5 * (1 + 2.0 * 4)}
    assert "straggler-wait=2 x the 0.5 s" in stragglers.why(3, 0.5, 4.5)
    assert "x its size 4 (40 examples against the median" in stragglers.why(3, 0.5, 4.5)
    assert "size" not in stragglers.why(1, 0.5, 1.5)
