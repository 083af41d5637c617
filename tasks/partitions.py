"""Seeded splits of a training set among clients.

Every split function is deterministic in its seed and returns, per client, a sorted int64 array of
indices into the array it was given; a split file's rows keep the file's order (`read_split_file`).
The Dirichlet split follows the spec's §5.1 procedure; the policy for empty or tiny clients (resample
the whole split) is the spec's §9 P16 recommendation.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedbayes.tasks.storage import OUTPUT_MODE, FileTooLarge, read_bounded, write_atomically

SPLITS = ("iid", "dirichlet", "two-class")
# What a split file may hold beyond its indices' digits: per index its separator and whitespace (a file indented one
# index a line included), per client its brackets and indentation, and the file's own.
SPLIT_FILE_INDEX_BYTES, SPLIT_FILE_CLIENT_BYTES, SPLIT_FILE_BYTES = 16, 64, 1024

Seed = int | np.random.SeedSequence  # anything np.random.default_rng accepts as a fixed seed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DirichletSplit:
    """A Dirichlet split and how many draws it took to give every client `min_size` examples."""

    partitions: list[np.ndarray]
    attempts: int


def training_subset(num_examples: int, fraction: float, seed: Seed) -> np.ndarray:
    """Sorted indices of a random `fraction` of `num_examples` examples (all of them for 1).

    The subset differs per seed, as in the paper's FMNIST-10% runs (spec §9 P17).

    Args:
        num_examples: the training set's size.
        fraction: the share kept, in (0, 1]; round(fraction * num_examples) examples, at least one.
        seed: the generator's seed (an int or a SeedSequence).

    Returns:
        Sorted int64 indices in [0, num_examples), without repeats.

    Raises:
        ValueError: `fraction` is outside (0, 1].
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return np.arange(num_examples, dtype=np.int64)
    size = max(1, round(fraction * num_examples))
    chosen = np.random.default_rng(seed).choice(num_examples, size=size, replace=False)
    return np.sort(chosen).astype(np.int64)


def split_iid(num_examples: int, num_clients: int, seed: Seed) -> list[np.ndarray]:
    """Homogeneous split (spec §5.2): client k gets pi[k::K] of a random permutation pi.

    Args:
        num_examples: the examples to split, indices 0 .. num_examples-1.
        num_clients: K, >= 1 and at most `num_examples`.
        seed: the permutation's seed.

    Returns:
        K sorted int64 index arrays, disjoint and together all examples; their sizes differ by at most one.

    Raises:
        ValueError: `num_clients` is below 1 or over `num_examples`.
    """
    _check_num_clients(num_clients)
    if num_examples < num_clients:
        raise ValueError(f"cannot give {num_clients} clients at least one of {num_examples} examples each")
    permutation = np.random.default_rng(seed).permutation(num_examples)
    return [np.sort(permutation[k::num_clients]).astype(np.int64) for k in range(num_clients)]


def split_dirichlet(
    labels: np.ndarray,
    num_clients: int,
    seed: Seed,
    alpha_sizes: float = 1.0,
    alpha_classes: float = 0.5,
    min_size: int = 1,
    max_attempts: int = 1000,
) -> DirichletSplit:
    """Two-level Dirichlet split (spec §5.1): client sizes ~ Dir(alpha_sizes), class mix per client
    ~ Dir(alpha_classes); each class is shared among clients in proportion to size x class mix.

    Small clients happen (with K = 100 often an empty one), so the whole split is redrawn until
    every client has at least `min_size` examples.

    Args:
        labels: the examples' labels, a non-empty 1-D array of non-negative integers; classes 0 .. max(labels).
        num_clients: K, >= 1.
        seed: the draws' seed; the redraws continue the same stream.
        alpha_sizes: the concentration of the client sizes, > 0; smaller: more unequal sizes.
        alpha_classes: the concentration of each client's class mix, > 0; smaller: fewer classes per client.
        min_size: the fewest examples a client may get, >= 0; `min_size` * K must not exceed the examples.
        max_attempts: the most draws, >= 1.

    Returns:
        K sorted, disjoint int64 index arrays into `labels`, together all of them, and the draws it took.

    Raises:
        ValueError: the labels, `num_clients`, an alpha, `min_size` or `max_attempts` is out of range, or no draw in
            `max_attempts` gave every client `min_size` examples.
    """
    labels = _check_labels(labels)
    _check_num_clients(num_clients)
    if alpha_sizes <= 0 or alpha_classes <= 0:
        raise ValueError(f"Dirichlet alphas must be > 0, got alpha_sizes={alpha_sizes}, alpha_classes={alpha_classes}")
    if min_size < 0 or max_attempts < 1:
        raise ValueError(f"need min_size >= 0 and max_attempts >= 1, got {min_size} and {max_attempts}")
    if min_size * num_clients > len(labels):
        raise ValueError(f"{len(labels)} examples cannot give {num_clients} clients {min_size} each")
    rng = np.random.default_rng(seed)
    for attempt in range(1, max_attempts + 1):
        partitions = _draw_dirichlet_split(labels, num_clients, rng, alpha_sizes, alpha_classes)
        if min(len(part) for part in partitions) >= min_size:
            return DirichletSplit(partitions, attempt)
    raise ValueError(
        f"no Dirichlet split in {max_attempts} attempts gave all {num_clients} clients >= {min_size} "
        f"of {len(labels)} examples; lower min_size or num_clients, or raise alpha_sizes"
    )


