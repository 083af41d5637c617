"""Bring your own data: `dataset = "npz:DIR"`, .npz files in a folder.

DIR holds `test.npz` (the server evaluates on it) and the training data, either as `train.npz` (split among the
clients by the run's split, fraction and seed, like the built-in datasets) or as pre-partitioned `client-0.npz`
... `client-<K-1>.npz` (partition i goes to the client with partition-id i). Each file holds `x` (uint8 or
float, shape (N, ...): images (N,C,H,W) or (N,H,W), flat features (N,D)), `y` (integer labels 0..C-1, shape (N,))
and optionally `num_classes` (an integer scalar; otherwise C = 1 + the largest label over the folder's files).
`images`/`labels` are read as `x`/`y` (the spelling of client data files before this format). uint8 values are
scaled to [0, 1] like the built-in image files; floats are used as stored (then `input-scale` as usual).

Every file a process loads is checked in full; `inspect_folder` checks the folder's files against each other
(shapes, class count) from their headers and labels only, so a client does not read every other client's data.

An .npz is a zip archive, and an archive entry of a few KiB can say, or decompress to, gigabytes. So before an
array is read, its entry must be stored or deflated (what numpy writes; deflate expands at most DEFLATE_MAX_RATIO
fold), encrypted not, and its declared size must be what its .npy header's shape and dtype take, no more than its
compressed bytes can hold: reading it then costs what the file really holds.
"""

from __future__ import annotations

import io
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedbayes.tasks.datasets import NPZ_PREFIX, NUM_CLASSES, Dataset
from fedbayes.tasks.storage import OUTPUT_MODE, write_atomically

TRAIN_FILE, TEST_FILE = "train.npz", "test.npz"
_KEY_PAIRS = (("x", "y"), ("images", "labels"))
_CLIENT_FILE = re.compile(r"client-(0|[1-9][0-9]*)\.npz")  # no leading zeros: one name per index
DEFLATE_MAX_RATIO = 1032  # deflate's own bound: no deflate stream decompresses to more than 1032 x its size
_READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)  # what np.savez and np.savez_compressed write


class NpzDataError(ValueError):
    """An .npz data file or folder is missing or malformed; the message names the file and the problem."""


def npz_folder(dataset: str) -> Path | None:
    """The folder of an "npz:DIR" dataset name, None for the built-in datasets.

    Args:
        dataset: a run config's dataset name: a built-in one ("mnist", ...) or "npz:DIR".

    Returns:
        DIR as a path, or None when `dataset` does not start with "npz:".
    """
    return Path(dataset[len(NPZ_PREFIX) :]) if dataset.startswith(NPZ_PREFIX) else None


def client_file(folder: Path, index: int) -> Path:
    """The pre-partitioned training file of one client.

    Args:
        folder: an "npz:DIR" dataset's folder.
        index: the client's partition id, >= 0.

    Returns:
        `folder`/client-<index>.npz (whether it exists or not).
    """
    return folder / f"client-{index}.npz"


@dataclass(frozen=True)
class NpzHeader:
    """What one file says about itself without reading `x`'s values."""

    path: Path
    rows: int
    input_shape: tuple[int, ...]  # of one example; (H, W) images become (1, H, W)
    labels: np.ndarray  # int64 (N,)
    declared_classes: int | None  # the file's `num_classes`, if it has one


@dataclass(frozen=True)
class NpzFolder:
    path: Path
    client_files: int  # 0: the training set is train.npz (or absent where only test.npz is needed)
    has_train: bool
    input_shape: tuple[int, ...]
    num_classes: int


def read_header(path: Path) -> NpzHeader:
    """Keys, dtypes and shapes of `path`, and its labels, checked; `x` stays unread.

    Args:
        path: an .npz data file (`x` and `y`, or `images` and `labels`, optionally `num_classes`).

    Returns:
        The file's rows, the shape of one example ((H, W) images as (1, H, W)), its labels (int64, (N,)) and its
        declared class count (None without `num_classes`).

    Raises:
        NpzDataError: the file is missing or not an .npz, lacks the arrays or holds both spellings, an archive entry
            could cost more to read than the file holds, `x` is not uint8 or float of shape (N, ...) with N >= 1, the
            labels are not non-negative integers of shape (N,), `num_classes` is not an integer scalar, or a label is
            not below it.
    """
    with _open(path) as archive:
        x_key, y_key = _data_keys(path, archive.files)
        shape, dtype = _array_header(path, archive, x_key)
        _check_x_dtype(path, x_key, dtype, shape)
        labels = _read_labels(path, archive, y_key, shape[0])
        declared = _read_declared(path, archive) if "num_classes" in archive.files else None
    if declared is not None and declared <= labels.max():
        raise NpzDataError(f"{path}: label {labels.max()} is out of range for its num_classes={declared}")
    return NpzHeader(path, shape[0], _example_shape(shape), labels, declared)


