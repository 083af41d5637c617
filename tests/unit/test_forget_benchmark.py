"""benchmarks/forget.py's membership-inference attacks: the plain loss-threshold AUC against its pairwise definition,
and the per-class one, which a client's skewed classes do not move."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.forget import class_matched_membership_auc, membership_auc


def pairwise_auc(members: np.ndarray, others: np.ndarray) -> float:
    """P(member loss < other loss) + ½ P(tie), counted over every pair."""
    lower = (members[:, None] < others[None, :]).mean()
    tied = (members[:, None] == others[None, :]).mean()
    return float(lower + tied / 2)


def test_the_plain_auc_is_the_pairwise_probability_with_ties_half():
    assert membership_auc(np.array([1.0, 2.0]), np.array([2.0, 3.0])) == pytest.approx(3.5 / 4)
    assert membership_auc(np.array([1.0, 3.0]), np.array([2.0, 2.0])) == pytest.approx(0.5)
    generator = np.random.default_rng(0)
    members, others = generator.integers(0, 20, 50).astype(float), generator.integers(5, 25, 70).astype(float)
    assert membership_auc(members, others) == pytest.approx(pairwise_auc(members, others))


def test_the_class_matched_auc_compares_within_classes_weighted_by_the_members():
    # The client holds only class 0, which the model knows well; the test set's class 1 it knows badly. Its examples
    # look no more familiar than unseen ones of class 0, so the class-matched AUC is ½ where the plain one is 1.
    members, member_labels = np.array([0.1, 0.2, 0.3]), np.zeros(3, dtype=int)
    others, other_labels = np.array([0.1, 0.2, 0.3, 5.0, 6.0]), np.array([0, 0, 0, 1, 1])
    assert membership_auc(members, np.array([5.0, 6.0])) == 1.0
    assert class_matched_membership_auc(members, member_labels, others, other_labels) == pytest.approx(0.5)
    # Class 0: every member below every other (1); class 1: above (0); three members against one: ¾.
    members, member_labels = np.array([0.1, 0.1, 0.1, 9.0]), np.array([0, 0, 0, 1])
    others, other_labels = np.array([1.0, 2.0]), np.array([0, 1])
    assert class_matched_membership_auc(members, member_labels, others, other_labels) == pytest.approx(0.75)
