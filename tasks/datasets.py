"""Image classification datasets as in-memory tensors.

Fashion-MNIST comes from the Debian package `dataset-fashion-mnist` by default, read with a small
IDX reader, so the common case needs neither torchvision's folder layout nor a network. Every other
case goes through torchvision with a user-given root. Images are preloaded once as float tensors
because per-item transforms through a DataLoader are several times slower than indexing a tensor.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DEBIAN_FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # apt-get install dataset-fashion-mnist

DATASETS = ("fmnist", "mnist", "cifar10", "cifar100")
NPZ_PREFIX = "npz:"  # dataset "npz:DIR": a user's own .npz files (tasks/npzdata.py)

_TORCHVISION_CLASSES = {"fmnist": "FashionMNIST", "mnist": "MNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}
NUM_CLASSES = {"fmnist": 10, "mnist": 10, "cifar10": 10, "cifar100": 100}

_IDX_UBYTE_TYPE = 0x08  # IDX type code for unsigned bytes, the only one the MNIST-style files use
MAX_IDX_BYTES = 2**30  # what an IDX file's header may declare: Fashion-MNIST's largest (training images) is 47 MB


class DatasetNotFoundError(FileNotFoundError):
    """The dataset files are not where we looked; the message says how to get them."""


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors elementwise has no single truth value
class Dataset:
    """A labelled image set held in memory. Treat the tensors as read-only: loads are cached.

    Pixels stay in their stored dtype (uint8 for the image files) until `images` is first read, so a
    client that keeps 600 of 60,000 examples converts only those: every ClientApp is a fresh
    process, and converting the whole training set each round dominated its start-up.
    """

    name: str
    pixels: torch.Tensor  # shape (N, C, H, W), as stored (uint8 for the image datasets)
    labels: torch.Tensor  # int64, shape (N,)
    num_classes: int
    pixel_scale: float = 1.0 / 255.0  # images = pixels * pixel_scale; 1/255 maps uint8 to [0, 1]

    @functools.cached_property
    def images(self) -> torch.Tensor:
        """The images a model sees, converted on first read and kept.

        Returns:
            float32, shape (N, C, H, W): pixels * pixel_scale ([0, 1] by default).
        """
        return scaled_images(self.pixels, self.pixel_scale)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one image, (C, H, W)."""
        return tuple(self.pixels.shape[1:])

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices) -> Dataset:
        """The examples at `indices`, in that order.

        Args:
            indices: positions 0 <= i < len(self), any integer array-like; repeats repeat an example.

        Returns:
            A dataset of those examples, with this one's name, class count and pixel scale.
        """
        index = torch.as_tensor(indices, dtype=torch.long)
        return Dataset(self.name, self.pixels[index], self.labels[index], self.num_classes, self.pixel_scale)

    def by_class(self) -> Dataset:
        """The examples class by class, each class's in their order here (run config `row-order = "by-class"`).

        Returns:
            The same examples, sorted by label (stable).
        """
        return self.subset(torch.argsort(self.labels, stable=True))

    def scaled(self, factor: float) -> Dataset:
        """Images multiplied by `factor` (run config `input-scale`; 255 feeds raw 0-255 pixels).

        Args:
            factor: what `images` is multiplied by, on top of the pixel scale.

        Returns:
            This dataset itself for a factor of 1, else one sharing its pixels and labels with the pixel scale times
            `factor`.
        """
        if factor == 1.0:
            return self
        return Dataset(self.name, self.pixels, self.labels, self.num_classes, self.pixel_scale * factor)


def scaled_images(pixels: torch.Tensor, pixel_scale: float) -> torch.Tensor:
    """What a model sees of stored `pixels` (a Dataset's images; `fedbayes predict`).

    Args:
        pixels: examples as stored, any dtype and shape.
        pixel_scale: the factor the pixels are multiplied by (1/255 maps uint8 to [0, 1]).

    Returns:
        float32 pixels * pixel_scale, contiguous, in `pixels`' shape.
    """
    return (pixels.to(torch.float32) * pixel_scale).contiguous()


