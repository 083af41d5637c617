"""benchmarks/forget.py's membership-inference attacks: the plain loss-threshold AUC against its pairwise definition,
and the per-class one, which a client's skewed classes do not move; its report over seeds and its targets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.forget import (
    class_matched_membership_auc,
    meets_targets,
    membership_auc,
    seeds_report,
    write_summary,
)


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


def model(test_accuracy: float, mia_auc: float, own_accuracy: float = 0.5) -> dict:
    return {"test_accuracy": test_accuracy, "own_accuracy": own_accuracy, "mia_auc": mia_auc}


def test_the_targets_read_accuracy_one_sided_and_the_auc_both_ways():
    reference = model(0.80, 0.40)
    assert meets_targets(model(0.791, 0.419), reference)
    assert meets_targets(model(0.85, 0.381), reference)  # a more accurate model passes
    assert not meets_targets(model(0.789, 0.40), reference)  # more than a point below
    assert not meets_targets(model(0.80, 0.421), reference) and not meets_targets(model(0.80, 0.379), reference)


def test_the_report_gives_the_per_seed_differences_mean_and_standard_error_and_the_runs_within_targets(tmp_path):
    retrained = [model(0.80, 0.40, 0.70), model(0.70, 0.50, 0.60), model(0.75, 0.45, 0.65)]
    refined = [model(0.81, 0.41, 0.72), model(0.70, 0.53, 0.66), model(0.73, 0.45, 0.65)]  # AUC +0.01, +0.03, 0
    for seed in range(3):
        entry = {"strategy": "feddyn", "retrained": retrained[seed], "refined": refined[seed]}
        entry |= {"forgotten": None, "full": None, "retrained_longer": None}  # not measured: no row
        fedavg = {"strategy": "fedavg", "retrained": retrained[seed], "refined": None, "full": retrained[seed]}
        (tmp_path / f"summary-seed{seed}.json").write_text(json.dumps([entry, fedavg]))
    lines = seeds_report([tmp_path]).splitlines()
    rows = [line for line in lines if line.startswith("| feddyn")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    # test accuracy: +1, 0, -2 points: mean -0.33, sd 1.53, se 0.88; own: +2, +6, 0; AUC: sd 0.0153, se 0.0088
    assert cells[:4] == ["feddyn", "forgotten + refined", "retrained", "3"]
    assert cells[4:] == ["-0.3 ± 0.9", "+2.7 ± 1.8", "+0.013 ± 0.009", "0.015", "1 of 3"]
    assert [line for line in lines if line.startswith("| fedavg")] == [
        "| fedavg | all 10 clients | retrained | 3 | +0.0 ± 0.0 | +0.0 ± 0.0 | +0.000 ± 0.000 | 0.000 | 3 of 3 |"
    ]
    assert seeds_report([tmp_path / "none"]) == f"no summaries in {tmp_path / 'none'}"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "summary-seed2.json").write_text(json.dumps([{"strategy": "feddyn"}]))
    with pytest.raises(SystemExit, match="feddyn seed 2: in more than one"):
        seeds_report([tmp_path, tmp_path / "other"])


def test_a_summary_keeps_the_strategies_a_run_did_not_run(tmp_path):
    path = tmp_path / "summary-seed0.json"
    write_summary(path, [{"strategy": "feddyn", "n": 1}, {"strategy": "dsvgd", "n": 1}])
    write_summary(path, [{"strategy": "fedavg", "n": 2}, {"strategy": "feddyn", "n": 2}])
    assert json.loads(path.read_text()) == [
        {"strategy": "feddyn", "n": 2},
        {"strategy": "dsvgd", "n": 1},
        {"strategy": "fedavg", "n": 2},
    ]
