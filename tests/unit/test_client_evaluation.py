"""The clients' held-out evaluation (run config client-eval-fraction): which examples a client holds out
(client/evaluation.py), the checks the server makes of the metrics a reply claims, and the row fields they make
(server/client_metrics.py)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from fedbayes.bayes.metrics import MAX_NLL, classification_metrics
from fedbayes.client.evaluation import held_out_rows
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PayloadError
from fedbayes.server.client_metrics import check_evaluation, client_entry, evaluation_request, row_fields
from fedbayes.tasks.validation import carve
from tests.support import settings


def test_the_held_out_rows_are_a_seeded_share_apart_from_the_training_rows():
    training, held_out = held_out_rows(100, 0.2, seed=7, client_id="client-1")
    assert len(held_out) == 20 and len(training) == 80
    assert sorted(torch.cat([training, held_out]).tolist()) == list(range(100))  # each row once
    assert training.tolist() == sorted(training.tolist()) and held_out.tolist() == sorted(held_out.tolist())
    again = held_out_rows(100, 0.2, seed=7, client_id="client-1")  # every round, every restart: the same rows
    assert torch.equal(again[1], held_out) and torch.equal(again[0], training)
    assert not torch.equal(held_out_rows(100, 0.2, seed=8, client_id="client-1")[1], held_out)
    assert not torch.equal(held_out_rows(100, 0.2, seed=7, client_id="client-2")[1], held_out)


@pytest.mark.parametrize(
    ("size", "fraction", "problem"),
    [
        (1, 0.5, "client-1: holding out client-eval-fraction=0.5: 1 example(s): it needs 2"),
        (10, 0.0, "must lie in (0, 1)"),
        (10, 1.0, "must lie in (0, 1)"),
    ],
)
def test_a_share_of_a_client_too_small_to_split_is_an_error(size, fraction, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        held_out_rows(size, fraction, seed=0, client_id="client-1")


@pytest.mark.parametrize(("size", "fraction", "held"), [(5, 0.1, 1), (10, 0.99, 9), (2, 0.5, 1), (30, 0.1, 3)])
def test_a_small_client_holds_out_one_and_keeps_one_as_the_validation_carve_does(size, fraction, held):
    """wine's smallest Dirichlet client (5 examples) at the compare's 0.1: round(0.5) is 0, yet it gave one example to
    the validation set while tuning, and holds out as many in the final runs."""
    training, held_out = held_out_rows(size, fraction, seed=0, client_id="client-1")
    assert len(held_out) == held and len(training) == size - held
    assert len(carve([size], fraction)[0].given) == held


def test_the_instruction_asks_only_where_the_run_config_does():
    assert evaluation_request(settings()) is None  # the default, 0: as before the key existed
    request = evaluation_request(settings(**{"client-eval-fraction": 0.25, "seed": 5}))
    assert request == pb.ClientEvaluationRequest(fraction=0.25, seed=5)


def reply_with(examples: int = 20, local: dict | None = None, **metrics: float) -> pb.Reply:
    values = {"accuracy": 0.75, "nll": 0.6, "ece": 0.05, **metrics}
    evaluation = pb.ClientEvaluation(examples=examples, global_model=pb.HeldOutMetrics(**values))
    if local is not None:
        evaluation.local_posterior.CopyFrom(pb.HeldOutMetrics(**local))
    return pb.Reply(num_examples=80, evaluation=evaluation)


def test_metrics_a_real_predictive_gives_pass_the_checks():
    probs = torch.softmax(torch.randn(50, 10, generator=torch.Generator().manual_seed(0)) * 30, dim=1)
    metrics = classification_metrics(probs, torch.arange(50) % 10)  # confident and mostly wrong: a high NLL
    confident = {key: metrics[key] for key in ("accuracy", "nll", "ece")}
    check_evaluation(reply_with(50, local=confident, **confident), asked=True, max_examples=1000)
    sure_and_wrong = classification_metrics(torch.eye(3)[[1, 2, 0]], torch.arange(3))
    assert sure_and_wrong["nll"] == pytest.approx(MAX_NLL)
    check_evaluation(reply_with(3, nll=sure_and_wrong["nll"], accuracy=0.0, ece=1.0), asked=True, max_examples=10)


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (reply_with(accuracy=1.5), "field 'evaluation.global_model.accuracy': 1.5 is not in [0, 1]"),
        (reply_with(accuracy=-0.1), "field 'evaluation.global_model.accuracy': -0.1 is not in [0, 1]"),
        (reply_with(nll=-1.0), "field 'evaluation.global_model.nll': -1.0 is not in [0, 27.6"),
        (reply_with(nll=1e9), "field 'evaluation.global_model.nll': 1000000000.0 is not in [0, 27.6"),
        (reply_with(ece=1.2), "field 'evaluation.global_model.ece': 1.2 is not in [0, 1]"),
        (reply_with(nll=math.nan), "field 'evaluation.global_model.nll': nan is not in"),
        (reply_with(local={"accuracy": 0.5, "nll": 0.1, "ece": 2.0}), "field 'evaluation.local_posterior.ece': 2.0"),
        (reply_with(examples=0), "field 'evaluation.examples': 0 is not in [1, max-client-examples=1000]"),
        (reply_with(examples=1001), "field 'evaluation.examples': 1001 is not in [1, max-client-examples=1000]"),
        (pb.Reply(evaluation=pb.ClientEvaluation(examples=5)), "field 'evaluation.global_model': missing"),
        (pb.Reply(num_examples=80), "field 'evaluation': missing, but the instruction asked"),
    ],
)
def test_metrics_out_of_their_range_are_refused_naming_the_field(reply, problem):
    with pytest.raises(PayloadError, match=re.escape(problem)):
        check_evaluation(reply, asked=True, max_examples=1000)


def test_metrics_nobody_asked_for_are_refused_and_none_is_fine():
    with pytest.raises(PayloadError, match=re.escape("field 'evaluation': the instruction asked for no held-out")):
        check_evaluation(reply_with(), asked=False, max_examples=1000)
    check_evaluation(pb.Reply(num_examples=80), asked=False, max_examples=1000)


def test_the_row_carries_each_client_and_the_mean_and_worst_of_them():
    entries = {
        "a": client_entry(reply_with(10, accuracy=0.9, nll=0.3, ece=0.02).evaluation),
        "b": client_entry(reply_with(30, local={"accuracy": 0.8, "nll": 0.5, "ece": 0.1}, accuracy=0.6).evaluation),
    }
    assert entries["a"] == {"examples": 10, "accuracy": 0.9, "nll": 0.3, "ece": 0.02}
    assert entries["b"]["accuracy_local"] == 0.8 and entries["b"]["examples"] == 30
    fields = row_fields(entries)
    assert fields["client_metrics"] == entries
    assert fields["client_accuracy_mean"] == pytest.approx(0.75)  # each client once, whatever its size
    assert fields["client_accuracy_worst"] == 0.6  # the lowest accuracy ...
    assert fields["client_nll_worst"] == 0.6 and fields["client_ece_worst"] == 0.05  # ... the highest NLL and ECE
    assert fields["client_nll_mean"] == pytest.approx(0.45)
    assert fields["client_accuracy_local_mean"] == fields["client_accuracy_local_worst"] == 0.8  # one client has it
    assert row_fields(None) == {}  # not asked: the row is as it was
    empty = row_fields({})  # asked, but no reply accepted
    assert empty["client_metrics"] == {} and empty["client_accuracy_mean"] is None and empty["client_ece_worst"] is None
    assert "client_accuracy_local_mean" not in empty