def _draw_dirichlet_split(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, alpha_sizes: float, alpha_classes: float
) -> list[np.ndarray]:
    num_classes = int(labels.max()) + 1
    client_sizes = rng.dirichlet(np.full(num_clients, alpha_sizes))
    class_mix = rng.dirichlet(np.full(num_classes, alpha_classes), size=num_clients)
    weights = client_sizes[:, None] * class_mix
    class_shares = weights / weights.sum(axis=0, keepdims=True)  # per class, a distribution over clients
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        members = np.flatnonzero(labels == c)
        rng.shuffle(members)
        # Floor of the cumulative shares: every example of the class goes to exactly one client.
        cuts = (np.cumsum(class_shares[:, c]) * len(members)).astype(int)[:-1]
        for k, piece in enumerate(np.split(members, cuts)):
            pieces[k].append(piece)
    return [np.sort(np.concatenate(client_pieces)).astype(np.int64) for client_pieces in pieces]


def split_two_class(labels: np.ndarray, num_clients: int, seed: Seed, per_class: int = 300) -> list[np.ndarray]:
    """Pathological split: each client gets `per_class` examples of each of 2 distinct classes.

    Examples are drawn without replacement, so no two clients share one. Each client takes the two
    classes with the most examples left (ties broken at random), which keeps class usage balanced
    and postpones running out.

    Args:
        labels: the examples' labels, a non-empty 1-D array of non-negative integers with at least 2 classes.
        num_clients: K, >= 1.
        seed: the draws' seed.
        per_class: examples per class per client, >= 1.

    Returns:
        K sorted, disjoint int64 index arrays into `labels`, each of 2 * per_class examples.

    Raises:
        ValueError: the labels or an argument is out of range, or a class runs out (the message names it).
    """
    labels = _check_labels(labels)
    _check_num_clients(num_clients)
    if per_class < 1:
        raise ValueError(f"per_class must be >= 1, got {per_class}")
    num_classes = int(labels.max()) + 1
    if num_classes < 2:
        raise ValueError("the two-class split needs labels with at least 2 classes")
    rng = np.random.default_rng(seed)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
    taken = np.zeros(num_classes, dtype=np.int64)
    partitions = []
    for k in range(num_clients):
        remaining = np.array([len(pool) for pool in pools]) - taken
        by_remaining = np.lexsort((rng.permutation(num_classes), -remaining))  # last key sorts first
        classes = by_remaining[:2]
        for c in classes:
            if remaining[c] < per_class:
                raise ValueError(
                    f"class {c} has only {remaining[c]} examples left for client {k} of {num_clients} "
                    f"(per_class={per_class}); lower per_class or num_clients"
                )
        picked = [pools[c][taken[c] : taken[c] + per_class] for c in classes]
        taken[classes] += per_class
        partitions.append(np.sort(np.concatenate(picked)).astype(np.int64))
    return partitions


