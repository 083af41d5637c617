"""Per-client evaluation (run config client-eval-fraction) end to end in one process: real client halves hold out a
share of their examples, evaluate the global model they receive (and BayesADMM's its own posterior) on it, the real
round loop checks the numbers and writes them into the rows, and `fedbayes report` shows them; a client whose
metrics are out of range is refused and the round goes on; the default leaves everything as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import ConfigRecord, Message, RecordDict

from fedbayes.bayes.metrics import classification_metrics
from fedbayes.bayes.params import set_parameters
from fedbayes.client.core import ClientHalf, model_layouts
from fedbayes.client.evaluation import held_out_rows
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import ENVELOPE_KEY, decode_header
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.loop import run_rounds
from fedbayes.server.preflight import check_model_and_strategy
from fedbayes.strategies.fedavg.client import local_update as fedavg_update
from fedbayes.tasks.config import ConfigError, LoopSettings
from fedbayes.tasks.models import build_model
from fedbayes.tasks.report import load_runs, write_report
from tests.support import (
    FakeGrid,
    InProcessFederation,
    declared_payload,
    envelope_of,
    no_metrics,
    rows,
    settings,
    synthetic_data,
)

SIZES = [40, 60, 80]  # node k holds client-k with synthetic_data(SIZES[k-1], seed=k)
FRACTION = 0.25


def federation(tmp_path: Path, strategy: str = "fedavg", **overrides) -> InProcessFederation:
    return InProcessFederation(tmp_path, {"strategy": strategy, "seed": 3, **overrides}, SIZES)


def run(fed: InProcessFederation, tmp_path: Path, answer=None, rounds: int = 2) -> list[dict]:
    """`rounds` rounds of `fed` through the real round loop on a fake grid; its rows."""
    loop = LoopSettings(
        num_rounds=rounds, round_timeout=30, poll_interval=0.01, wait_for_clients=3, wait_for_clients_timeout=5
    )
    grid = FakeGrid(list(fed.runtimes), answer or fed.answer)
    run_rounds(
        grid, fed.core, fed.arrays, loop, no_metrics, str(tmp_path / "r.jsonl"), CheckpointStore(tmp_path, "fed", {})
    )
    return rows(tmp_path)


def held_out_metrics_of(state: dict, client: int) -> dict[str, float]:
    """Client `client`'s held-out metrics of the model state `state`, computed here from its data alone."""
    data = synthetic_data(SIZES[client - 1], client)
    _, held_out = held_out_rows(len(data.labels), FRACTION, seed=3, client_id=f"client-{client}")
    model = build_model("logreg", (1, 1, 5), 2)
    set_parameters(model, state)
    with torch.no_grad():
        probs = torch.softmax(model.eval()(data.images[held_out]), dim=1)
    metrics = classification_metrics(probs, data.labels[held_out])
    return {"examples": len(held_out), **{key: metrics[key] for key in ("accuracy", "nll", "ece")}}


def test_rows_carry_each_clients_held_out_metrics_of_the_global_model_it_received(tmp_path):
    fed = federation(tmp_path, **{"client-eval-fraction": FRACTION})
    initial = {name: fed.arrays[name].numpy() for name in fed.arrays}
    first, second = run(fed, tmp_path)
    assert sorted(first["client_metrics"]) == ["client-1", "client-2", "client-3"]
    expected = held_out_metrics_of(initial, 1)  # round 1's global model is the initial one
    measured = first["client_metrics"]["client-1"]
    assert measured["examples"] == expected["examples"] == 10
    assert measured == pytest.approx(expected, abs=1e-6)
    assert "accuracy_local" not in measured  # FedAvg keeps no posterior of a client's own
    # each client trained on the rest of its examples: the reply's num_examples, the server's weights
    assert fed.core.client_examples == {"client-1": 30, "client-2": 45, "client-3": 60}
    for row in (first, second):
        entries = row["client_metrics"].values()
        assert row["client_accuracy_mean"] == pytest.approx(sum(e["accuracy"] for e in entries) / 3)
        assert row["client_accuracy_worst"] == min(e["accuracy"] for e in entries)
        assert row["client_nll_worst"] == max(e["nll"] for e in entries)
        assert row["client_ece_worst"] == max(e["ece"] for e in entries)
    assert second["client_metrics"]["client-1"] != measured  # round 2 evaluates round 1's model


def test_no_round_trains_on_the_held_out_examples(tmp_path):
    fed = federation(tmp_path, **{"client-eval-fraction": FRACTION})
    trained_on: list[torch.Tensor] = []

    def recording_update(local):
        trained_on.append(local.runtime.data.pixels.clone())
        return fedavg_update(local)

    half = ClientHalf(
        pb.FedAvgInstruction, recording_update, model_layouts("weights"), global_model=fed.client_update.global_model
    )
    fed.client_update = half
    run(fed, tmp_path)
    data = synthetic_data(SIZES[0], 1)
    training, held_out = held_out_rows(SIZES[0], FRACTION, seed=3, client_id="client-1")
    client_1 = [pixels for pixels in trained_on if len(pixels) == len(training)]
    assert len(client_1) == 2  # both rounds, on the training rows alone, in their order
    assert all(torch.equal(pixels, data.pixels[training]) for pixels in client_1)