def read_x(path: Path) -> np.ndarray:
    """`x` of `path`, checked.

    Args:
        path: an .npz data file.

    Returns:
        The examples as stored (uint8 or float, (N, ...)), (N, H, W) as (N, 1, H, W).

    Raises:
        NpzDataError: the file is missing, not an .npz, lacks its arrays, `x` is not uint8 or float of shape (N, ...)
            with N >= 1, an archive entry could cost more to read than the file holds, or `x` holds NaN or Inf.
    """
    with _open(path) as archive:
        x_key, _ = _data_keys(path, archive.files)
        x = _read_x(path, archive, x_key)
    return _checked_x(path, x_key, x)


def read_examples(path: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Examples to predict on (`fedbayes predict`).

    Args:
        path: an .npz holding `x`, and optionally labels (`y`, or `images` and `labels`).

    Returns:
        `x`, checked as read_x checks it, and the labels (int64, (N,)), checked as read_header checks them, or None
        for a file that holds `x` alone.

    Raises:
        NpzDataError: as read_x and read_header.
    """
    with _open(path) as archive:
        files = set(archive.files)
        if "x" in files and not files & {"y", "images", "labels"}:
            return _checked_x(path, "x", _read_x(path, archive, "x")), None
    return read_x(path), read_header(path).labels  # _data_keys names what a file with labels lacks


def pixel_scale_of(dtype: np.dtype) -> float:
    """The factor examples of `dtype` are scaled by before the run's input-scale.

    Args:
        dtype: the examples' dtype.

    Returns:
        1/255 for uint8, which holds 0-255 pixels (to [0, 1]); 1.0 for anything else (floats stay as stored).
    """
    return 1.0 / 255.0 if dtype == np.uint8 else 1.0


def _checked_x(path: Path, x_key: str, x: np.ndarray) -> np.ndarray:
    _check_x_dtype(path, x_key, x.dtype, x.shape)
    if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).reshape(len(x), -1).any(axis=1).argmax())
        raise NpzDataError(f"{path}: '{x_key}' holds NaN or Inf (first in row {bad})")
    return x[:, None] if x.ndim == 3 else x


def _open(path: Path):
    if not path.is_file():
        raise NpzDataError(f"{path}: no such file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise NpzDataError(f"{path}: not a readable .npz file ({error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):  # one .npy array: no keys to name its examples and labels
        raise NpzDataError(f"{path}: holds one .npy array, not an .npz archive of 'x' and 'y'")
    return archive


def _data_keys(path: Path, files: list[str]) -> tuple[str, str]:
    present = [pair for pair in _KEY_PAIRS if set(pair) <= set(files)]
    if len(present) != 1:
        problem = "has both x/y and images/labels" if present else f"has arrays {sorted(files)}"
        raise NpzDataError(f"{path}: {problem}; it needs 'x' (examples) and 'y' (labels)")
    return present[0]


def _array_header(path: Path, archive, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype `key`'s .npy header declares, once its archive entry's sizes agree with them (module
    docstring): the entry is checked before its header is read, the header before its data."""
    try:
        entry = archive.zip.getinfo(f"{key}.npy")
    except KeyError as error:
        raise NpzDataError(f"{path}: cannot read the header of '{key}' ({error})") from None
    _check_entry(path, key, entry)
    try:
        with archive.zip.open(entry) as member:
            version = np.lib.format.read_magic(member)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = reader(member)
            header_bytes = member.tell()
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise NpzDataError(f"{path}: cannot read the header of '{key}' ({error})") from None
    shape, dtype = tuple(shape), np.dtype(dtype)
    declared = header_bytes + math.prod(shape) * dtype.itemsize
    if entry.file_size != declared:
        raise NpzDataError(
            f"{path}: '{key}' declares shape {shape} {dtype} ({declared} bytes with its header), but its archive "
            f"entry declares {entry.file_size} bytes"
        )
    return shape, dtype


def _check_entry(path: Path, key: str, entry: zipfile.ZipInfo) -> None:
    """Refuse an archive entry that could cost more to read than the file holds (module docstring)."""
    if entry.compress_type not in _READABLE_METHODS:
        raise NpzDataError(
            f"{path}: '{key}' is compressed with zip method {entry.compress_type}; an .npz holds stored or deflated "
            "arrays (np.savez, np.savez_compressed)"
        )
    if entry.flag_bits & 0x1:
        raise NpzDataError(f"{path}: '{key}' is encrypted")
    stored, file_bytes = entry.compress_type == zipfile.ZIP_STORED, path.stat().st_size
    if entry.compress_size > file_bytes or entry.file_size > (1 if stored else DEFLATE_MAX_RATIO) * entry.compress_size:
        raise NpzDataError(
            f"{path}: '{key}' declares {entry.file_size} bytes from {entry.compress_size} "
            f"{'stored' if stored else 'deflated'} bytes in a file of {file_bytes}: more than they can hold"
        )


def _read_array(path: Path, archive, key: str) -> np.ndarray:
    """`key`'s array, once `_array_header` has checked what reading it costs."""
    try:
        return archive[key]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise NpzDataError(f"{path}: cannot read '{key}' ({error})") from None


def _read_x(path: Path, archive, key: str) -> np.ndarray:
    shape, dtype = _array_header(path, archive, key)
    _check_x_dtype(path, key, dtype, shape)
    return _read_array(path, archive, key)


def _read_labels(path: Path, archive, key: str, rows: int) -> np.ndarray:
    """`key`'s labels: integers 0.. of shape (`rows`,), their header checked before they are read."""
    shape, dtype = _array_header(path, archive, key)
    if not np.issubdtype(dtype, np.integer):
        raise NpzDataError(f"{path}: '{key}' has dtype {dtype}; labels must be integers 0..C-1")
    if shape != (rows,):
        raise NpzDataError(f"{path}: '{key}' has shape {shape}, the examples need ({rows},)")
    labels = _read_array(path, archive, key)
    if labels.min() < 0:
        raise NpzDataError(f"{path}: '{key}' has a negative label ({labels.min()}); labels must be 0..C-1")
    return labels.astype(np.int64)


def _read_declared(path: Path, archive) -> int:
    """The file's `num_classes`: an integer scalar, its header checked before it is read."""
    shape, dtype = _array_header(path, archive, "num_classes")
    if shape != () or not np.issubdtype(dtype, np.integer):
        raise NpzDataError(f"{path}: 'num_classes' must be an integer scalar, got {dtype} {shape}")
    return int(_read_array(path, archive, "num_classes"))


def _check_x_dtype(path: Path, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    if not (dtype == np.uint8 or np.issubdtype(dtype, np.floating)):
        raise NpzDataError(f"{path}: '{key}' has dtype {dtype}; it must be uint8 (0-255) or float")
    if len(shape) < 2 or shape[0] == 0 or 0 in shape:
        raise NpzDataError(
            f"{path}: '{key}' has shape {shape}; it must be (N, ...) with N >= 1: (N,C,H,W), (N,H,W) or (N,D)"
        )


def _example_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (1, *shape[1:]) if len(shape) == 3 else tuple(shape[1:])


def inspect_folder(folder: Path) -> NpzFolder:
    """The folder's layout, input shape and class count; its files checked against each other (from headers).

    Args:
        folder: an "npz:DIR" dataset's folder.

    Returns:
        Its number of client files (0: none), whether it has train.npz, the shape of one example and the class count
        (the files' `num_classes`, else 1 + the largest label of any file).

    Raises:
        NpzDataError: `folder` is not a directory, holds both train.npz and client files, client files with a gap,
            files that read_header refuses, examples of different shapes, or different declared class counts.
    """
    if not folder.is_dir():
        raise NpzDataError(f"{folder}: no such directory (dataset npz:DIR needs a folder with test.npz)")
    clients = _client_file_count(folder)
    has_train = (folder / TRAIN_FILE).exists()
    if clients and has_train:
        raise NpzDataError(
            f"{folder}: holds both {TRAIN_FILE} and client-<i>.npz files; keep one kind of training "
            "data (train.npz is split by the run's split, client files are used as they are)"
        )
    headers = [read_header(path) for path in _data_files(folder, has_train, clients)]
    return NpzFolder(folder, clients, has_train, _common_shape(headers), _class_count(headers))


def data_files(folder: Path) -> list[str]:
    """The files of `folder` that dataset npz:DIR reads.

    Args:
        folder: a folder, which need not exist.

    Returns:
        The names (train.npz, test.npz, client-<i>.npz) present, sorted; empty for a folder that is not there.
    """
    if not folder.is_dir():
        return []
    names = (path.name for path in folder.iterdir())
    return sorted(name for name in names if name in (TRAIN_FILE, TEST_FILE) or _CLIENT_FILE.fullmatch(name))


def _data_files(folder: Path, has_train: bool, clients: int) -> list[Path]:
    return [
        folder / TEST_FILE,
        *([folder / TRAIN_FILE] if has_train else []),
        *(client_file(folder, index) for index in range(clients)),
    ]


def _client_file_count(folder: Path) -> int:
    """How many client-<i>.npz files; they must be client-0 ... client-<K-1>, with no gap."""
    indices = sorted(int(match[1]) for path in folder.iterdir() if (match := _CLIENT_FILE.fullmatch(path.name)))
    missing = sorted(set(range(len(indices))) - set(indices))
    if missing:
        raise NpzDataError(
            f"{folder}: has {len(indices)} client files but lacks "
            f"{client_file(folder, missing[0]).name} (they must be client-0.npz ... client-<K-1>.npz)"
        )
    return len(indices)


def _common_shape(headers: list[NpzHeader]) -> tuple[int, ...]:
    first = headers[0]
    for header in headers[1:]:
        if header.input_shape != first.input_shape:
            raise NpzDataError(
                f"{header.path}: examples have shape {header.input_shape}, but those of {first.path} "
                f"have {first.input_shape}"
            )
    return first.input_shape


def _class_count(headers: list[NpzHeader]) -> int:
    declared = {header.declared_classes for header in headers if header.declared_classes is not None}
    if len(declared) > 1:
        raise NpzDataError(f"{headers[0].path.parent}: the files declare different num_classes {sorted(declared)}")
    largest = max(int(header.labels.max()) for header in headers)
    return declared.pop() if declared else largest + 1


def check_folder(folder: Path, clients: int | None, fraction: float, split_file: str) -> NpzFolder:
    """Everything a federation will read from `folder`, read in full and checked: the refusal `fedbayes local` gives
    before any process starts.

    Args:
        folder: an "npz:DIR" dataset's folder.
        clients: the federation's size; None where it is not known (e.g. the ServerApp), then the client files'
            count and the presence of training data are not checked.
        fraction: the run's share of the training set, in (0, 1]; must be 1 with client files.
        split_file: the run's split file ("": none); must be empty with client files.

    Returns:
        The folder's layout, input shape and class count (inspect_folder).

    Raises:
        NpzDataError: as inspect_folder; also client files with a fraction or split file, a count of client files
            other than `clients`, no training data for a federation, or an `x` read_x refuses.
    """
    found = inspect_folder(folder)
    if found.client_files and (fraction != 1.0 or split_file):
        raise NpzDataError(
            f"{folder}: holds pre-partitioned client files, which are used as they are: "
            "fraction must be 1 and split-file empty"
        )
    if clients is not None and found.client_files and found.client_files != clients:
        raise NpzDataError(
            f"{folder}: has {found.client_files} client files (client-<i>.npz) for a federation "
            f"of {clients} clients; there must be one per client"
        )
    if clients is not None and not found.client_files and not found.has_train:
        raise NpzDataError(
            f"{folder}: has no training data: add {TRAIN_FILE} or client-0.npz ... client-{clients - 1}.npz"
        )
    for path in _data_files(folder, found.has_train, found.client_files):
        read_x(path)
    return found


def load_npz_split(dataset: str, train: bool) -> Dataset:
    """The training set (train.npz) or the test set (test.npz) of an "npz:DIR" dataset.

    Args:
        dataset: an "npz:DIR" dataset name.
        train: True for train.npz, False for test.npz.

    Returns:
        The split's pixels as stored, labels, the folder's class count and the pixel scale of its dtype.

    Raises:
        ValueError: `dataset` is not an "npz:DIR" name.
        NpzDataError: the folder is refused (inspect_folder), or `train` with a folder of client files.
    """
    path = npz_folder(dataset)
    if path is None:
        raise ValueError(f"{dataset!r} is no npz:DIR dataset")
    folder = inspect_folder(path)
    if train and folder.client_files:
        raise NpzDataError(f"{folder.path}: holds pre-partitioned client-<i>.npz files, not a {TRAIN_FILE} to split")
    return _dataset(dataset, folder.path / (TRAIN_FILE if train else TEST_FILE), folder.num_classes)


def load_npz_partition(dataset: str, partition_id: int, num_partitions: int) -> Dataset | None:
    """One client's partition of a pre-partitioned "npz:DIR" dataset (client-<partition_id>.npz).

    Args:
        dataset: the run's dataset name.
        partition_id: the client's partition, 0 <= partition_id < num_partitions.
        num_partitions: the federation's size; must be the number of client files.

    Returns:
        The partition's data, or None for a built-in dataset or a folder without client files, whose training set the
        run's split divides.

    Raises:
        NpzDataError: the folder is refused (inspect_folder), or holds a number of client files other than
            `num_partitions`.
    """
    folder = npz_folder(dataset)
    if folder is None:
        return None
    found = inspect_folder(folder)
    if not found.client_files:
        return None
    if found.client_files != num_partitions:
        raise NpzDataError(
            f"{folder}: has {found.client_files} client files (client-<i>.npz) for a federation of "
            f"{num_partitions} clients; there must be one per client"
        )
    return _dataset(dataset, client_file(folder, partition_id), found.num_classes)


def load_data_path(path: Path, dataset: str) -> Dataset:
    """A deployed client's own data file (node config `data-path`).

    Args:
        path: the client's .npz file.
        dataset: the run's dataset name. With a built-in dataset the file's classes are that dataset's; with
            "npz:DIR" (whose folder this client need not have) the file must declare `num_classes`.

    Returns:
        The file's examples and labels with the class count described.

    Raises:
        NpzDataError: the file is refused (read_header, read_x), lacks `num_classes` with an "npz:DIR" dataset, or
            has labels or a declared class count that do not fit the built-in dataset's classes.
    """
    header = read_header(path)
    if npz_folder(dataset) is not None:
        if header.declared_classes is None:
            raise NpzDataError(
                f"{path}: with dataset {dataset!r} a client's data-path file must hold 'num_classes' "
                "(the server's class count; `fedbayes export-partitions` writes it)"
            )
        return _dataset(dataset, path, header.declared_classes)
    num_classes = NUM_CLASSES[dataset]
    if header.declared_classes not in (None, num_classes) or header.labels.max() >= num_classes:
        raise NpzDataError(
            f"{path}: labels must lie in [0, {num_classes}) for {dataset} "
            f"(num_classes {header.declared_classes}, largest label {header.labels.max()})"
        )
    return _dataset(dataset, path, num_classes)


def _dataset(name: str, path: Path, num_classes: int) -> Dataset:
    header = read_header(path)
    x = read_x(path)
    return Dataset(name, torch.from_numpy(x), torch.from_numpy(header.labels), num_classes, pixel_scale_of(x.dtype))


def write_npz(path: Path, data: Dataset) -> None:
    """Write `data` as stored (its pixels, labels and class count), replacing a file at `path` atomically: reading it
    back (load_data_path, load_npz_partition) gives the same dataset.

    Args:
        path: the .npz to write (as named: no suffix added).
        data: the examples, written as `x` (pixels as stored), `y` and `num_classes`.
    """
    buffer = io.BytesIO()
    np.savez(buffer, x=data.pixels.numpy(), y=data.labels.numpy(), num_classes=np.int64(data.num_classes))
    write_atomically(path, buffer.getvalue(), OUTPUT_MODE)
