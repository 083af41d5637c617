"""What a predictive's uncertainty is for, against hand computations: AUROC (ranks, ties counted half, undefined
with one class), misclassification and OOD AUROC, selective accuracy (ties at the cut shared), the row's keys
(posterior/uncertainty.py), and the OOD inputs (tasks/ood.py): fixed by the seed, in the test set's range."""

import itertools
import math

import pytest
import torch

from fedbayes.bayes.metrics import auroc, misclassification_auroc, ood_auroc, selective_accuracy
from fedbayes.posterior.uncertainty import predictive, uncertainty_metrics
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.ood import ood_inputs


def pairwise_auroc(scores: list[float], positives: list[bool]) -> float:
    """The definition: over every (positive, negative) pair, 1 if the positive scores higher, 1/2 for a tie."""
    pairs = [
        1.0 if p > n else 0.5 if p == n else 0.0
        for (p, is_p), (n, is_n) in itertools.product(zip(scores, positives), repeat=2)
        if is_p and not is_n
    ]
    return sum(pairs) / len(pairs)


def test_auroc_counts_the_ordered_pairs():
    # positives 0.35 and 0.8 against negatives 0.1 and 0.4: 0.35 > 0.1, 0.35 < 0.4, 0.8 > both: 3 of 4
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    assert auroc(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([False, True, True])) == 1.0
    assert auroc(torch.tensor([3.0, 2.0, 1.0]), torch.tensor([False, True, True])) == 0.0


def test_auroc_counts_a_tie_as_half_a_pair():
    # positives 2 and 3 against negatives 1 and 2: 2 > 1, 2 = 2 (one half), 3 > both: 3.5 of 4
    assert auroc(torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([0, 1, 0, 1])) == 0.875
    assert auroc(torch.full((5,), 0.3), torch.tensor([1, 0, 1, 0, 0])) == 0.5  # all tied: chance


def test_auroc_is_the_pairwise_definition_on_many_ties_in_any_order():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (40,), generator=generator).double()  # four values: ties everywhere
    positives = torch.rand(40, generator=generator) < 0.3
    expected = pairwise_auroc(scores.tolist(), positives.tolist())
    assert auroc(scores, positives) == pytest.approx(expected, abs=1e-12)
    order = torch.randperm(40, generator=generator)
    assert auroc(scores[order], positives[order]) == pytest.approx(expected, abs=1e-12)
    assert auroc(scores.exp(), positives) == pytest.approx(expected, abs=1e-12)  # ranks only


def test_auroc_with_one_class_only_is_undefined_not_an_error():
    assert auroc(torch.tensor([0.2, 0.7]), torch.tensor([1, 1])) is None
    assert auroc(torch.tensor([0.2, 0.7]), torch.tensor([0, 0])) is None
    assert auroc(torch.tensor([]), torch.tensor([], dtype=torch.bool)) is None


def test_auroc_refuses_nan_and_mismatched_shapes():
    with pytest.raises(ValueError, match="NaN"):
        auroc(torch.tensor([0.1, math.nan]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="one entry per example"):
        auroc(torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 1]))


def test_misclassification_auroc_ranks_the_mistakes_as_positives():
    uncertainty = torch.tensor([0.1, 0.9, 0.5, 0.6])
    # the mistakes (0.9, 0.5) against the right ones (0.1, 0.6): 0.9 > both, 0.5 > 0.1, 0.5 < 0.6: 3 of 4
    assert misclassification_auroc(uncertainty, torch.tensor([True, False, False, True])) == 0.75
    assert misclassification_auroc(uncertainty, torch.ones(4, dtype=torch.bool)) is None  # every one right


def test_ood_auroc_ranks_the_ood_inputs_as_positives():
    # OOD 0.5 and 0.7 against test 0.1 and 0.5: 0.5 > 0.1, 0.5 = 0.5 (one half), 0.7 > both: 3.5 of 4
    assert ood_auroc(torch.tensor([0.1, 0.5]), torch.tensor([0.5, 0.7])) == 0.875
    assert ood_auroc(torch.tensor([0.1, 0.5]), torch.tensor([])) is None


