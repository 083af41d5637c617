"""Checks of a run config against this machine that need no federation: run before anything starts.

`fedbayes local` runs them before it starts a single process, and the ServerApp at its start, so a
missing dataset, an absent GPU, a model that does not build, more clients awaited than will come, an output
path this user cannot write, a results file a new federation would overwrite, a payload limit no reply fits or
a run larger than this machine's memory is refused in seconds, by the run-config key, instead of after the
federation's start-up. Each check looks only as far as it must: the built-in datasets' files are checked for
presence, not read; a user's npz:DIR files (tasks/npzdata.py) are read and checked in full, as nothing else
vouches for them; writable paths are probed with a temporary file, created and removed, and nothing else.

`preflight` (server/preflight.py) runs them all, and the strategy's own check against the model, this machine's memory
and max-payload-mb (`check_model_and_strategy`), which needs the strategy registry and so lives above fedbayes.tasks.
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fedbayes.tasks.config import TRACKING_KINDS, ConfigError, RunSettings, parse_tracking

# Image shape of each dataset, to build its model without loading it.
INPUT_SHAPES = {"fmnist": (1, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}
_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
# The files torchvision 0.29 reads under data-root (its datasets' _check_exists / _check_integrity; kept
# here because importing torchvision alone takes seconds; tests/component/test_preflight.py compares them).
TORCHVISION_FILES = {
    "fmnist": ("FashionMNIST/raw", _MNIST_FILES),
    "mnist": ("MNIST/raw", _MNIST_FILES),
    "cifar10": (
        "cifar-10-batches-py",
        ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch", "batches.meta"),
    ),
    "cifar100": ("cifar-100-python", ("train", "test", "meta")),
}
_DEBIAN_FMNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
# Memory a federation takes at the least, as benchmarks/memory.py measured it (docs/results/performance.md): ~96 MiB
# PSS per idle client (its SuperNode), and once per machine ~680 MiB for the warm ClientApp executor and ~670 MiB for
# the ServerApp. Rounded down: the memory check is a lower bound, so it never refuses a run that fits.
CLIENT_MEMORY = 90 * 2**20
MACHINE_MEMORY = 2**30
# Copies of one reply's tensors held at once, at the least: by the server its state, the round's instruction and a
# reply it decodes; by a client that trains the instruction it decoded and the reply it encodes.
SERVER_PAYLOAD_COPIES = 3
CLIENT_PAYLOAD_COPIES = 2
FLOAT32_BYTES = 4
PAYLOAD_KEYS = ("particles",)  # strategy keys that multiply a payload (the DSVGD family's), named in refusals


def check_split_file(split_file: str) -> None:
    """Every client reads the split file it names (when it does): it must be a file this user can read.

    Args:
        split_file: run config `split-file`; "" names none, and passes.

    Raises:
        ConfigError: the file cannot be opened for reading.
    """
    if not split_file:
        return
    try:
        with open(split_file, "rb"):
            pass
    except OSError as error:
        raise ConfigError(
            f"run config 'split-file': cannot read {split_file} ({error.strerror or error}); write one "
            "with `fedbayes partitions --write F`"
        ) from None


def check_output_paths(settings: RunSettings, new_federation: bool) -> None:
    """The server writes its checkpoints under server-state-dir and its rows to results-path (where set); a new
    federation's results-path must be empty unless results-exists says to append or replace.

    Args:
        settings: the run's settings: server-state-dir, results-path, results-exists and federation.
        new_federation: the run starts a new federation (a run config that names none does too), whose results file
            must then be new or empty under results-exists "refuse".

    Raises:
        ConfigError: a path this process cannot write (unwritable), or a new federation's non-empty results file
            under results-exists "refuse" (results_exist_error).
    """
    for key, path, directory in (
        ("server-state-dir", settings.server_state_dir, True),
        ("results-path", settings.results_path, False),
    ):
        if path and (problem := unwritable(Path(path), directory)):
            raise ConfigError(f"run config '{key}': {problem}")
    results = Path(settings.results_path)
    new_federation = new_federation or not settings.federation
    if (
        settings.results_path
        and new_federation
        and settings.results_exists == "refuse"
        and results.exists()
        and results.stat().st_size > 0
    ):
        raise results_exist_error(results)


def check_tracking(tracking: str) -> None:
    """Run config `tracking` needs its extra installed where the ServerApp runs, a TensorBoard directory it can write,
    and an MLflow tracking server (an http(s) URI) that answers now: a run it cannot track is refused before it starts.
    One that goes down later does not stop the run (server/tracking.py).

    Args:
        tracking: run config `tracking`, already checked: "" (untracked), or "KIND:TARGET" (tasks/config.py
        parse_tracking).

    Raises:
        ConfigError: its kind's modules are not installed, its TensorBoard directory is not writable, or no MLflow
            server answers at its http(s) URI within TRACKING_PROBE_TIMEOUT seconds (the message names the URI).
    """
    kind, target = parse_tracking(tracking)
    if not kind:
        return
    if missing := missing_modules(kind):
        raise ConfigError(
            f"run config 'tracking' is {tracking!r}, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed for this Python: "
            f"pip install 'fedbayes[{kind}]'"
        )
    if kind == "tensorboard" and (problem := unwritable(Path(target), directory=True)):
        raise ConfigError(f"run config 'tracking': {problem}")
    if kind == "mlflow" and (problem := unanswered(target)):
        raise ConfigError(
            f"run config 'tracking': no MLflow tracking server answers at {target} ({problem}); start it first and "
            f"wait until {health_url(target)} answers (a new `mlflow server` can take a minute), or set "
            'tracking="" to run untracked'
        )


TRACKING_PROBE_TIMEOUT = 5.0  # seconds an MLflow tracking server has to answer the check before a run


def health_url(uri: str) -> str:
    """The health check of the MLflow tracking server at `uri` (`mlflow server` answers OK there).

    Args:
        uri: an http(s) tracking URI.

    Returns:
        `uri` without a trailing slash, then "/health".
    """
    return f"{uri.rstrip('/')}/health"


def unanswered(uri: str) -> str | None:
    """Why nothing answers HTTP at the MLflow tracking URI `uri`, asked with a TRACKING_PROBE_TIMEOUT-second timeout.

    Args:
        uri: the tracking URI.

    Returns:
        The reason on one line (refused, unresolvable, timed out, a malformed URI); None when something answers,
        whatever its answer, or when `uri` is no http(s) URI (a local store, written by the ServerApp itself).
    """
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        with urllib.request.urlopen(health_url(uri), timeout=TRACKING_PROBE_TIMEOUT):
            return None
    except urllib.error.HTTPError:  # an answer: the server is there (the tracked run's start asks it properly)
        return None
    except (OSError, ValueError) as error:  # refused, unresolvable, timed out; a malformed URI
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        return " ".join(str(reason).split()) or type(reason).__name__


def missing_modules(kind: str) -> list[str]:
    """The modules run config `tracking` of this kind needs that are not installed.

    Args:
        kind: a key of TRACKING_KINDS ("tensorboard", "mlflow").

    Returns:
        The module names find_spec does not find, in TRACKING_KINDS' order.
    """
    return [module for module in TRACKING_KINDS[kind] if importlib.util.find_spec(module) is None]


def results_exist_error(path: Path) -> ConfigError:
    """The refusal of a new federation's results file that is not empty (here and in server/loop.py ResultsLog).

    Args:
        path: the results file.

    Returns:
        The error, naming `path` and saying how results-exists, or another file, lets the run start.
    """
    return ConfigError(
        f"run config 'results-path': {path} is not empty and results-exists is 'refuse' (the file was left as it is): "
        "set results-exists=append to add this run's rows after what it holds, or results-exists=replace to start it "
        "over, or choose another file (fedbayes local: --results FILE, --set results-exists=append)"
    )


def unwritable(path: Path, directory: bool) -> str | None:
    """Why this process cannot write the file (or, with `directory`, the directory) `path`. Found by trying, which
    also holds for root and read-only file systems: an existing file is opened for appending (nothing written);
    otherwise a temporary file is created and removed in `path` when it is an existing directory, else in its nearest
    existing ancestor, where the missing directories would be made.

    Args:
        path: the file or directory to be written, which need not exist.
        directory: `path` is to be a directory, not a file.

    Returns:
        The problem in words (a directory where a file is meant or the other way round, an ancestor that is a file,
        no write permission), or None when this process can write it.
    """
    if path.exists() and path.is_dir() != directory:
        return f"{path} is {'not a directory' if directory else 'a directory, not a file'}"
    target = path if path.exists() else next(parent for parent in path.parents if parent.exists())
    if not path.exists() and not target.is_dir():
        return f"{path} cannot be made: {target} is not a directory"
    try:
        if target.is_dir():
            tempfile.TemporaryFile(dir=target).close()
        else:  # O_NONBLOCK: opening a FIFO without a reader fails instead of waiting
            os.close(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as error:
        return f"{path} is not writable by this user: {target}: {error.strerror or error}"
    return None


def check_dataset_files(settings: RunSettings, clients: int | None = None) -> None:
    """The run's dataset is where its run config says: the built-in datasets' files present (not read); a user's
    npz:DIR files read and checked in full, as nothing else vouches for them.

    Args:
        settings: the run's settings: dataset, data-root, download, fraction and split-file.
        clients: the federation's size, against which npz:DIR's client files are counted; None where it is not
            known (the ServerApp).

    Raises:
        ConfigError: naming the key: the npz:DIR folder is refused (tasks/npzdata.py check_folder), an empty
            data-root for a dataset other than "fmnist", the Debian Fashion-MNIST files missing, or, without
            download, torchvision's files missing under data-root.
    """
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
    subfolder, names = TORCHVISION_FILES[settings.dataset]
    missing = [f"{subfolder}/{name}" for name in names if not (Path(settings.data_root) / subfolder / name).is_file()]
    if missing:
        raise ConfigError(
            f"run config 'data-root': dataset {settings.dataset!r} is not under {settings.data_root} (missing "
            f"{', '.join(missing)}); point data-root at torchvision's folder for it, or add download=true to "
            "fetch it there"
        )


def check_device(device: str) -> None:
    """`cuda` needs a GPU torch can use here; there is no silent fall-back to the CPU.

    Args:
        device: run config `device`: "auto", "cpu" or "cuda".

    Raises:
        ConfigError: "cuda" where torch sees no CUDA GPU.
    """
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "run config 'device' is 'cuda', but torch sees no CUDA GPU on this machine; "
            "set device=cpu, or device=auto to use a GPU where there is one"
        )


@dataclass(frozen=True)
class ReplySize:
    """One reply's float32 tensors (the strategy's reply layouts and the model's buffers): an estimate of a payload
    from the parameter count, and a lower bound (the message around them is extra). It bounds the instructions
    too: a built-in strategy's instruction carries no more (FedAvg P values, BayesADMM 2P against its reply's 4P,
    DSVGD particles x P both ways). `keys`: the run-config keys that set it, as a refusal names them."""

    values: int
    keys: str

    @property
    def bytes(self) -> int:
        return FLOAT32_BYTES * self.values

    def __str__(self) -> str:
        return (
            f"one reply of {self.values:,} float32 values, {self.bytes / 2**20:,.1f} MiB (an estimate from the "
            "parameter count, a lower bound)"
        )


def reply_size(settings: RunSettings, algorithm, strategy, buffers) -> ReplySize:
    """The values in every tensor of a reply: its layouts' and the model's buffers (averaged by the round core).

    Args:
        settings: the run's settings; named in refusals: strategy, model, hidden for an mlp.
        algorithm: the strategy's registry entry; those of its hyperparameters in PAYLOAD_KEYS (particles) are named
            too.
        strategy: the strategy's server half, whose `reply_layouts()` give a reply's tensors.
        buffers: the model's buffers, name -> shape.

    Returns:
        The reply's float32 value count and the run-config keys that set it, as a refusal names them.
    """
    layouts = (*strategy.reply_layouts().values(), buffers)
    values = sum(math.prod(shape) for layout in layouts for shape in layout.values())
    scaling = [key for key in algorithm.hyperparameters if key.name in PAYLOAD_KEYS]
    keys = [
        ("strategy", settings.strategy),
        ("model", settings.model),
        *((("hidden", settings.hidden),) if settings.model == "mlp" else ()),
        *((key.name, settings.value(key.name)) for key in scaling),
    ]
    return ReplySize(values, ", ".join(f"'{name}' ({value})" for name, value in keys))


def check_payload_limit(reply: ReplySize, max_payload_mb: float) -> None:
    """Every reply over max-payload-mb is refused before it is decoded: one that cannot fit makes every round fail.

    Args:
        reply: one reply's size (reply_size), a lower bound.
        max_payload_mb: run config `max-payload-mb`, in MiB.

    Raises:
        ConfigError: the reply is over `max_payload_mb`; the message names the keys that set its size and the
            smallest limit that fits.
    """
    if reply.bytes > max_payload_mb * 2**20:
        raise ConfigError(
            f"run config 'max-payload-mb' ({max_payload_mb:g}) is below {reply} of {reply.keys}: every "
            f"reply would be refused; set it to at least {math.ceil(reply.bytes / 2**20)}"
        )


def check_memory(reply: ReplySize, clients: int | None) -> None:
    """What the run needs at the least against this machine's physical memory: the server's copies of a payload,
    and, with `clients` started here, theirs and each client's own processes.

    Args:
        reply: one reply's size (reply_size).
        clients: the clients started on this machine (`fedbayes local`); None: the server alone.

    Raises:
        ConfigError: the lower bound is over the machine's physical memory; the message says what each part takes.
    """
    server = SERVER_PAYLOAD_COPIES * reply.bytes
    parts = [f"run config {reply.keys}: the server holds {SERVER_PAYLOAD_COPIES} copies of {reply}, {_gib(server)}"]
    needed = server
    if clients is not None:
        local = MACHINE_MEMORY + clients * CLIENT_MEMORY + CLIENT_PAYLOAD_COPIES * reply.bytes
        parts.append(
            f"{clients} clients (fedbayes local: --clients) take {CLIENT_MEMORY // 2**20} MiB each, "
            f"{MACHINE_MEMORY // 2**30} GiB once and {CLIENT_PAYLOAD_COPIES} copies of the reply in one "
            f"that trains, {_gib(local)}"
        )
        needed += local
    available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > available:
        raise ConfigError(
            f"this run needs at least {_gib(needed)} of memory, more than this machine's "
            f"{_gib(available)}: {'; '.join(parts)}"
        )


def _gib(size: int) -> str:
    return f"{size / 2**30:,.1f} GiB"


def input_shape_and_classes(dataset: str) -> tuple[tuple[int, ...], int]:
    """One example's shape and the class count, without loading the data (npz:DIR: from the files' headers).

    Args:
        dataset: one of the built-in datasets, or "npz:DIR".

    Returns:
        The shape of one example, (C, H, W) for the built-in datasets, and the number of classes.

    Raises:
        ConfigError: the npz:DIR folder is refused (tasks/npzdata.py inspect_folder).
    """
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
    """The rounds wait for no more clients than the federation has.

    Args:
        settings: the run's settings: min-clients and wait-for-clients.
        clients: the federation's size.

    Raises:
        ConfigError: min-clients or wait-for-clients is over `clients`.
    """
    for key, value in (("min-clients", settings.min_clients), ("wait-for-clients", settings.wait_for_clients)):
        if value > clients:
            raise ConfigError(
                f"run config '{key}' is {value}, more than the federation's {clients} clients: "
                "its rounds would wait for clients that never come"
            )
