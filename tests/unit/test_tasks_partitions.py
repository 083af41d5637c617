"""Client splits: determinism, disjointness, coverage, the spec's Dirichlet statistics, edge cases."""

import numpy as np
import pytest

from fedbayes.tasks.partitions import (
    describe_partitions,
    partition_dataset,
    split_dirichlet,
    split_iid,
    split_two_class,
    training_subset,
)

BALANCED_LABELS = np.repeat(np.arange(10), 6000)  # the shape of FMNIST's training labels
SHUFFLED_LABELS = np.random.default_rng(123).permutation(BALANCED_LABELS)


def assert_disjoint_sorted_int64(partitions):
    for part in partitions:
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
    everything = np.concatenate(partitions)
    assert len(np.unique(everything)) == len(everything)


@pytest.mark.parametrize("split", ["iid", "dirichlet", "two-class"])
def test_same_seed_same_split_other_seed_differs(split):
    options = {"per_class": 30} if split == "two-class" else {}
    first = partition_dataset(SHUFFLED_LABELS, 10, split, seed=3, fraction=0.1, **options)
    again = partition_dataset(SHUFFLED_LABELS, 10, split, seed=3, fraction=0.1, **options)
    other = partition_dataset(SHUFFLED_LABELS, 10, split, seed=4, fraction=0.1, **options)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("split", ["iid", "dirichlet"])
def test_split_covers_the_subset_exactly(split):
    parts = partition_dataset(SHUFFLED_LABELS, 7, split, seed=0, fraction=0.1)
    assert_disjoint_sorted_int64(parts)
    assert sum(len(part) for part in parts) == 6000
    full = partition_dataset(SHUFFLED_LABELS, 7, split, seed=0)
    assert np.array_equal(np.sort(np.concatenate(full)), np.arange(60000))


def test_iid_sizes_differ_by_at_most_one():
    parts = split_iid(1003, 10, seed=0)
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1003))


def test_training_subset_is_a_new_ten_percent_per_seed():
    first, second = training_subset(60000, 0.1, seed=0), training_subset(60000, 0.1, seed=1)
    assert len(first) == len(second) == 6000
    assert len(np.unique(first)) == 6000 and np.all(np.diff(first) > 0)
    assert not np.array_equal(first, second)
    assert np.array_equal(training_subset(60000, 0.1, seed=0), first)
    assert np.array_equal(training_subset(50, 1.0, seed=0), np.arange(50))
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            training_subset(100, bad, seed=0)


def test_dirichlet_statistics_match_the_spec():
    # Spec §5.1 (2000 draws, K = 10, balanced 60k): top-2 client share median 0.44, top-6 0.87,
    # within-client share of the top 4 classes median 0.83.
    top2_shares, top6_shares, top4_class_shares = [], [], []
    for seed in range(200):
        parts = split_dirichlet(BALANCED_LABELS, 10, seed).partitions
        sizes = np.sort([len(part) for part in parts])[::-1]
        top2_shares.append(sizes[:2].sum() / 60000)
        top6_shares.append(sizes[:6].sum() / 60000)
        for part in parts:
            class_counts = np.sort(np.bincount(BALANCED_LABELS[part], minlength=10))[::-1]
            top4_class_shares.append(class_counts[:4].sum() / len(part))
    assert 0.38 <= np.median(top2_shares) <= 0.50
    assert 0.82 <= np.median(top6_shares) <= 0.92
    assert 0.75 <= np.median(top4_class_shares) <= 0.90


def test_dirichlet_redraws_until_every_client_is_big_enough():
    tiny = np.repeat(np.arange(2), 10)
    result = split_dirichlet(tiny, 5, seed=0, min_size=3)
    assert result.attempts > 1
    assert min(len(part) for part in result.partitions) >= 3
    assert np.array_equal(np.sort(np.concatenate(result.partitions)), np.arange(20))


def test_dirichlet_gives_up_after_max_attempts():
    with pytest.raises(ValueError, match="no Dirichlet split in 3 attempts"):
        split_dirichlet(np.repeat(np.arange(2), 10), 10, seed=0, min_size=2, max_attempts=3)


def test_dirichlet_rejects_impossible_or_bad_arguments():
    labels = np.repeat(np.arange(2), 10)
    with pytest.raises(ValueError, match="cannot give 10 clients 3 each"):
        split_dirichlet(labels, 10, seed=0, min_size=3)
    with pytest.raises(ValueError, match="alphas must be > 0"):
        split_dirichlet(labels, 2, seed=0, alpha_classes=0.0)


def test_two_class_clients_get_two_classes_without_sharing():
    parts = split_two_class(SHUFFLED_LABELS, 100, seed=0, per_class=300)
    assert_disjoint_sorted_int64(parts)
    for part in parts:
        counts = np.bincount(SHUFFLED_LABELS[part], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [300, 300]
    class_uses = sum(np.bincount(SHUFFLED_LABELS[part], minlength=10) > 0 for part in parts)
    assert class_uses.tolist() == [20] * 10  # balanced: all 60000 examples used exactly once


def test_two_class_running_out_names_the_class():
    with pytest.raises(ValueError, match=r"class \d has only 0 examples left for client 100"):
        split_two_class(SHUFFLED_LABELS, 101, seed=0, per_class=300)


def test_partition_indices_point_into_the_full_label_array():
    parts = partition_dataset(SHUFFLED_LABELS, 10, "two-class", seed=0, fraction=0.5, per_class=100)
    assert_disjoint_sorted_int64(parts)
    for part in parts:
        counts = np.bincount(SHUFFLED_LABELS[part], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [100, 100]


def test_partition_dataset_rejects_bad_arguments():
    with pytest.raises(ValueError, match="iid, dirichlet, two-class"):
        partition_dataset(SHUFFLED_LABELS, 10, "shards", seed=0)
    with pytest.raises(ValueError, match="num_clients must be >= 1"):
        partition_dataset(SHUFFLED_LABELS, 0, "iid", seed=0)
    with pytest.raises(ValueError, match="fraction"):
        partition_dataset(SHUFFLED_LABELS, 10, "iid", seed=0, fraction=0.0)


def test_describe_partitions_table():
    labels = np.array([0, 1, 1, 2, 2, 2])
    table = describe_partitions([np.array([0, 1]), np.array([2, 3, 4, 5])], labels, num_classes=3)
    assert table.splitlines() == [
        "client  size  0  1  2",
        "     0     2  1  1  0",
        "     1     4  0  1  3",
        " total     6  1  2  3",
    ]
