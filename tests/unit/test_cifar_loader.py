"""The CIFAR-10/100 loaders on small files in the CIFAR python format that the test writes (these machines cannot
download CIFAR): torchvision's reader, our NHWC -> NCHW layout, labels, class counts, pixel scale, and the models
built on what they load. torchvision checks the real files' MD5 sums; the test's tiny files cannot match them, so
that one check is replaced by "the file exists"."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from fedbayes.tasks.datasets import DatasetNotFoundError, load_dataset
from fedbayes.tasks.models import build_model

LAYOUTS = {  # torchvision's folder, files and label key of each dataset
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        ["test_batch"],
        "labels",
        ("batches.meta", "label_names"),
    ),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "fine_labels", ("meta", "fine_label_names")),
}
CLASSES = {"cifar10": 10, "cifar100": 100}


def write_cifar(root, name: str, per_file: int = 3) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Files of `per_file` random images each; returns the (N, 3, 32, 32) pixels and labels of each split."""
    folder, train_files, test_files, label_key, (meta_file, meta_key) = LAYOUTS[name]
    directory = root / folder
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for split, files in (("train", train_files), ("test", test_files)):
        pixels, labels = [], []
        for file_name in files:
            data = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)  # rows: R plane, G plane, B plane
            targets = [int(t) for t in rng.integers(0, CLASSES[name], per_file)]
            (directory / file_name).write_bytes(pickle.dumps({"data": data, label_key: targets}))
            pixels.append(data.reshape(-1, 3, 32, 32))
            labels += targets
        written[split] = (np.concatenate(pixels), labels)
    (directory / meta_file).write_bytes(pickle.dumps({meta_key: [f"class-{c}" for c in range(CLASSES[name])]}))
    return written


@pytest.fixture
def files_exist_is_enough(monkeypatch):
    from torchvision.datasets import cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("train", [True, False])
def test_cifar_loads_channels_first_with_its_labels(tmp_path, files_exist_is_enough, name, train):
    written = write_cifar(tmp_path, name)
    pixels, labels = written["train" if train else "test"]
    dataset = load_dataset(name, train=train, data_root=str(tmp_path))
    assert dataset.input_shape == (3, 32, 32) and dataset.num_classes == CLASSES[name]
    np.testing.assert_array_equal(dataset.pixels.numpy(), pixels)
    assert dataset.labels.tolist() == labels and dataset.labels.dtype == torch.int64
    torch.testing.assert_close(dataset.images, torch.from_numpy(pixels).float() / 255)


@pytest.mark.parametrize("model", ["cnn-zenke", "cnn-acar", "resnet20"])
def test_the_models_classify_what_the_cifar100_loader_gives(tmp_path, files_exist_is_enough, model):
    write_cifar(tmp_path, "cifar100")
    dataset = load_dataset("cifar100", train=False, data_root=str(tmp_path))
    network = build_model(model, dataset.input_shape, dataset.num_classes).eval()
    assert network(dataset.images).shape == (len(dataset), 100)


def test_a_missing_cifar_folder_says_how_to_get_it(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="download=true"):
        load_dataset("cifar10", train=True, data_root=str(tmp_path))