def two_class(confidences: list[float], correct: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities (c, 1 - c), c > 1/2, and labels that make each prediction right or wrong."""
    c = torch.tensor(confidences)
    return torch.stack([c, 1 - c], dim=1), torch.tensor([0 if right else 1 for right in correct])


def test_selective_accuracy_keeps_the_surest_share():
    probs, labels = two_class([0.9, 0.6, 0.8, 0.7, 0.55], [True, True, False, True, False])
    assert selective_accuracy(probs, labels, 0.6) == pytest.approx(2 / 3)  # 0.9, 0.8, 0.7: right, wrong, right
    assert selective_accuracy(probs, labels, 1.0) == pytest.approx(3 / 5)  # all: the accuracy
    assert selective_accuracy(probs, labels, 0.1) == 1.0  # round(0.5) = 0 examples: at least one, the surest


def test_selective_accuracy_shares_the_places_left_among_ties_whatever_their_order():
    # keep 2 of 5: 0.9 (right), then one place among three tied at 0.7, of which one is right: (1 + 1/3) / 2
    probs, labels = two_class([0.9, 0.7, 0.7, 0.7, 0.6], [True, True, False, False, True])
    assert selective_accuracy(probs, labels, 0.4) == pytest.approx(2 / 3)
    order = torch.tensor([3, 1, 4, 0, 2])
    assert selective_accuracy(probs[order], labels[order], 0.4) == pytest.approx(2 / 3)


@pytest.mark.parametrize("coverage", [0.0, -0.5, 1.5])
def test_selective_accuracy_refuses_a_coverage_outside_0_1(coverage):
    probs, labels = two_class([0.9], [True])
    with pytest.raises(ValueError, match="coverage"):
        selective_accuracy(probs, labels, coverage)


def test_the_row_keys_of_one_model_and_of_an_ensemble():
    # two members: sure and agreeing on examples 0 and 1 (right), opposite on example 2 (wrong: the mean is 50/50)
    members = torch.tensor([[[0.9, 0.1], [0.2, 0.8], [1.0, 0.0]], [[0.9, 0.1], [0.2, 0.8], [0.0, 1.0]]])
    labels = torch.tensor([0, 1, 1])
    ood = predictive(torch.tensor([[[0.6, 0.4]], [[0.4, 0.6]]]))  # entropy log 2, MI log 2 - H(0.6)
    metrics = uncertainty_metrics(predictive(members), labels, ood)
    # entropies H(0.1), H(0.2), log 2 and MI 0, 0, log 2: the mistake has the most of both
    assert metrics["misclassification_auroc"] == 1.0 and metrics["misclassification_auroc_mi"] == 1.0
    # OOD log 2 against test H(0.1), H(0.2), log 2: 2 pairs won, one tied; MI 0.020 against 0, 0, log 2: 2 of 3
    assert metrics["ood_auroc"] == pytest.approx(2.5 / 3) and metrics["ood_auroc_mi"] == pytest.approx(2 / 3)
    assert metrics["selective_accuracy_80"] == pytest.approx(1.0)  # round(2.4) = 2 kept: the two right ones
    one = uncertainty_metrics(predictive(members[:1]), labels, predictive(torch.tensor([[[0.6, 0.4]]])))
    assert set(one) == {"misclassification_auroc", "ood_auroc", "selective_accuracy_80"}  # no MI of one model
    assert uncertainty_metrics(predictive(members), labels, None)["ood_auroc_mi"] is None
    with pytest.raises(ValueError, match="members"):
        uncertainty_metrics(predictive(members), labels, predictive(members[:1]))


def features(count: int = 6, constant: bool = True) -> Dataset:
    """`count` examples of 2 x 3 features, all values distinct but (`constant`) feature (0, 0), 1000 everywhere."""
    pixels = torch.arange(count * 6, dtype=torch.float32).reshape(count, 1, 2, 3)
    if constant:
        pixels[:, 0, 0, 0] = 1000.0
    return Dataset("t", pixels, torch.zeros(count, dtype=torch.long), 2, pixel_scale=0.5)


def test_noise_lies_in_each_features_test_range_and_is_fixed_by_the_seed():
    test = features()
    noise = ood_inputs("noise", test, seed=3, count=4)
    low, high = test.images.amin(0), test.images.amax(0)
    assert noise.shape == (4, 1, 2, 3) and bool(((noise >= low) & (noise <= high)).all())
    assert bool((noise[:, 0, 0, 0] == 500.0).all())  # a constant feature stays constant
    assert torch.equal(noise, ood_inputs("noise", test, seed=3, count=4))
    assert not torch.equal(noise, ood_inputs("noise", test, seed=4, count=4))
    assert len(ood_inputs("noise", test, seed=3)) == 6  # no more than the test set


def test_inverted_inputs_mirror_test_inputs_within_each_features_range():
    test = features()
    low, high = test.images.amin(0), test.images.amax(0)
    mirrored = {tuple((low + high - image).flatten().tolist()) for image in test.images}
    inverted = ood_inputs("inverted", test, seed=0, count=3)
    assert len(inverted) == 3 and all(tuple(row.flatten().tolist()) in mirrored for row in inverted)
    assert len({tuple(row.flatten().tolist()) for row in inverted}) == 3  # three different test inputs


def test_permuted_inputs_shuffle_every_inputs_features_the_same_way():
    test = features(constant=False)
    permuted = ood_inputs("permuted", test, seed=0, count=6).flatten(1)
    originals = {tuple(sorted(image.flatten().tolist())): image.flatten() for image in test.images}
    order = None
    for row in permuted:
        original = originals[tuple(sorted(row.tolist()))]  # the same values
        # where each original feature went (every feature but the constant one is distinct within an input)
        moved = [int((original == value).nonzero()[0]) for value in row.tolist()]
        order = order or moved
        assert moved == order
    assert order != sorted(order)


def test_no_ood_inputs_and_an_unknown_kind():
    assert ood_inputs("none", features(), seed=0) is None
    with pytest.raises(ValueError, match="ood-inputs must be one of noise, inverted, permuted, none"):
        ood_inputs("mnist", features(), seed=0)


@pytest.mark.parametrize("kind", ["noise", "inverted", "permuted"])
def test_tabular_data_gets_ood_inputs_of_its_shape_in_its_range(kind):
    features = torch.randn(50, 7, generator=torch.Generator().manual_seed(0)) * torch.arange(1.0, 8.0)  # scales differ
    test = Dataset("npz:t", features, torch.zeros(50, dtype=torch.long), 2)
    inputs = ood_inputs(kind, test, seed=0, count=20)
    assert inputs.shape == (20, 7) and inputs.dtype == torch.float32
    if kind != "permuted":  # which moves values between features of different ranges
        assert bool(((inputs >= test.images.amin(0)) & (inputs <= test.images.amax(0))).all())
