"""The clients' held-out metrics on the server's side (run config `client-eval-fraction`; the client's side is
client/evaluation.py): the request every instruction carries, the checks a reply's metrics must pass before the round
uses the reply (they are a peer's claims, like everything else in it), and the results row's fields they make.

Each accepted client's numbers are in the row's `client_metrics` (client id -> examples, accuracy, nll, ece of the
global model it received, and accuracy_local, nll_local, ece_local of its own posterior after training, where the
strategy keeps one), and summed up over the clients, each client counting once whatever its size: `client_<metric>_mean`
and `client_<metric>_worst` (the lowest accuracy, the highest NLL and ECE), the same with `_local`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from fedbayes.bayes.metrics import MAX_NLL
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PayloadError
from fedbayes.tasks.config import RunSettings

LOCAL = "_local"  # the suffix of the client's own posterior's metrics
# Each metric's bounds, and which end of them is worse: the worst client is the one with the lowest accuracy and the
# highest NLL and ECE. Round-off may put a mean of NLLs a hair over the largest one there is.
BOUNDS = {"accuracy": (0.0, 1.0), "nll": (0.0, MAX_NLL * (1 + 1e-9)), "ece": (0.0, 1.0)}
WORST = {"accuracy": min, "nll": max, "ece": max}
ClientMetrics = dict[str, dict[str, float]]  # client id -> metric name -> value (the row's client_metrics)


def evaluation_request(settings: RunSettings) -> pb.ClientEvaluationRequest | None:
    """What every round's instruction asks of the clients' evaluation.

    Args:
        settings: the run's settings (client-eval-fraction, seed).

    Returns:
        The request (the share, the run's seed); None where client-eval-fraction is 0.
    """
    if settings.client_eval_fraction == 0.0:
        return None
    return pb.ClientEvaluationRequest(fraction=settings.client_eval_fraction, seed=settings.seed)


def check_evaluation(reply: pb.Reply, asked: bool, max_examples: int) -> None:
    """A reply's held-out metrics: there exactly when the instruction asked for them, on 1 to `max_examples`
    examples, each metric finite and within its bounds (BOUNDS).

    Args:
        reply: the reply's envelope, decoded (the codec has refused non-finite numbers already).
        asked: whether the instruction asked for held-out metrics.
        max_examples: run config max-client-examples.

    Raises:
        PayloadError: naming the field and what is wrong with it.
    """
    if not reply.HasField("evaluation"):
        if asked:
            raise PayloadError(
                "field 'evaluation': missing, but the instruction asked for the client's held-out metrics "
                "(client-eval-fraction)"
            )
        return
    if not asked:
        raise PayloadError("field 'evaluation': the instruction asked for no held-out metrics (client-eval-fraction 0)")
    evaluation = reply.evaluation
    if not 1 <= evaluation.examples <= max_examples:
        raise PayloadError(
            f"field 'evaluation.examples': {evaluation.examples} is not in [1, max-client-examples={max_examples}]"
        )
    if not evaluation.HasField("global_model"):
        raise PayloadError("field 'evaluation.global_model': missing")
    for part in ("global_model", "local_posterior"):
        if evaluation.HasField(part):
            _check_metrics(getattr(evaluation, part), f"evaluation.{part}")


def _check_metrics(metrics: pb.HeldOutMetrics, where: str) -> None:
    for name, (low, high) in BOUNDS.items():
        value = getattr(metrics, name)
        if not (math.isfinite(value) and low <= value <= high):
            raise PayloadError(f"field '{where}.{name}': {value!r} is not in [{low:g}, {high:g}]")


def client_entry(evaluation: pb.ClientEvaluation) -> dict[str, float]:
    """A checked reply's held-out metrics as its entry in the row's `client_metrics`.

    Args:
        evaluation: a reply's held-out metrics, already checked (its global model's are present).

    Returns:
        "examples" and the global model's accuracy, nll and ece; with the client's own posterior's, those again
        suffixed with LOCAL.
    """
    entry: dict[str, float] = {"examples": evaluation.examples}
    parts = [("global_model", "")] + ([("local_posterior", LOCAL)] if evaluation.HasField("local_posterior") else [])
    for part, suffix in parts:
        entry |= {f"{name}{suffix}": getattr(getattr(evaluation, part), name) for name in BOUNDS}
    return entry


def row_fields(client_metrics: Mapping[str, Mapping[str, float]] | None) -> dict[str, Any]:
    """The results row's fields of a round's clients' held-out metrics (module docstring).

    Args:
        client_metrics: each accepted client's `client_entry`; None where the round asked for none.

    Returns:
        `client_metrics` and the summaries; nothing where the round asked for none, summaries of None where it
        accepted no reply.
    """
    if client_metrics is None:
        return {}
    fields: dict[str, Any] = {"client_metrics": {client: dict(entry) for client, entry in client_metrics.items()}}
    suffixes = [""] + ([LOCAL] if any(f"accuracy{LOCAL}" in entry for entry in client_metrics.values()) else [])
    for suffix in suffixes:
        for name, worst in WORST.items():
            values = [entry[f"{name}{suffix}"] for entry in client_metrics.values() if f"{name}{suffix}" in entry]
            fields[f"client_{name}{suffix}_mean"] = statistics.fmean(values) if values else None
            fields[f"client_{name}{suffix}_worst"] = worst(values) if values else None
    return fields
