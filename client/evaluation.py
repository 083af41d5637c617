"""A client's evaluation on a held-out share of its own data, where the server asks for it (run config
`client-eval-fraction`, sent as Instruction.client_evaluation): which of its examples it holds out of training, and
the metrics (bayes/metrics.py: accuracy, NLL, ECE) of a predictive on them.

The held-out examples are drawn from the run's seed and the client's id alone, never from the round, so they are the
same in every round and on every restart, and no round trains on them."""

from __future__ import annotations

import copy
import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from fedbayes.bayes.metrics import classification_metrics, member_probs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.validation import held_out_count

HELD_OUT_BATCH = 1000  # examples per forward pass of the held-out evaluation
_SPLIT_SALT = b"held-out:"  # keeps the split's generator apart from the client's per-round seeds (ClientRuntime)


def held_out_rows(size: int, fraction: float, seed: int, client_id: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, held-out rows) of a client's `size` examples, each ascending: round(fraction x size) of them
    held out, at least one and at most size - 1 (tasks/validation.py held_out_count, as the validation carve of
    `fedbayes compare`), drawn from `seed` (the run's) and `client_id`.

    Args:
        size: the client's examples.
        fraction: the share held out, in (0, 1).
        seed: the run's seed (Instruction.client_evaluation.seed).
        client_id: the client's id, so that clients with equal partition sizes hold out different rows.

    Returns:
        The indices trained on and the indices held out; together every index, once.

    Raises:
        ValueError: `fraction` is not in (0, 1), or the client has fewer than 2 examples (one to train on and one
            to hold out).
    """
    try:
        count = held_out_count(size, fraction)
    except ValueError as problem:
        raise ValueError(f"{client_id}: holding out client-eval-fraction={fraction:g}: {problem}") from None
    generator = torch.Generator().manual_seed(seed ^ zlib.crc32(_SPLIT_SALT + client_id.encode()))
    order = torch.randperm(size, generator=generator)
    return order[count:].sort().values, order[:count].sort().values


def held_out_split(data: Dataset, request: pb.ClientEvaluationRequest, client_id: str) -> tuple[Dataset, Dataset]:
    """A client's examples split as the server's request asks (held_out_rows).

    Args:
        data: all of the client's examples, in the order it trains on them (run config `row-order`).
        request: the instruction's Instruction.client_evaluation.
        client_id: the client's id.

    Returns:
        (the examples it trains on, in their order in `data`; the ones it holds out).

    Raises:
        ValueError: as held_out_rows.
    """
    training, held_out = held_out_rows(len(data.labels), request.fraction, request.seed, client_id)
    return data.subset(training), data.subset(held_out)


def held_out_metrics(
    model: torch.nn.Module, members: Sequence[Mapping[str, np.ndarray]], held_out: Dataset, device: torch.device
) -> pb.HeldOutMetrics:
    """The metrics of a predictive on a client's held-out examples.

    Args:
        model: the client's model; the members are loaded into a copy of it, and it stays as it is.
        members: states of `model` (its parameters and buffers by name) whose class probabilities are averaged: one
            for a point estimate, several for particles.
        held_out: the held-out examples.
        device: where to compute.

    Returns:
        Accuracy, mean NLL and ECE (bayes/metrics.py classification_metrics).

    Raises:
        ValueError: no members.
    """
    if not members:
        raise ValueError("a predictive needs at least one member")
    probs = member_probs(copy.deepcopy(model), members, held_out.images, HELD_OUT_BATCH, device).mean(0)
    metrics = classification_metrics(probs, held_out.labels)
    return pb.HeldOutMetrics(accuracy=metrics["accuracy"], nll=metrics["nll"], ece=metrics["ece"])
