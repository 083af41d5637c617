"""The networked BayesADMM server half: membership semantics and the dual consistency check."""

import logging

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, new_header
from fedbayes.strategies.bayesadmm import BayesADMM, Duals, dual_step, server_step
from fedbayes.tasks.config import RunSettings
from tests.helpers import reply_message
from tests.test_config import DEFAULTS

LAYOUT = {"w": (2,)}


class FakeGrid:
    def __init__(self, nodes):
        self.nodes = nodes

    def get_node_ids(self):
        return self.nodes


def reply(client, server_round, mean, precision, global_, resumed_from, previous=None, gamma=0.2e-3, sent_duals=None):
    """A client's honest reply, or one whose duals are `sent_duals` instead of the dual step's."""
    local = Gaussian(torch.tensor(mean, dtype=torch.float64), torch.tensor(precision, dtype=torch.float64))
    start = previous or Duals(torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    duals = dual_step(start, local, global_, gamma, server_round)
    message = pb.BayesADMMReply(header=new_header("fed", server_round, client), num_examples=10,
                                resumed_from_round=resumed_from)
    as_arrays = lambda t: {"w": t.numpy().astype(np.float32)}  # noqa: E731
    sent = sent_duals or duals
    content = encode(message, {"local_mean": as_arrays(local.mean), "local_precision": as_arrays(local.precision),
                               "dual_mean": as_arrays(sent.mean), "dual_precision": as_arrays(sent.precision)})
    return content, local, duals


def strategy():
    settings = RunSettings.from_run_config(DEFAULTS)  # rho 0.2, damping 1e-3 -> gamma 2e-4
    server = BayesADMM(settings, LAYOUT)
    server.configure_train(1, ArrayRecord({"w": Array(np.array([0.5, -0.5], np.float32))}), None, FakeGrid([1, 2]))
    return server, settings


def test_mean_over_repliers_sum_over_all_known_clients_and_join(caplog):
    server, settings = strategy()
    global_1 = server.global_
    a1, local_a1, duals_a1 = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    b1, local_b1, duals_b1 = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    server.aggregate_train(1, [reply_message(a1, 1), reply_message(b1, 2)])
    expected = server_step([local_a1, local_b1], [duals_a1, duals_b1], settings.rho, settings.prior_precision)
    torch.testing.assert_close(server.global_.mean, expected.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(server.global_.precision, expected.precision, rtol=1e-5, atol=1e-6)
    # Round 2: only "a" replies, "c" joins. Mean over {a, c}; sums over {a, b, c}; K = 3.
    global_2 = server.global_
    a2, local_a2, duals_a2 = reply("a", 2, [1.5, 1.0], [6.0, 6.0], global_2, 1, previous=duals_a1)
    c2, local_c2, duals_c2 = reply("c", 2, [0.0, 1.0], [4.0, 9.0], global_2, 0)
    with caplog.at_level(logging.WARNING):
        server.aggregate_train(2, [reply_message(a2, 1), reply_message(c2, 3)])
    assert "differs" not in caplog.text and "lost its state" not in caplog.text
    expected = server_step([local_a2, local_c2], [duals_a2, duals_b1, duals_c2], settings.rho, settings.prior_precision)
    assert sorted(server.duals) == ["a", "b", "c"]
    torch.testing.assert_close(server.global_.mean, expected.mean, rtol=1e-5, atol=1e-6)
    alpha = 1 / (1 + settings.rho * 3)
    sum_u = duals_a2.precision + duals_b1.precision + duals_c2.precision
    mean_s = (local_a2.precision + local_c2.precision) / 2
    torch.testing.assert_close(server.global_.precision, (1 - alpha) * mean_s + alpha * (settings.prior_precision + sum_u),
                               rtol=1e-5, atol=1e-6)


def test_lost_client_state_is_reported_and_the_clients_duals_are_used(caplog):
    server, _ = strategy()
    a1, _, _ = reply("a", 1, [1.0, 2.0], [5.0, 6.0], server.global_, 0)
    server.aggregate_train(1, [reply_message(a1, 1)])
    # "a" comes back with fresh duals (resumed from round 0) although the server knows round 1.
    a2, _, fresh = reply("a", 2, [1.0, 1.0], [5.0, 5.0], server.global_, 0)
    with caplog.at_level(logging.WARNING):
        server.aggregate_train(2, [reply_message(a2, 1)])
    assert "client 'a' lost its state of round 1; it starts again from zero duals" in caplog.text
    torch.testing.assert_close(server.duals["a"].mean, fresh.mean, rtol=1e-6, atol=1e-9)


def test_tampered_duals_are_rejected_and_leave_no_trace():
    server, _ = strategy()
    global_1 = server.global_
    _, _, honest = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    tampered = Duals(torch.tensor([123.0, 0.0], dtype=torch.float64), honest.precision)
    a1, _, _ = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0, sent_duals=tampered)
    assert server.aggregate_train(1, [reply_message(a1, 1)]) == (None, None)
    reason = server.round_report.rejected["client 'a' (node 1)"]
    assert "field 'dual_mean': differs from the server's replay of the dual step" in reason
    assert server.duals == {} and server.accepted_rounds == {} and server.identities.node_of_client == {}
    assert server.global_ is global_1


def test_a_non_positive_local_precision_is_rejected_and_the_round_goes_on(caplog):
    server, settings = strategy()
    global_1 = server.global_
    bad, _, _ = reply("a", 1, [1.0, 2.0], [-50.0, 6.0], global_1, 0)
    good, local_b, duals_b = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    with caplog.at_level(logging.WARNING):
        server.aggregate_train(1, [reply_message(bad, 1), reply_message(good, 2)])
    assert "client 'a' (node 1): rejected reply" in caplog.text and "1 precisions are <= 0" in caplog.text
    assert server.round_report.accepted == ["b"] and sorted(server.duals) == ["b"]
    expected = server_step([local_b], [duals_b], settings.rho, settings.prior_precision)
    torch.testing.assert_close(server.global_.mean, expected.mean, rtol=1e-5, atol=1e-6)


def test_a_restored_server_continues_exactly_like_the_original():
    """state_dict() after round 1, restored into a new strategy (a restarted server), then round 2 on
    both: the same q̄ and the same duals, bit for bit; the restored one also checks round-2 duals."""
    original, _ = strategy()
    global_1 = original.global_
    a1, _, duals_a1 = reply("a", 1, [1.0, 2.0], [5.0, 6.0], global_1, 0)
    b1, _, _ = reply("b", 1, [3.0, 0.0], [7.0, 2.0], global_1, 0)
    original.aggregate_train(1, [reply_message(a1, 1), reply_message(b1, 2)])
    restored = BayesADMM(RunSettings.from_run_config(DEFAULTS), LAYOUT)
    restored.load_state_dict(original.state_dict())
    a2, _, _ = reply("a", 2, [1.5, 1.0], [6.0, 6.0], original.global_, 1, previous=duals_a1)
    for server in (original, restored):
        server.aggregate_train(2, [reply_message(a2, 1)])
    assert torch.equal(original.global_.mean, restored.global_.mean)
    assert torch.equal(original.global_.precision, restored.global_.precision)
    assert original.duals.keys() == restored.duals.keys() == {"a", "b"}
    for client in ("a", "b"):
        assert torch.equal(original.duals[client].mean, restored.duals[client].mean)
        assert original.duals[client].round == restored.duals[client].round


@pytest.mark.parametrize("overrides, problem", [
    ({"model": "mlp"}, "needs model=logreg"),
    ({"model": "logreg", "pool": 1}, "pool=4"),  # 7850 parameters: a 7850 x 7850 precision per message
])
def test_full_covariance_refuses_models_it_cannot_carry(overrides, problem):
    from fedbayes.strategies import get_algorithm
    from fedbayes.tasks.config import ConfigError
    from fedbayes.tasks.models import build_model
    from fedbayes.bayes.params import parameter_layout

    settings = RunSettings.from_run_config({**DEFAULTS, "strategy": "bayesadmm-full", **overrides})
    model = build_model(settings.model, (1, 28, 28), 10, pool=settings.pool)
    with pytest.raises(ConfigError, match=problem):
        get_algorithm("bayesadmm-full").server(settings, parameter_layout(model))
