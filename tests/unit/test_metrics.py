"""Accuracy, NLL, ECE and MCE against hand computations; the membership AUCs against their pairwise definition."""

import math

import numpy as np
import pytest
import torch

from fedbayes.bayes.metrics import (
    class_matched_membership_auc,
    classification_metrics,
    expected_calibration_error,
    maximum_calibration_error,
    membership_auc,
)


def test_metrics_match_hand_computation():
    probs = torch.tensor([[0.93, 0.07], [0.29, 0.71], [0.64, 0.36], [0.18, 0.82]])  # away from bin edges
    labels = torch.tensor([0, 1, 1, 0])
    metrics = classification_metrics(probs, labels, bins=10)
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["nll"] == pytest.approx(-(math.log(0.93) + math.log(0.71) + math.log(0.36) + math.log(0.18)) / 4)
    # confidences 0.93 (right), 0.71 (right), 0.64 (wrong), 0.82 (wrong): one per bin, |conf - acc| each.
    assert metrics["ece"] == pytest.approx((0.07 + 0.29 + 0.64 + 0.82) / 4, rel=1e-6)


def test_ece_pools_examples_within_a_bin():
    confidence = torch.tensor([0.62, 0.68, 0.95, 0.91])
    correct = torch.tensor([1.0, 0.0, 1.0, 1.0])
    # Bin (0.6, 0.7]: mean conf 0.65, acc 0.5; bin (0.9, 1.0]: mean conf 0.93, acc 1.
    expected = 0.5 * abs(0.65 - 0.5) + 0.5 * abs(0.93 - 1.0)
    assert expected_calibration_error(confidence, correct, bins=10) == pytest.approx(expected)


def test_perfectly_calibrated_certain_predictions():
    probs = torch.eye(3)
    metrics = classification_metrics(probs, torch.tensor([0, 1, 2]))
    assert metrics.pop("reliability")["count"][-1] == 3  # all in the top bin
    assert metrics == pytest.approx({"accuracy": 1.0, "nll": 0.0, "ece": 0.0})


def test_reliability_bins_are_the_ece_bins():
    probs = torch.tensor([[0.62, 0.38], [0.68, 0.32], [0.95, 0.05], [0.91, 0.09], [0.35, 0.65]])
    labels = torch.tensor([0, 1, 0, 0, 1])
    bins = classification_metrics(probs, labels, bins=10)["reliability"]
    # (0.6, 0.7]: 0.62 (right), 0.65 (right), 0.68 (wrong); (0.9, 1.0]: 0.95, 0.91 (both right); the rest empty.
    assert bins["count"] == [0, 0, 0, 0, 0, 0, 3, 0, 0, 2]
    assert bins["confidence"][6] == pytest.approx((0.62 + 0.65 + 0.68) / 3)
    assert bins["accuracy"][6] == pytest.approx(2 / 3) and bins["accuracy"][9] == pytest.approx(1.0)
    assert bins["confidence"][0] is None and bins["accuracy"][0] is None
    ece = sum(n * abs(c - a) for n, c, a in zip(bins["count"], bins["confidence"], bins["accuracy"]) if n) / 5
    assert classification_metrics(probs, labels, bins=10)["ece"] == pytest.approx(ece)


def test_confident_mistake_has_finite_nll():
    metrics = classification_metrics(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    assert metrics["nll"] == pytest.approx(-math.log(1e-12))


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="probs must be"):
        classification_metrics(torch.ones(3, 2) / 2, torch.tensor([0, 1]))


def test_the_maximum_calibration_error_is_the_largest_gap_of_a_filled_bin():
    confidence = torch.tensor([0.05, 0.15, 0.15, 0.95, 1.0])
    correct = torch.tensor([False, True, False, True, True])
    # gaps: bin 1 |0 - 0.05|, bin 2 |0.5 - 0.15|, bin 10 |1 - 0.975|; the empty bins count for nothing
    assert maximum_calibration_error(confidence, correct, bins=10) == pytest.approx(0.35)
    assert expected_calibration_error(confidence, correct, bins=10) == pytest.approx((0.05 + 2 * 0.35 + 2 * 0.025) / 5)
    assert maximum_calibration_error(torch.ones(3), torch.ones(3, dtype=torch.bool)) == 0.0


def pairwise_auc(members: np.ndarray, others: np.ndarray) -> float:
    """P(member loss < other loss) + ½ P(tie), counted over every pair."""
    lower = (members[:, None] < others[None, :]).mean()
    tied = (members[:, None] == others[None, :]).mean()
    return float(lower + tied / 2)


def test_the_membership_auc_is_the_pairwise_probability_with_ties_half():
    assert membership_auc(np.array([1.0, 2.0]), np.array([2.0, 3.0])) == pytest.approx(3.5 / 4)
    assert membership_auc(np.array([1.0, 3.0]), np.array([2.0, 2.0])) == pytest.approx(0.5)
    generator = np.random.default_rng(0)
    members, others = generator.integers(0, 20, 50).astype(float), generator.integers(5, 25, 70).astype(float)
    assert membership_auc(members, others) == pytest.approx(pairwise_auc(members, others))
    with pytest.raises(ValueError, match="at least one member"):
        membership_auc(np.array([]), others)


def test_the_class_matched_auc_compares_within_classes_weighted_by_the_members():
    # The members are all of class 0, which the model knows well; the others' class 1 it knows badly. The members look
    # no more familiar than unseen examples of class 0, so the class-matched AUC is ½ where the plain one is 1.
    members, member_labels = np.array([0.1, 0.2, 0.3]), np.zeros(3, dtype=int)
    others, other_labels = np.array([0.1, 0.2, 0.3, 5.0, 6.0]), np.array([0, 0, 0, 1, 1])
    assert membership_auc(members, np.array([5.0, 6.0])) == 1.0
    assert class_matched_membership_auc(members, member_labels, others, other_labels) == pytest.approx(0.5)
    # Class 0: every member below every other (1); class 1: above (0); three members against one: ¾.
    members, member_labels = np.array([0.1, 0.1, 0.1, 9.0]), np.array([0, 0, 0, 1])
    others, other_labels = np.array([1.0, 2.0]), np.array([0, 1])
    assert class_matched_membership_auc(members, member_labels, others, other_labels) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="no class of the members"):
        class_matched_membership_auc(members, member_labels + 5, others, other_labels)
