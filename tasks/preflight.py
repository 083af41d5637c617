"""Checks of a run config against this machine that need no federation: run before anything starts.

`fedbayes local` runs them before it starts a single process, and the ServerApp at its start, so a
missing dataset, an absent GPU, a model that does not build or more clients awaited than will come is
refused in seconds, by the run-config key, instead of after the federation's start-up. Each check
looks only as far as it must: the built-in datasets' files are checked for presence, not read; a user's
npz:DIR files (tasks/npzdata.py) are read and checked in full, as nothing else vouches for them.
"""

from __future__ import annotations

from pathlib import Path

from fedbayes.tasks.config import ConfigError, RunSettings

# Image shape of each dataset, to build its model without loading it.
INPUT_SHAPES = {"fmnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}
_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte")
# The files torchvision 0.29 reads under data-root (its datasets' _check_exists / _check_integrity; kept
# here because importing torchvision alone takes seconds; tests/test_preflight.py compares them).
TORCHVISION_FILES = {
    "fmnist": ("FashionMNIST/raw", _MNIST_FILES),
    "mnist": ("MNIST/raw", _MNIST_FILES),
    "cifar10": ("cifar-10-batches-py",
                ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch",
                 "batches.meta")),
    "cifar100": ("cifar-100-python", ("train", "test", "meta")),
}
_DEBIAN_FMNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                        "t10k-labels-idx1-ubyte.gz")


def preflight(settings: RunSettings, clients: int | None = None) -> None:
    """Refuse (ConfigError naming the key) what the ServerApp or the clients would fail on later.
    `clients`: how many clients the federation will have, where the caller knows it."""
    if clients is not None:
        check_client_counts(settings, clients)
    check_dataset_files(settings, clients)
    check_device(settings.device)
    check_model_and_strategy(settings)


def check_dataset_files(settings: RunSettings, clients: int | None = None) -> None:
    from fedbayes.tasks.npzdata import check_folder, npz_folder

    folder = npz_folder(settings.dataset)
    if folder is not None:  # every file read and checked, in full
        _dataset_error(check_folder, folder, clients, settings.fraction, settings.split_file)
        return
    if not settings.data_root:
        if settings.dataset != "fmnist":
            raise ConfigError(
                f"run config 'data-root' is empty, and dataset {settings.dataset!r} has no default location: set it "
                "to a torchvision dataset folder (fedbayes local: --data-root DIR), with download=true to fetch "
                "it there"
            )
        from fedbayes.tasks.datasets import DEBIAN_FMNIST_DIR

        missing = [name for name in _DEBIAN_FMNIST_FILES if not (DEBIAN_FMNIST_DIR / name).is_file()]
        if missing:
            raise ConfigError(
                f"run config 'data-root' is empty, so dataset 'fmnist' is read from {DEBIAN_FMNIST_DIR}, which lacks "
                f"{', '.join(missing)}: run `apt-get install dataset-fashion-mnist` (as root) or set data-root to a "
                "torchvision FashionMNIST folder"
            )
        return
    if settings.download:
        return  # torchvision fetches what is missing into data-root
    folder, names = TORCHVISION_FILES[settings.dataset]
    missing = [f"{folder}/{name}" for name in names if not (Path(settings.data_root) / folder / name).is_file()]
    if missing:
        raise ConfigError(
            f"run config 'data-root': dataset {settings.dataset!r} is not under {settings.data_root} (missing "
            f"{', '.join(missing)}); point data-root at torchvision's folder for it, or add download=true to "
            "fetch it there"
        )


def check_device(device: str) -> None:
    """`cuda` needs a GPU torch can use here; there is no silent fall-back to the CPU."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run config 'device' is 'cuda', but torch sees no CUDA GPU on this machine; "
                          "set device=cpu, or device=auto to use a GPU where there is one")


def check_model_and_strategy(settings: RunSettings) -> None:
    """The model the settings describe builds, and the strategy accepts it (e.g. bayesadmm-full's size cap)."""
    from fedbayes.bayes.params import parameter_layout
    from fedbayes.strategies import get_algorithm
    from fedbayes.tasks.models import build_model, parse_hidden

    try:
        hidden = parse_hidden(settings.hidden)
    except ValueError as error:
        raise ConfigError(f"run config 'hidden': {error}") from None
    shape, num_classes = input_shape_and_classes(settings.dataset)
    try:
        model = build_model(settings.model, shape, num_classes, hidden, settings.activation, settings.pool)
    except (RuntimeError, ValueError) as error:  # e.g. a pooling window larger than the image, pool on a CNN
        key, value = ("pool", settings.pool) if settings.pool > 1 else ("model", repr(settings.model))
        examples = f"{shape[1]}x{shape[2]} images" if len(shape) == 3 else f"examples of shape {shape}"
        raise ConfigError(f"run config '{key}' ({value}) does not fit the {examples} of {settings.dataset!r}: "
                          f"{' '.join(str(error).split())}") from None
    get_algorithm(settings.strategy).server(settings, parameter_layout(model))


def input_shape_and_classes(dataset: str) -> tuple[tuple[int, ...], int]:
    """One example's shape and the class count, without loading the data (npz:DIR: from the files' headers)."""
    from fedbayes.tasks.datasets import NUM_CLASSES
    from fedbayes.tasks.npzdata import inspect_folder, npz_folder

    folder = npz_folder(dataset)
    if folder is None:
        return INPUT_SHAPES[dataset], NUM_CLASSES[dataset]
    found = _dataset_error(inspect_folder, folder)
    return found.input_shape, found.num_classes


def _dataset_error(check, *args):
    """`check(*args)`, an NpzDataError as a ConfigError naming the key."""
    from fedbayes.tasks.npzdata import NpzDataError

    try:
        return check(*args)
    except NpzDataError as error:
        raise ConfigError(f"run config 'dataset': {error}") from None


def check_client_counts(settings: RunSettings, clients: int) -> None:
    for key, value in (("min-clients", settings.min_clients), ("wait-for-clients", settings.wait_for_clients)):
        if value > clients:
            raise ConfigError(f"run config '{key}' is {value}, more than the federation's {clients} clients: "
                              "its rounds would wait for clients that never come")