def test_bayesadmm_clients_also_report_their_own_posterior_after_training(tmp_path):
    fed = federation(tmp_path, "bayesadmm", **{"client-eval-fraction": FRACTION})
    replies: dict[int, RecordDict] = {}

    def answer(message: Message) -> RecordDict:
        replies[message.metadata.dst_node_id] = fed.answer(message)
        return replies[message.metadata.dst_node_id]

    (row,) = run(fed, tmp_path, answer, rounds=1)
    local_mean = declared_payload(replies[2], pb.BayesADMMReply).tensors["local_mean"]
    expected = held_out_metrics_of(local_mean, 2)  # the posterior the client sent, at its mean
    measured = row["client_metrics"]["client-2"]
    assert {key: measured[f"{key}_local"] for key in ("accuracy", "nll", "ece")} == pytest.approx(
        {key: expected[key] for key in ("accuracy", "nll", "ece")}, abs=1e-6
    )
    assert measured["nll_local"] != measured["nll"]  # after training, not the global model again
    assert row["client_accuracy_local_worst"] == min(e["accuracy_local"] for e in row["client_metrics"].values())


def with_evaluation(content: RecordDict, change) -> RecordDict:
    """`content` (a client's reply) with `change(evaluation)` applied to its held-out metrics."""
    envelope = envelope_of(content)
    change(envelope.evaluation)
    edited = RecordDict(dict(content.items()))
    edited[ENVELOPE_KEY] = ConfigRecord(
        {"type": envelope.DESCRIPTOR.full_name, "message": envelope.SerializeToString()}
    )
    return edited


def set_accuracy(value):
    def change(evaluation):
        evaluation.global_model.accuracy = value

    return change


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (set_accuracy(1.5), "field 'evaluation.global_model.accuracy': 1.5 is not in [0, 1]"),
        (set_accuracy(float("nan")), "field 'evaluation.global_model.accuracy': must be finite"),
        (lambda evaluation: evaluation.ClearField("global_model"), "field 'evaluation.global_model': missing"),
    ],
)
def test_a_client_claiming_impossible_metrics_is_refused_and_the_round_goes_on(tmp_path, change, problem):
    fed = federation(tmp_path, **{"client-eval-fraction": FRACTION})

    def answer(message: Message) -> RecordDict:
        reply = fed.answer(message)
        return with_evaluation(reply, change) if message.metadata.dst_node_id == 2 else reply

    first, second = run(fed, tmp_path, answer)
    for row in (first, second):
        assert row["clients"] == 2 and sorted(row["client_metrics"]) == ["client-1", "client-3"]
        (reason,) = row["rejected"].values()
        assert problem in reason, reason
    assert first["client_accuracy_worst"] == min(e["accuracy"] for e in first["client_metrics"].values())


def test_the_default_asks_nothing_and_leaves_the_rows_and_the_training_as_they_were(tmp_path):
    fed = federation(tmp_path)
    sent: list[Message] = []

    def answer(message: Message) -> RecordDict:
        sent.append(message)
        return fed.answer(message)

    first, _ = run(fed, tmp_path, answer)
    assert not any(key.startswith("client_metrics") or key.startswith("client_accuracy") for key in first)
    assert not any(envelope_of(message.content).HasField("client_evaluation") for message in sent)
    assert fed.core.client_examples == {"client-1": 40, "client-2": 60, "client-3": 80}  # all of their examples
    assert decode_header(sent[0].content, "server").schema_version == max(pb.SchemaVersion.values())


def test_a_client_half_that_names_no_global_model_refuses_to_evaluate_before_training(tmp_path):
    fed = federation(tmp_path, **{"client-eval-fraction": FRACTION})
    trained = []
    half = ClientHalf(pb.FedAvgInstruction, lambda local: trained.append(local), model_layouts("weights"))
    (message, *_) = fed.core.configure(1, fed.arrays, FakeGrid([1, 2, 3])).messages
    with pytest.raises(ValueError, match="names no global model to evaluate .*set client-eval-fraction = 0"):
        half(message.content, fed.runtimes[1])
    assert trained == []


FEDAVGM = {"strategy": "fedavgm_plugin:FEDAVGM", "fedavgm-momentum": 0.9, "fedavgm-lr": 1.0}  # no global_model


def test_a_strategy_whose_client_half_cannot_evaluate_is_refused_before_the_run(plugin_path):
    check_model_and_strategy(settings(**FEDAVGM))  # the default asks nothing of it
    with pytest.raises(
        ConfigError, match="'client-eval-fraction' \\(0.2\\): the client half of strategy 'fedavgm_plugin"
    ):
        check_model_and_strategy(settings(**FEDAVGM, **{"client-eval-fraction": 0.2}))
    for strategy in ("fedavg", "bayesadmm", "dsvgd", "fedlap-func"):  # every built-in one can
        check_model_and_strategy(settings(strategy=strategy, **{"client-eval-fraction": 0.2}))


def test_the_report_shows_each_client_and_their_mean_and_worst(tmp_path):
    fed = federation(tmp_path, "bayesadmm", **{"client-eval-fraction": FRACTION})
    last = run(fed, tmp_path)[-1]
    out = tmp_path / "out"
    (report_run,) = load_runs([tmp_path / "r.jsonl"])
    page = write_report([report_run], out).read_text()
    assert "<h2>Each client's held-out metrics</h2>" in page
    assert "<th>client-3</th>" in page and "<th>accuracy_local</th>" in page
    mean = " / ".join(f"{last[f'client_{key}_mean']:.4f}" for key in ("accuracy", "nll", "ece"))
    worst = " / ".join(f"{last[f'client_{key}_worst']:.4f}" for key in ("accuracy", "nll", "ece"))
    assert f"<td>{mean} (round 2)</td>" in page and f"<td>{worst}</td>" in page
    from matplotlib.image import imread

    image = imread(out / "clients.png")
    assert image.shape[0] >= 4 * 300  # the counts and a row per metric
    assert json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])["client_metrics"]
