"""Accuracy, NLL and ECE against hand computations."""

import math

import pytest
import torch

from fedbayes.bayes.metrics import classification_metrics, expected_calibration_error


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
