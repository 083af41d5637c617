"""FedDyn's networked halves in one process: the server's Λ against the clients' stored λ_k under partial
participation, a client joining mid-run, a client that lost its state, and a checkpoint round trip."""

import shutil

import pytest
import torch

from fedbayes.bayes.params import flatten
from fedbayes.strategies.feddyn.client import LAMBDA_KEY
from fedbayes.strategies.feddyn.math import as_sent, total_lambda
from fedbayes.strategies.feddyn.server import FedDyn
from tests.support import InProcessFederation, newest_state


def stored_lambda_sum(federation) -> torch.Tensor:
    stores = [runtime.state_store("fed") for runtime in federation.runtimes.values()]
    return torch.stack([newest_state(store).tensors[LAMBDA_KEY] for store in stores if store.saved_rounds()]).sum(0)


def test_server_lambda_sum_equals_the_clients_lambdas_through_joins_partial_rounds_and_lost_state(tmp_path):
    federation = InProcessFederation(
        tmp_path,
        {
            "strategy": "feddyn",
            "fraction-train": 0.5,
            "feddyn-alpha": 0.1,
            "weight-decay": 1e-3,
            "local-epochs": 2,
            "lr": 0.05,
        },
        sizes=[12, 30, 20, 8],
    )
    server = federation.server
    trained, after_loss = set(), set()
    for server_round in range(1, 9):
        connected = [1, 2, 3] if server_round < 4 else [1, 2, 3, 4]  # client-4 joins in round 4
        if server_round == 6:  # client-2 loses its durable state
            shutil.rmtree(federation.runtimes[2].state_store("fed").directory)
        sent = federation.round(server_round, connected)
        assert len(sent) == max(1, round(0.5 * len(connected)))
        trained |= set(sent)
        after_loss |= set(sent) if server_round >= 6 else set()
        torch.testing.assert_close(
            total_lambda(server.state.lambdas), stored_lambda_sum(federation), rtol=0, atol=1e-12
        )
        assert server.state.membership.clients == len(trained)
    assert 2 in after_loss, "client-2 must train again after losing its state for this test to mean anything"
    assert 4 in trained and server.state.membership.total_examples == sum(
        len(federation.runtimes[node].data.labels) for node in trained
    )
    # A server restored from its checkpoint state continues exactly; what it sent is what it holds.
    restored = FedDyn(federation.settings, federation.layout)
    restored.commit(restored.load_state(server.save_state(server.state)))
    torch.testing.assert_close(restored.global_, server.global_, rtol=0, atol=0)
    torch.testing.assert_close(total_lambda(restored.state.lambdas), total_lambda(server.state.lambdas), rtol=0, atol=0)
    assert restored.state.membership == server.state.membership
    global_ = torch.from_numpy(flatten({n: federation.arrays[n].numpy() for n in federation.layout}, federation.layout))
    torch.testing.assert_close(as_sent(global_), server.global_, rtol=0, atol=0)


def test_each_client_uses_its_own_alpha_k(tmp_path, monkeypatch):
    """α_k = α·N/(K·N_k) from round 2 on (α in round 1, no sizes known); the reference code's bug gave every
    client the last client's α."""
    import fedbayes.strategies.feddyn.client as feddyn

    seen = {}
    original = feddyn.train_anchored

    def spy(runtime, training, start, anchor, weight, server_round, max_grad_norm):
        seen[(runtime.node.client_id, server_round)] = weight
        return original(runtime, training, start, anchor, weight, server_round, max_grad_norm)

    monkeypatch.setattr(feddyn, "train_anchored", spy)
    federation = InProcessFederation(tmp_path, {"strategy": "feddyn", "feddyn-alpha": 0.1}, sizes=[10, 30])
    for server_round in (1, 2):
        federation.round(server_round, [1, 2])
    assert seen[("client-1", 1)] == seen[("client-2", 1)] == 0.1
    assert seen[("client-1", 2)] == pytest.approx(0.1 * 40 / (2 * 10))
    assert seen[("client-2", 2)] == pytest.approx(0.1 * 40 / (2 * 30))
