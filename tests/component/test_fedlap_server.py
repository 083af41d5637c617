"""FedLap / FedLap-Cov networked halves in one process: the server's global equals the product of the prior and
the clients' stored sites (the consistent init included), through partial rounds, a join, lost state and a
checkpoint round trip."""

import shutil

import pytest
import torch

from fedbayes.bayes.params import flatten
from fedbayes.strategies.fedlap.math import global_from_sites
from tests.support import FakeGrid, InProcessFederation, newest_state, reply_message


def global_from_stores(federation, delta):
    """S_g = δ + Σ V_k and w_g = Σ v_k / S_g from the clients' durable sites."""
    stores = [runtime.state_store("fed") for runtime in federation.runtimes.values()]
    states = [newest_state(store) for store in stores if store.saved_rounds()]
    return global_from_sites(
        torch.stack([s.tensors["site_mean"] for s in states]).sum(0),
        torch.stack([s.tensors["site_precision"] for s in states]).sum(0),
        delta,
    )


@pytest.mark.parametrize("strategy", ["fedlap", "fedlap-cov"])
def test_global_is_the_prior_times_the_clients_sites(tmp_path, strategy):
    delta = 0.5
    federation = InProcessFederation(
        tmp_path, {"strategy": strategy, "prior-precision": delta, "local-epochs": 2, "lr": 0.05}, sizes=[12, 30, 20, 8]
    )
    server = federation.server
    initial = torch.from_numpy(flatten({n: federation.arrays[n].numpy() for n in federation.layout}, federation.layout))
    federation.round(1, [1, 2, 3])  # full first round: the three clients share δ w_0
    assert server.state.unclaimed.abs().max() < 1e-6 * initial.abs().max()
    for server_round in range(2, 7):
        if server_round == 5:
            shutil.rmtree(federation.runtimes[1].state_store("fed").directory)  # client-1 loses its state
        federation.round(server_round, [1, 2, 3, 4])  # client-4 joins in round 2
        mean, precision = global_from_stores(federation, delta)
        torch.testing.assert_close(server.global_mean, mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(server.global_precision, precision, rtol=1e-6, atol=0)
        if strategy == "fedlap":
            assert torch.all(server.global_precision == delta)
        else:
            assert (server.global_precision > delta).all()
    assert server.state.membership.clients == 4
    restored = type(server)(federation.settings, federation.layout)
    restored.commit(restored.load_state(server.save_state(server.state)))
    for name in ("global_mean", "global_precision", "unclaimed"):
        torch.testing.assert_close(getattr(restored.state, name), getattr(server.state, name), rtol=0, atol=0)
    assert restored.state.sites.keys() == server.state.sites.keys()
    assert restored.state.membership == server.state.membership


def test_a_round_one_client_that_never_replies_leaves_its_share_unclaimed(tmp_path):
    """With K₁ = 3 but only two replies, w_g keeps the missing third of δ w_0 instead of losing it."""
    federation = InProcessFederation(tmp_path, {"strategy": "fedlap", "prior-precision": 1.0}, sizes=[10, 10, 10])
    server = federation.server
    plan = federation.core.configure(1, federation.arrays, FakeGrid([1, 2, 3]))
    messages = plan.messages
    replies = [
        reply_message(
            federation.client_update(m.content, federation.runtimes[m.metadata.dst_node_id]), m.metadata.dst_node_id
        )
        for m in messages[:2]
    ]
    initial = server.global_mean.clone()
    federation.core.aggregate(plan, replies)
    torch.testing.assert_close(server.state.unclaimed, initial / 3, rtol=1e-6, atol=1e-7)


def test_site_damping_and_its_rule_reach_the_clients_site_step(tmp_path):
    """Round 1 trains the same from the same init whatever ρ_k, and its site step from V_k = 0 gives V_k = ρ_k H_k:
    with `site-damping=1` V_k = H_k, with the paper's rule H_k/K (K = 3), and with the default curvature rule
    (1/K + (1 − 1/K)·H_k/(H_k + P_k))·H_k, P_k = δ = 0.5 in round 1 (no sites yet)."""
    precisions = {}
    for name, keys in (
        ("one", {"site-damping": 1.0}),
        ("paper", {"site-damping-rule": "paper"}),
        ("curvature", {}),
    ):
        config = {"strategy": "fedlap-cov", "prior-precision": 0.5, "lr": 0.05, **keys}
        federation = InProcessFederation(tmp_path / name, config, sizes=[12, 30, 20])
        federation.round(1, [1, 2, 3])
        stores = [federation.runtimes[node].state_store("fed") for node in (1, 2, 3)]
        precisions[name] = torch.stack([newest_state(store).tensors["site_precision"] for store in stores])
    curvature = precisions["one"]
    assert (curvature > 0).any()
    torch.testing.assert_close(curvature, 3 * precisions["paper"], rtol=1e-6, atol=1e-12)
    expected = (1 / 3 + 2 / 3 * curvature / (curvature + 0.5)) * curvature
    torch.testing.assert_close(precisions["curvature"], expected, rtol=1e-6, atol=1e-12)