def partition_dataset(
    labels: np.ndarray, num_clients: int, split: str, seed: int, fraction: float = 1.0, **split_options
) -> list[np.ndarray]:
    """Subsample a `fraction` of the training set, then split it among clients with `split`. The subset and the split
    use independent random streams derived from `seed`.

    Args:
        labels: the full training set's labels, a non-empty 1-D array of non-negative integers.
        num_clients: K, >= 1.
        split: one of SPLITS: "iid", "dirichlet" or "two-class".
        seed: the run's seed.
        fraction: the share of the training set split, in (0, 1].
        split_options: keyword arguments of the split function (e.g. alpha_sizes, min_size for "dirichlet";
            per_class for "two-class").

    Returns:
        K sorted int64 index arrays into the full `labels`, one per client in partition-id order.

    Raises:
        ValueError: an unknown `split`, or an argument the subset or split refuses (training_subset, split_iid,
            split_dirichlet, split_two_class).
        TypeError: a `split_options` key the split function does not take.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    _check_num_clients(num_clients)
    labels = _check_labels(labels)
    subset_seed, split_seed = np.random.SeedSequence(seed).spawn(2)
    subset = training_subset(len(labels), fraction, subset_seed)
    subset_labels = labels[subset]
    if split == "iid":
        parts = split_iid(len(subset), num_clients, split_seed, **split_options)
    elif split == "dirichlet":
        result = split_dirichlet(subset_labels, num_clients, split_seed, **split_options)
        log.info("Dirichlet split (seed %d) took %d attempt(s)", seed, result.attempts)
        parts = result.partitions
    else:
        parts = split_two_class(subset_labels, num_clients, split_seed, **split_options)
    return [subset[part] for part in parts]  # subset is sorted, so these stay sorted


def write_split_file(path: Path | str, partitions: list[np.ndarray]) -> None:
    """Write a split as JSON, replacing a file at `path` atomically. `read_split_file` reads it back; any code base that
    can dump its split this way can be replayed.

    Args:
        path: the .json file to write.
        partitions: per client, in partition-id order, its 0-based row indices into the training file; written as a
            list of lists, in their order.
    """
    write_atomically(Path(path), json.dumps([[int(i) for i in part] for part in partitions]).encode(), OUTPUT_MODE)


def read_split_file(
    path: Path | str, num_examples: int, num_clients: int, allow_overlap: bool = False
) -> list[np.ndarray]:
    """The split a JSON file names (format: `write_split_file`), checked.

    A client trains on its rows in the file's order (its minibatches are drawn as a permutation of it), so a file
    in the BayesADMM authors' order (each client's rows class by class) gives their minibatches; with `noise=shared`
    every client then sees the same classes at the same step, as in their code (docs/results/table1.md).

    Args:
        path: the split file.
        num_examples: the training file's rows; every index must lie in [0, num_examples).
        num_clients: the federation's size; the file must hold one list per client.
        allow_overlap: let a row belong to more than one client (run config `split-file-overlap`).

    Returns:
        One int64 array per client, in the file's order.

    Raises:
        ValueError: the file is over split_file_limit's bytes, unreadable, not a JSON list of lists, has another
            number of clients, a client with no rows, a non-integer, out-of-range or repeated index, or, without
            `allow_overlap`, a row in two clients.
    """
    path = Path(path)
    limit = split_file_limit(num_examples, num_clients, allow_overlap)
    try:
        text = read_bounded(path, limit, f"a split of {num_examples} rows among {num_clients} clients")
    except FileTooLarge as error:
        raise ValueError(f"split file {error}") from None
    except OSError as error:
        raise ValueError(f"split file {path}: cannot read it as JSON ({error})") from error
    try:
        clients = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"split file {path}: cannot read it as JSON ({error})") from None
    if not isinstance(clients, list) or not all(isinstance(client, list) for client in clients):
        raise ValueError(f"split file {path}: must be a JSON list with one list of row indices per client")
    if len(clients) != num_clients:
        raise ValueError(f"split file {path}: has {len(clients)} clients, the federation has {num_clients}")
    partitions = []
    for k, rows in enumerate(clients):
        if not rows:
            raise ValueError(f"split file {path}: client {k} has no rows")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in rows):
            raise ValueError(f"split file {path}: client {k} has a row index that is not an integer")
        part = np.array(rows, dtype=np.int64)
        if part.min() < 0 or part.max() >= num_examples:
            raise ValueError(
                f"split file {path}: client {k} has row index {part.min() if part.min() < 0 else part.max()}"
                f" outside [0, {num_examples}) of the training file"
            )
        repeated = len(part) - len(np.unique(part))
        if repeated:
            raise ValueError(f"split file {path}: client {k} lists {repeated} rows twice")
        partitions.append(part)
    everything = np.concatenate(partitions)
    shared = len(everything) - len(np.unique(everything))
    if shared and not allow_overlap:
        raise ValueError(
            f"split file {path}: {shared} rows belong to more than one client "
            "(set split-file-overlap=true if that is meant)"
        )
    return partitions


def split_file_limit(num_examples: int, num_clients: int, allow_overlap: bool = False) -> int:
    """The most bytes a split file can take, checked before the file is read.

    Args:
        num_examples: the training file's rows.
        num_clients: the federation's size.
        allow_overlap: whether a row may belong to every client, which multiplies the indices by `num_clients`.

    Returns:
        Bytes for every row index once (with `allow_overlap`, once per client) with its separator and whitespace, each
        client's brackets and the file's own.
    """
    indices = num_examples * (num_clients if allow_overlap else 1)
    digits = len(str(max(num_examples - 1, 0)))
    return indices * (digits + SPLIT_FILE_INDEX_BYTES) + num_clients * SPLIT_FILE_CLIENT_BYTES + SPLIT_FILE_BYTES


def describe_partitions(partitions: list[np.ndarray], labels: np.ndarray, num_classes: int) -> str:
    """A table with one row per client (index, size, count per class) and a total row.

    Args:
        partitions: per client, indices into `labels`.
        labels: the training set's labels, integers in [0, num_classes).
        num_classes: the classes to count, one column each.

    Returns:
        The table's lines, right-aligned columns, joined by newlines.
    """
    labels = np.asarray(labels)
    per_client = [np.bincount(labels[part], minlength=num_classes) for part in partitions]
    counts = np.array(per_client, dtype=np.int64).reshape(len(partitions), num_classes)  # (0, C) when no clients
    header = ["client", "size", *(str(c) for c in range(num_classes))]
    rows = [[str(k), str(row.sum()), *map(str, row)] for k, row in enumerate(counts)]
    total = counts.sum(axis=0)
    rows.append(["total", str(total.sum()), *map(str, total)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in [header, *rows])


def _check_num_clients(num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) == 0 or not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ValueError("labels must be a non-empty 1-D array of non-negative integers")
    return labels
