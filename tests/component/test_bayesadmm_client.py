"""The BayesADMM/federated-ADMM client half in one process: training, dual step, durable state."""

import copy
import importlib
import logging

import numpy as np
import pytest
import torch

from fedbayes.bayes.curvature import diag_ggn
from fedbayes.bayes.ivon import hessian_init, hessian_init_within_weights
from fedbayes.bayes.params import flatten, get_parameters, unflatten
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode, encode, new_header
from fedbayes.strategies import get_algorithm, run_settings
from tests.support import DEFAULTS, newest_state, partition_runtime, settings

GROUPS = ("local_mean", "local_precision", "dual_mean", "dual_precision")


def make_runtime(tmp_path, strategy):
    """Partition 0 of 10; the same initial model, hence the same q̄ in `instruction`, in every runtime."""
    return partition_runtime(settings(strategy=strategy, fraction=0.05, model="logreg", input_scale=255.0), tmp_path)


FAMILY = {"bayesadmm": "diagonal", "fedadmm": "isotropic"}


def instruction(runtime, server_round, precision=1.0, dual_step=2e-4, accepted=0, hess_init=1e-3, beta2=0.9998):
    """Round `server_round`'s instruction; the server last accepted this client's round `accepted`."""
    torch.manual_seed(0)
    mean = flatten(get_parameters(runtime.model), runtime.layout)
    header = new_header(runtime.settings.federation, server_round)
    if accepted:
        header.accepted_rounds[runtime.node.client_id] = accepted
    family = FAMILY[runtime.settings.strategy]
    message = pb.BayesADMMInstruction(
        family=family,
        training=pb.LocalTraining(epochs=1, batch_size=32, learning_rate=5e-5, optimizer="adam", seed=0),
        rho=0.2,
        dual_step=dual_step,
        temperature=1e-3,
        hess_init=hess_init,
        beta1=0.9,
        beta2=beta2,
        mc_samples=1,
        rescale_lr=False,
        reset_posterior=True,
    )
    precision = {} if family == "isotropic" else unflatten(np.full_like(mean, precision), runtime.layout)
    return encode(
        pb.Instruction(header=header),
        message,
        {"global_mean": unflatten(mean, runtime.layout), "global_precision": precision},
    ), mean


def run_round(runtime, server_round, strategy, accepted=0, **ivon):
    content, global_mean = instruction(runtime, server_round, accepted=accepted, **ivon)
    reply = get_algorithm(strategy).client_half()(content, runtime)
    return decode(reply, pb.Reply, pb.BayesADMMReply, {g: runtime.layout for g in GROUPS}, sender="client"), global_mean


