"""FedAvg/FedProx halves in one process: weighted averaging, rejection, the proximal term's pull (its value and
gradient: tests/unit/test_gradient_terms.py)."""

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Error

from fedbayes.bayes.params import get_parameters, parameter_layout
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PACKED_ARRAY, TENSORS_KEY, decode, encode, new_header
from fedbayes.server.round_core import RoundCore, RoundPlan
from fedbayes.strategies import get_algorithm
from fedbayes.strategies.fedavg.server import FedAvg
from tests.support import LAYOUT, FakeGrid, answers, fedavg_reply, reply_message, round_core, settings


def configured(strategy: FedAvg, nodes) -> RoundCore:
    """`strategy` in its round core after round 1 was configured, sending w_g = 0 (what the screen measures updates
    from)."""
    zeros = ArrayRecord({name: Array(np.zeros(shape, np.float32)) for name, shape in LAYOUT.items()})
    core = round_core(strategy)
    core.configure(1, zeros, FakeGrid(nodes))
    return core


def test_weighted_average_of_accepted_replies_only():
    core = configured(FedAvg(settings(), LAYOUT), [11, 12, 13, 14, 15])
    bad = fedavg_reply("client-2", value=7.0)
    bad[TENSORS_KEY][PACKED_ARRAY].data = b"\x00"  # corrupt bytes inside the Array
    plan, replies = answers(
        core,
        1,
        {
            11: fedavg_reply("client-0", num_examples=10, value=1.0),
            12: fedavg_reply("client-1", num_examples=30, value=3.0),
            13: bad,
            15: fedavg_reply("client-4", server_round=2, value=9.0),
        },
    )
    outcome = core.aggregate(plan, [*replies, reply_message(None, node_id=14, error=Error(code=2, reason="boom"))])
    expected = (10 * 1.0 + 30 * 3.0) / 40
    for name in LAYOUT:
        np.testing.assert_allclose(outcome.arrays[name].numpy(), expected)
        assert outcome.arrays[name].numpy().dtype == np.float32
    assert outcome.metrics["train-loss"] == pytest.approx(0.3)  # Flower's example-weighted metric average
    report = outcome.report
    assert report.accepted == ["client-0", "client-1"]
    assert set(report.rejected) == {"client 'client-2' (node 13)", "node 14", "client 'client-4' (node 15)"}
    assert "boom" in report.rejected["node 14"] and "round 2" in report.rejected["client 'client-4' (node 15)"]
    assert core.identities.node_of_client == {"client-0": 11, "client-1": 12}


def test_a_reply_over_the_payload_limit_is_rejected_before_decoding():
    limit_mb = 60 / 2**20  # LAYOUT is 15 float32 = 60 bytes of tensors, plus the envelope
    core = configured(FedAvg(settings(**{"max-payload-mb": limit_mb}), LAYOUT), [11])
    outcome = core.aggregate(*answers(core, 1, {11: fedavg_reply("client-0")}))
    assert outcome.arrays is None and outcome.metrics is None
    reason = outcome.report.rejected["client 'client-0' (node 11)"]
    assert "payload is 0.0 MiB, over the limit max-payload-mb=" in reason


def test_no_usable_reply_leaves_the_model_unchanged():
    core = round_core(FedAvg(settings(), LAYOUT))
    outcome = core.aggregate(RoundPlan(1, (1,), ()), [reply_message(None, 1, Error(code=5, reason="gone"))])
    assert outcome.arrays is None and outcome.metrics is None


def test_a_round_that_fails_while_absorbing_still_reports_who_was_left_out_and_why(monkeypatch):
    """absorb raises (a bug): the round changes nothing, and its report, a value like any round's, names the
    client error, the failure and the absent node, in that order."""

    def broken(self, payloads, server_round):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(FedAvg, "absorb", broken)
    core = configured(FedAvg(settings(), LAYOUT), [11, 12, 13])
    plan, replies = answers(core, 1, {11: fedavg_reply("client-0")})
    outcome = core.aggregate(
        plan, replies, {12: Error(code=2, reason="crashed")}, {13: "no reply within round-timeout"}
    )
    assert outcome.arrays is None and outcome.metrics is None and outcome.report.accepted == []
    assert outcome.report.rejected == {
        "node 12": "client error: crashed",
        "round": "the server could not absorb the replies: ZeroDivisionError: boom",
        "node 13": "no reply within round-timeout",
    }
    assert core.accepted_rounds == {} and core.strategy.global_weights.sum() == 0


@pytest.mark.parametrize("rule", ["none", "median"])
def test_a_server_restored_from_its_state_measures_updates_from_the_same_global_model(rule):
    """w_g is FedAvg's declared state: a server restored from round 1's state, before it sends anything itself,
    screens and aggregates round 2's replies from the w_g round 1 made, exactly as the server it replaces does."""
    config = settings(**{"robust-aggregation": rule})
    core = configured(FedAvg(config, LAYOUT), [11, 12])
    first = {
        11: fedavg_reply("client-0", num_examples=10, value=1.0),
        12: fedavg_reply("client-1", num_examples=30, value=3.0),
    }
    assert core.aggregate(*answers(core, 1, first)).arrays is not None
    restored = round_core(FedAvg(config, LAYOUT))
    restored.load_state_dict(core.state_dict())
    np.testing.assert_array_equal(restored.strategy.global_weights, core.strategy.global_weights)
    assert restored.strategy.global_weights.dtype == np.float64
    second = {
        11: fedavg_reply("client-0", server_round=2, num_examples=10, value=2.0),
        12: fedavg_reply("client-1", server_round=2, num_examples=30, value=5.0),
    }
    original, resumed = (server.aggregate(*answers(server, 2, second)) for server in (core, restored))
    assert resumed.report.accepted == original.report.accepted == ["client-0", "client-1"]
    for name in LAYOUT:
        np.testing.assert_array_equal(resumed.arrays[name].numpy(), original.arrays[name].numpy())


def client_round(run_settings, mu):
    node = NodeSettings.from_node_config({"partition-id": 0, "num-partitions": 20}, default_device="cpu")
    runtime = ClientRuntime.create(run_settings, node)
    torch.manual_seed(0)
    global_weights = get_parameters(runtime.model)
    instruction = pb.FedAvgInstruction(
        training=pb.LocalTraining(epochs=2, batch_size=32, learning_rate=0.01, optimizer="adam", seed=1),
        proximal_mu=mu,
    )
    content = encode(pb.Instruction(header=new_header("fed", 1)), instruction, {"weights": global_weights})
    reply = get_algorithm("fedprox").client_half()(content, runtime)
    payload = decode(reply, pb.Reply, pb.FedAvgReply, {"weights": runtime.layout}, sender="client")
    distance = sum(np.sum((payload.tensors["weights"][n] - global_weights[n]) ** 2) for n in global_weights)
    return payload, distance, runtime


def test_client_half_trains_and_fedprox_stays_closer():
    run_settings = settings(fraction=0.1, model="logreg")
    payload, fedavg_distance, runtime = client_round(run_settings, mu=0.0)
    assert payload.reply.num_examples == len(runtime.data.labels) == 300
    assert payload.header.client_id == "client-0" and payload.reply.train_loss < 2.0
    assert list(payload.tensors["weights"]) == list(parameter_layout(runtime.model))
    _, fedprox_distance, _ = client_round(run_settings, mu=1.0)
    assert 0 < fedprox_distance < 0.5 * fedavg_distance
