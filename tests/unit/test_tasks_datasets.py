"""Dataset loading: the Debian Fashion-MNIST files, torchvision's layout, and the error paths."""

import gzip

import numpy as np
import pytest
import torch

from fedbayes.tasks import datasets
from fedbayes.tasks.datasets import DatasetNotFoundError, load_dataset


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file (the MNIST format) holding a uint8 array."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def as_uint8(dataset, count):
    """The first `count` examples back as the raw (N, 28, 28) pixels and labels."""
    pixels = (dataset.images[:count, 0] * 255).round().to(torch.uint8).numpy()
    return pixels, dataset.labels[:count].numpy()


@pytest.fixture
def fresh_cache():
    """Tests that move DEBIAN_FMNIST_DIR must not see (or leave behind) cached loads."""
    datasets._load_cached.cache_clear()
    yield
    datasets._load_cached.cache_clear()


def test_debian_fmnist_train_and_test():
    train = load_dataset("fmnist", train=True)
    test = load_dataset("fmnist", train=False)
    assert len(train) == 60000 and len(test) == 10000
    assert train.images.shape == (60000, 1, 28, 28) and train.images.dtype == torch.float32
    assert train.labels.dtype == torch.int64 and train.num_classes == 10 and train.input_shape == (1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    assert torch.bincount(test.labels).tolist() == [1000] * 10
    assert train.labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert train.images.min() == 0.0 and train.images.max() == 1.0


def test_loads_are_cached():
    assert load_dataset("fmnist", True) is load_dataset("fmnist", train=True, data_root="")


def test_subset_keeps_the_chosen_examples_in_order():
    train = load_dataset("fmnist", True)
    part = train.subset(np.array([5, 0, 2]))
    assert part.labels.tolist() == [2, 9, 0]
    assert torch.equal(part.images[1], train.images[0]) and part.num_classes == 10


def test_torchvision_layout_gives_the_same_values(tmp_path):
    debian_train, debian_test = load_dataset("fmnist", True), load_dataset("fmnist", False)
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for split, source, count in (("train", debian_train, 100), ("t10k", debian_test, 50)):
        pixels, labels = as_uint8(source, count)
        (raw / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(pixels))
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(labels))

    train = load_dataset("fmnist", True, data_root=str(tmp_path))
    test = load_dataset("fmnist", False, data_root=str(tmp_path))
    assert len(train) == 100 and len(test) == 50
    assert torch.equal(train.images, debian_train.images[:100])
    assert torch.equal(train.labels, debian_train.labels[:100])
    assert torch.equal(test.images, debian_test.images[:50])
    assert train.images.dtype == torch.float32 and train.labels.dtype == torch.int64


def test_missing_torchvision_root_is_reported(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="download=true"):
        load_dataset("fmnist", True, data_root=str(tmp_path / "nowhere"))


def test_non_debian_dataset_needs_a_data_root():
    with pytest.raises(DatasetNotFoundError, match="--data-root"):
        load_dataset("cifar10", True)


def test_missing_debian_package_says_what_to_install(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.setattr(datasets, "DEBIAN_FMNIST_DIR", tmp_path)
    with pytest.raises(DatasetNotFoundError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fmnist", True)


def test_corrupt_idx_file_is_named(tmp_path, monkeypatch, fresh_cache):
    bad_magic = bytearray(idx_bytes(np.zeros((2, 28, 28), dtype=np.uint8)))
    bad_magic[2] = 0x0D  # float type code: not the unsigned-byte file we expect
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(bytes(bad_magic)))
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(2, dtype=np.uint8))))
    monkeypatch.setattr(datasets, "DEBIAN_FMNIST_DIR", tmp_path)
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte.gz: bad IDX magic"):
        load_dataset("fmnist", False)


def test_truncated_idx_file_is_named(tmp_path):
    truncated = idx_bytes(np.zeros((2, 28, 28), dtype=np.uint8))[:-1]
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(truncated))
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz: header says shape"):
        datasets.read_idx_ubyte_gz(path, ndim=3)


def test_unknown_dataset_lists_the_choices():
    with pytest.raises(ValueError, match="fmnist, mnist, cifar10, cifar100"):
        load_dataset("imagenet", True)