def load_dataset(name: str, train: bool, data_root: str = "", download: bool = False) -> Dataset:
    """Load the train or test split of `name`. Results are cached per process, so clients and the evaluator sharing a
    process load each split once.

    Args:
        name: one of DATASETS, or "npz:DIR" (tasks/npzdata.py).
        train: True for the training split, False for the test split.
        data_root: a torchvision dataset folder; empty: "fmnist" is read from the Debian package, the other built-in
            datasets cannot be read. Not used for "npz:DIR".
        download: let torchvision fetch a missing dataset into `data_root`.

    Returns:
        The split's pixels (uint8 for the built-in datasets, (N, C, H, W)), labels and class count.

    Raises:
        ValueError: `name` is not a known dataset, or a data file is corrupt.
        DatasetNotFoundError: the dataset's files are not where they were looked for (the message says how to get
            them).
        ModuleNotFoundError: the dataset needs torchvision, which this install lacks.
        NpzDataError: an "npz:DIR" folder or file is refused (tasks/npzdata.py).
    """
    if name not in DATASETS and not name.startswith(NPZ_PREFIX):
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}, or npz:DIR")
    return _load_cached(name, bool(train), str(data_root), bool(download))


@functools.cache
def _load_cached(name: str, train: bool, data_root: str, download: bool) -> Dataset:
    if name.startswith(NPZ_PREFIX):  # bring your own data: train.npz / test.npz
        from fedbayes.tasks.npzdata import load_npz_split

        return load_npz_split(name, train)
    if data_root:
        return _load_torchvision(name, train, data_root, download)
    if name == "fmnist":
        return _load_debian_fmnist(train)
    raise DatasetNotFoundError(
        f"dataset {name!r} needs --data-root (a torchvision dataset folder); "
        "pass download=true to fetch it into that folder"
    )


def _load_debian_fmnist(train: bool) -> Dataset:
    split = "train" if train else "t10k"
    image_path = DEBIAN_FMNIST_DIR / f"{split}-images-idx3-ubyte.gz"
    label_path = DEBIAN_FMNIST_DIR / f"{split}-labels-idx1-ubyte.gz"
    missing = [str(path) for path in (image_path, label_path) if not path.is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"Fashion-MNIST files not found: {', '.join(missing)}. "
            "Run `apt-get install dataset-fashion-mnist` (as root) "
            "or pass --data-root with torchvision's FashionMNIST layout"
        )
    pixels = _read_idx_cached(image_path, ndim=3)
    labels = _read_idx_cached(label_path, ndim=1)
    if len(pixels) != len(labels):
        raise ValueError(f"{image_path} has {len(pixels)} images but {label_path} has {len(labels)} labels")
    return _dataset_from_uint8("fmnist", torch.from_numpy(pixels).unsqueeze(1), torch.from_numpy(labels))


def cache_dir() -> Path:
    """Where decoded dataset files are cached: $FEDBAYES_CACHE_DIR, else ~/.cache/fedbayes.

    Returns:
        The cache folder (not created here).
    """
    return Path(os.environ.get("FEDBAYES_CACHE_DIR") or Path.home() / ".cache" / "fedbayes")


