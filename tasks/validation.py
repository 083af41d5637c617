"""A validation split carved from the clients' own training data, for tuning without reading the test set.

Each client keeps about 1 - share of its examples and gives the rest (a seeded draw; at least one example, never
all of them); the union of what they give is the validation set. Written as an `npz:DIR` dataset
(tasks/npzdata.py), client-<i>.npz the examples client i keeps and test.npz the validation set, a tuning run is an
ordinary run on that folder: every client trains on what it kept, the server evaluates on what they gave, and the
real test set is never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.npzdata import TEST_FILE, client_file, write_npz

VALIDATION_SHARE = 0.1


@dataclass(frozen=True)
class Carved:
    """One client's part of the split: positions into its examples, each sorted."""

    kept: np.ndarray
    given: np.ndarray


def held_out_count(size: int, share: float) -> int:
    """How many of a client's `size` examples a share of them is: round(share x size), at least one and at most
    size - 1, so that the client both keeps some and gives some (the validation carve and the final runs' held-out
    evaluation, client/evaluation.py, hold out the same number).

    Args:
        size: the client's examples, at least 2.
        share: the share, in (0, 1).

    Returns:
        The count, in 1..size-1.

    Raises:
        ValueError: `share` outside (0, 1), or fewer than 2 examples.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"the share must lie in (0, 1), got {share}")
    if size < 2:
        raise ValueError(f"{size} example(s): it needs 2 to keep one and give one")
    return min(size - 1, max(1, round(share * size)))


def carve(sizes: list[int], share: float = VALIDATION_SHARE, seed: int = 0) -> list[Carved]:
    """Which of each client's examples it keeps and which it gives to the validation set.

    Args:
        sizes: each client's number of examples, in partition order.
        share: the share each client gives, in (0, 1).
        seed: seeds one generator that draws every client's part, client 0 first.

    Returns:
        Per client its kept and given positions (0..size-1), disjoint and together all of them.

    Raises:
        ValueError: `share` outside (0, 1), or a client with fewer than 2 examples (it could not both keep and give).
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"the validation share must lie in (0, 1), got {share}")
    small = [index for index, size in enumerate(sizes) if size < 2]
    if small:
        raise ValueError(f"client {small[0]} holds {sizes[small[0]]} example(s): it needs 2 to keep one and give one")
    generator = np.random.default_rng(seed)
    parts = []
    for size in sizes:
        shuffled = generator.permutation(size)
        cut = held_out_count(size, share)
        parts.append(Carved(kept=np.sort(shuffled[cut:]), given=np.sort(shuffled[:cut])))
    return parts


def write_validation_folder(
    folder: Path, clients: list[Dataset], share: float = VALIDATION_SHARE, seed: int = 0
) -> list[Carved]:
    """The tuning dataset as `npz:DIR`: client-<i>.npz what client i keeps, test.npz the validation set.

    Args:
        folder: where to write the files (made if absent; files of the same names are replaced).
        clients: each client's training examples, in partition order.
        share: the share each client gives (carve).
        seed: the draw's seed (carve).

    Returns:
        The split, per client (carve).

    Raises:
        ValueError: as carve.
    """
    parts = carve([len(data) for data in clients], share, seed)
    folder.mkdir(parents=True, exist_ok=True)
    for index, (data, part) in enumerate(zip(clients, parts)):
        write_npz(client_file(folder, index), data.subset(part.kept))
    given = [data.subset(part.given) for data, part in zip(clients, parts)]
    first = given[0]
    validation = Dataset(
        first.name,
        torch.cat([data.pixels for data in given]),
        torch.cat([data.labels for data in given]),
        first.num_classes,
        first.pixel_scale,
    )
    write_npz(folder / TEST_FILE, validation)
    return parts