def test_bayesadmm_client_dual_step_and_state(tmp_path):
    runtime = make_runtime(tmp_path, "bayesadmm")
    payload, global_mean = run_round(runtime, 1, "bayesadmm")
    assert payload.reply.resumed_from_round == 0 and payload.reply.num_examples == 300
    m_k, s_k, v_k, u_k = (flatten(payload.tensors[g], runtime.layout) for g in GROUPS)
    # ess = N_k/(ρτ) = 300/(0.2·1e-3): precisions are large and above the prior's.
    assert (s_k > 1.0).all() and np.isfinite(m_k).all()
    np.testing.assert_allclose(v_k, 2e-4 * (s_k * m_k - 1.0 * global_mean), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(u_k, 2e-4 * (s_k - 1.0), rtol=1e-4, atol=1e-6)
    state = newest_state(runtime.state_store(runtime.settings.federation))
    assert state.round == 1 and {"ivon_hess", "ivon_momentum", "ivon_step"} <= set(state.tensors)
    # A new process (new runtime) for round 2, the server having accepted round 1, continues from those duals.
    payload, _ = run_round(make_runtime(tmp_path, "bayesadmm"), 2, "bayesadmm", accepted=1)
    assert payload.reply.resumed_from_round == 1
    # Round 2 run again (a server resumed from its round-1 checkpoint) starts from the same round-1 duals.
    again, _ = run_round(make_runtime(tmp_path, "bayesadmm"), 2, "bayesadmm", accepted=1)
    assert again.reply.resumed_from_round == 1
    for group in GROUPS:
        np.testing.assert_array_equal(
            flatten(again.tensors[group], runtime.layout), flatten(payload.tensors[group], runtime.layout)
        )
    # Round 2's reply was lost: round 3 rolls back to round 1's state, not round 2's.
    third, _ = run_round(make_runtime(tmp_path, "bayesadmm"), 3, "bayesadmm", accepted=1)
    assert third.reply.resumed_from_round == 1
    # A server that accepted nothing from this client (a new run of the name) gets fresh duals...
    fresh, _ = run_round(make_runtime(tmp_path, "bayesadmm"), 4, "bayesadmm", accepted=0)
    assert fresh.reply.resumed_from_round == 0
    # ...and so does one that accepted a round whose state is gone: the client says so (resumed from 0).
    lost, _ = run_round(make_runtime(tmp_path, "bayesadmm"), 9, "bayesadmm", accepted=7)
    assert lost.reply.resumed_from_round == 0


@pytest.fixture
def built(monkeypatch) -> list[dict]:
    """The keyword arguments of every IVON the BayesADMM client builds, in order."""
    client_module = importlib.import_module("fedbayes.strategies.bayesadmm.client")
    arguments: list[dict] = []

    class RecordingIVON(client_module.IVONWithPrior):
        def __init__(self, params, **kwargs):
            arguments.append(kwargs)
            super().__init__(params, **kwargs)

    monkeypatch.setattr(client_module, "IVONWithPrior", RecordingIVON)
    return arguments


def test_ivon_h0_and_beta2_at_zero_come_from_the_clients_data_and_steps(tmp_path, monkeypatch, built):
    """hess-init = beta2 = 0: h0 = hessian_init of the diagonal GGN of the client's first examples at
    q̄'s mean, bounded by hessian_init_within_weights at q̄'s mean and the client's ess, derived in its first round
    and read from its store after that; β2 = hessian_momentum(T) with T = epochs x
    ceil(N_k / batch) = ceil(300 / 32) = 10 steps a round."""
    client_module = importlib.import_module("fedbayes.strategies.bayesadmm.client")
    runtime = make_runtime(tmp_path, "bayesadmm")
    model = copy.deepcopy(runtime.model)  # q̄'s mean is the runtime's initial model (`instruction`)
    first = runtime.data.images[: client_module.HESS_INIT_EXAMPLES]  # 128 of its 300
    curvature_h0 = hessian_init(diag_ggn(model, first), len(first))
    ess = 300 / (0.2 * 0.001)  # N_k / (ρτ) with the instruction's ρ and τ
    weights = torch.nn.utils.parameters_to_vector(model.parameters()).detach().double()
    expected_h0 = hessian_init_within_weights(curvature_h0, weights, ess)
    payload, _ = run_round(runtime, 1, "bayesadmm", hess_init=0.0, beta2=0.0)
    assert payload.reply.num_examples == 300
    assert built[-1]["hess_init"] == pytest.approx(expected_h0, rel=1e-6)
    assert built[-1]["beta2"] == pytest.approx(0.9998 ** (190 / 10), rel=1e-12)
    state = newest_state(runtime.state_store(runtime.settings.federation))
    assert state.tensors["derived_hess_init"].item() == pytest.approx(expected_h0, rel=1e-6)
    # Round 2 in a new process: the stored h0, not one derived again at round 2's q̄ (the GGN is not computed).
    monkeypatch.setattr(client_module, "diag_ggn", lambda *args: pytest.fail("h0 derived again"))
    run_round(make_runtime(tmp_path, "bayesadmm"), 2, "bayesadmm", accepted=1, hess_init=0.0, beta2=0.0)
    assert built[-1]["hess_init"] == pytest.approx(expected_h0, rel=1e-6)
    # A value set in the run config is used as it is.
    run_round(make_runtime(tmp_path / "set", "bayesadmm"), 1, "bayesadmm", hess_init=0.05, beta2=0.99)
    assert (built[-1]["hess_init"], built[-1]["beta2"]) == (0.05, 0.99)


def test_a_derived_h0_that_would_drown_the_weights_is_bounded_by_them_and_the_client_says_so(
    tmp_path, monkeypatch, caplog, built
):
    """A curvature of almost nothing (as on the CNNs): h0 = 1 / (ess · mean(w²)) at q̄'s mean and this client's
    ess = N_k / (ρτ), and an INFO line naming both values."""
    client_module = importlib.import_module("fedbayes.strategies.bayesadmm.client")
    monkeypatch.setattr(client_module, "hessian_init", lambda ggn, examples: 1e-12)
    runtime = make_runtime(tmp_path, "bayesadmm")
    weights = torch.nn.utils.parameters_to_vector(runtime.model.parameters()).detach().double()
    ess = 300 / (0.2 * 0.001)
    with caplog.at_level(logging.INFO):
        run_round(runtime, 1, "bayesadmm", hess_init=0.0, beta2=0.0)
    bounded = 1.0 / (ess * float(weights.square().mean()))
    assert built[-1]["hess_init"] == pytest.approx(bounded, rel=1e-5)
    assert "IVON's h0 from the curvature, 1e-12, would make its first posterior over 3 times" in caplog.text
    assert f"h0 = {bounded:.3g}, as wide as them" in caplog.text


def test_fedadmm_client_is_a_point_estimate_with_linear_dual(tmp_path):
    runtime = make_runtime(tmp_path, "fedadmm")
    content, global_mean = instruction(runtime, 1, dual_step=0.2)
    layouts = {"local_mean": runtime.layout, "local_precision": {}, "dual_mean": runtime.layout, "dual_precision": {}}
    payload = decode(
        get_algorithm("fedadmm").client_half()(content, runtime), pb.Reply, pb.BayesADMMReply, layouts, sender="client"
    )
    # fixed unit covariance: no precisions travel (S_k = 1, U_k = 0 on both sides)
    assert payload.tensors["local_precision"] == {} and payload.tensors["dual_precision"] == {}
    m_k, v_k = (flatten(payload.tensors[g], runtime.layout) for g in ("local_mean", "dual_mean"))
    np.testing.assert_allclose(v_k, 0.2 * (m_k - global_mean), rtol=1e-5, atol=1e-7)  # Eq. 22
    assert np.abs(m_k - global_mean).max() > 0  # it trained


def test_full_covariance_client_solves_eq34_with_newton_steps(tmp_path):
    """bayesadmm-full (App. C.4) on a 7x7 logistic regression: after enough Newton steps the client's
    mean is the stationary point of Eq. 34, its precision is S̄ + H/ρ, and the duals move by γ(S_k m_k - S̄ m̄)
    and γ(S_k - S̄) as full matrices."""
    settings = run_settings(
        {**DEFAULTS, "strategy": "bayesadmm-full", "fraction": 0.05, "model": "logreg", "pool": 4, "temperature": 1.0}
    )
    node = NodeSettings.from_node_config({"partition-id": 0, "num-partitions": 10, "state-dir": str(tmp_path)}, "cpu")
    runtime = ClientRuntime.create(settings, node)
    size, rho, gamma = 500, 0.5, 0.1
    global_mean = flatten(get_parameters(runtime.model), runtime.layout)
    global_precision = 2.0 * np.eye(size)
    message = pb.BayesADMMInstruction(
        family="full",
        training=pb.LocalTraining(epochs=10, batch_size=32, learning_rate=1.0, optimizer="adam", seed=0),
        rho=rho,
        dual_step=gamma,
        temperature=1.0,
        hess_init=1e-3,
        beta1=0.9,
        beta2=0.9998,
        mc_samples=1,
        rescale_lr=False,
        reset_posterior=True,
    )
    content = encode(
        pb.Instruction(header=new_header(settings.federation, 1)),
        message,
        {
            "global_mean": unflatten(global_mean, runtime.layout),
            "global_precision": {"matrix": global_precision.astype(np.float32)},
        },
    )
    matrix = {"matrix": (size, size)}
    layouts = {
        "local_mean": runtime.layout,
        "local_precision": matrix,
        "dual_mean": runtime.layout,
        "dual_precision": matrix,
    }
    payload = decode(
        get_algorithm("bayesadmm-full").client_half()(content, runtime), pb.Reply, pb.BayesADMMReply, layouts, "client"
    )
    m_k = torch.from_numpy(flatten(payload.tensors["local_mean"], runtime.layout))
    s_k = torch.from_numpy(payload.tensors["local_precision"]["matrix"]).double()

    # The model written out independently: 4x4 average pooling, then softmax regression (summed loss).
    pooled = torch.nn.functional.avg_pool2d(runtime.data.images.double(), 4).flatten(1)

    def loss_sum(theta):
        logits = pooled @ theta[:490].view(10, 49).T + theta[490:]
        return torch.nn.functional.cross_entropy(logits, runtime.data.labels, reduction="sum")

    m_bar, s_bar = torch.from_numpy(global_mean), torch.from_numpy(global_precision)
    stationarity = torch.func.grad(loss_sum)(m_k) / rho + s_bar @ (m_k - m_bar)  # Eq. 34, first round: v = U = 0
    assert stationarity.norm() < 1e-3 * (s_bar @ (m_k - m_bar)).norm()
    expected_precision = s_bar + torch.func.jacrev(torch.func.jacrev(loss_sum))(m_k) / rho
    torch.testing.assert_close(s_k, expected_precision, rtol=1e-4, atol=1e-4)
    v_k = flatten(payload.tensors["dual_mean"], runtime.layout)
    u_k = payload.tensors["dual_precision"]["matrix"]
    np.testing.assert_allclose(v_k, gamma * (s_k @ m_k - s_bar @ m_bar).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(u_k, gamma * (s_k - s_bar).numpy(), rtol=1e-4, atol=1e-5)
    # Round 2 in a new process: the (P, P) dual comes back from the durable store.
    header = new_header(settings.federation, 2)
    header.accepted_rounds["client-0"] = 1
    content = encode(
        pb.Instruction(header=header),
        message,
        {
            "global_mean": unflatten(global_mean, runtime.layout),
            "global_precision": {"matrix": global_precision.astype(np.float32)},
        },
    )
    second = decode(
        get_algorithm("bayesadmm-full").client_half()(content, ClientRuntime.create(settings, node)),
        pb.Reply,
        pb.BayesADMMReply,
        layouts,
        "client",
    )
    assert second.reply.resumed_from_round == 1
    s_k2 = second.tensors["local_precision"]["matrix"].astype(np.float64)
    np.testing.assert_allclose(
        second.tensors["dual_precision"]["matrix"], u_k + gamma * (s_k2 - global_precision), rtol=1e-4, atol=1e-4
    )