def _read_idx_cached(path: Path, ndim: int) -> np.ndarray:
    """`read_idx_ubyte_gz` behind an on-disk .npy cache keyed by the file's path, size and mtime:
    every ClientApp is a fresh process, and un-gzipping 26 MB each time cost ~0.5 s per client round."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / f"{path.name}-{key}.npy"
    try:
        return np.load(cached, allow_pickle=False)
    except (FileNotFoundError, ValueError, OSError):
        pass  # absent or unreadable: rebuild it from the source file below
    array = read_idx_ubyte_gz(path, ndim)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cached.parent, suffix=".tmp", delete=False) as temp:
            np.save(temp, array, allow_pickle=False)
        os.replace(temp.name, cached)
    except OSError as error:
        logging.getLogger(__name__).warning(
            "cannot cache %s in %s (%s); reading the .gz each time", path, cached, error
        )
    return array


def read_idx_ubyte_gz(path: Path, ndim: int, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """Read a gzipped IDX file of unsigned bytes (the MNIST file format). A gzip file of a few MiB can decompress to
    gigabytes, so the header's shape is checked against `max_bytes` first, and no more than it declares is
    decompressed.

    Args:
        path: the .gz file.
        ndim: the array's dimensions (3 for images, 1 for labels); the magic number must say the same.
        max_bytes: the largest array the header may declare, in bytes.

    Returns:
        The uint8 array, writable, of the header's shape.

    Raises:
        ValueError: the file is not readable gzip, its magic number is not that of `ndim`-dimensional unsigned bytes,
            its header is cut short or declares over `max_bytes`, or it holds fewer or more bytes than it declares.
    """
    header_size = 4 + 4 * ndim
    expected_magic = bytes([0, 0, _IDX_UBYTE_TYPE, ndim])
    try:
        with gzip.open(path, "rb") as file:
            header = file.read(header_size)
            if header[:4] != expected_magic:
                raise ValueError(
                    f"{path}: bad IDX magic number {header[:4].hex()} (expected {expected_magic.hex()}); "
                    "the file is corrupt or not an IDX file"
                )
            if len(header) < header_size:
                raise ValueError(f"{path}: its IDX header is cut short ({len(header)} of {header_size} bytes)")
            dims = tuple(int(d) for d in np.frombuffer(header, dtype=">u4", count=ndim, offset=4))
            size = math.prod(dims)
            if size > max_bytes:
                raise ValueError(f"{path}: header says shape {dims}, {size} bytes, over the {max_bytes} read here")
            raw = file.read(size + 1)  # one more: a file that holds more than its header says is refused too
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError; a truncated file is EOFError
        raise ValueError(f"{path}: not a readable gzip file ({err})") from err
    if len(raw) != size:
        held = "more than that" if len(raw) > size else f"{len(raw)} data bytes"
        raise ValueError(f"{path}: header says shape {dims} but the file holds {held}")
    # bytearray makes the array writable, so torch.from_numpy can share it without a warning.
    return np.frombuffer(bytearray(raw), dtype=np.uint8).reshape(dims)


def _load_torchvision(name: str, train: bool, data_root: str, download: bool) -> Dataset:
    # Imported here: torchvision costs ~1.2 s per process, every ClientApp is a fresh process, and the small
    # client install (deploy/install-client.sh: clients with .npz data) leaves it out.
    try:
        from torchvision import datasets as tv_datasets
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"dataset {name!r} from a torchvision folder ({data_root}) needs torchvision, which this install lacks: "
            "pip install torchvision (pyproject.toml pins the version), or give the client an .npz data-path"
        ) from None

    dataset_class = getattr(tv_datasets, _TORCHVISION_CLASSES[name])
    try:
        source = dataset_class(root=data_root, train=train, download=download)
    except RuntimeError as err:
        if "Dataset not found" not in str(err):
            raise
        raise DatasetNotFoundError(
            f"dataset {name!r} not found under {data_root} (torchvision {dataset_class.__name__} layout); "
            "pass download=true to fetch it there"
        ) from err
    # Read the raw arrays directly: torchvision's per-item PIL transforms are far slower.
    if isinstance(source.data, np.ndarray):  # CIFAR stores NHWC uint8 numpy arrays
        pixels = torch.from_numpy(source.data).permute(0, 3, 1, 2)
    else:  # MNIST-style datasets store (N, H, W) uint8 tensors
        pixels = source.data.unsqueeze(1)
    return _dataset_from_uint8(name, pixels, torch.as_tensor(source.targets))


def _dataset_from_uint8(name: str, pixels: torch.Tensor, labels: torch.Tensor) -> Dataset:
    return Dataset(name, pixels.contiguous(), labels.to(torch.int64), NUM_CLASSES[name])
