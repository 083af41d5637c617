"""The BayesADMM/federated-ADMM client half in one process: training, dual step, durable state."""

import numpy as np
import pytest
import torch

from bayes.params import flatten, get_parameters, unflatten
from client.runtime import ClientRuntime, NodeSettings
from protos import payloads_pb2 as pb
from protos.codec import decode, encode, new_header
from strategies import get_algorithm
from tasks.config import RunSettings
from tests.test_config import DEFAULTS

GROUPS = ("local_mean", "local_precision", "dual_mean", "dual_precision")


def make_runtime(tmp_path, strategy):
    settings = RunSettings.from_run_config(
        {**DEFAULTS, "strategy": strategy, "fraction": 0.05, "model": "logreg", "input-scale": 255.0}
    )
    node = NodeSettings.from_node_config(
        {"partition-id": 0, "num-partitions": 10, "state-dir": str(tmp_path)}, default_device="cpu"
    )
    return ClientRuntime.create(settings, node)


def instruction(runtime, server_round, precision=1.0, dual_step=2e-4):
    torch.manual_seed(0)
    mean = flatten(get_parameters(runtime.model), runtime.layout)
    message = pb.BayesADMMInstruction(
        header=new_header(runtime.settings.federation, server_round),
        training=pb.LocalTraining(epochs=1, batch_size=32, learning_rate=5e-5, optimizer="adam", seed=0),
        rho=0.2, dual_step=dual_step, temperature=1e-3, hess_init=1e-3, beta1=0.9, beta2=0.9998, mc_samples=1,
        rescale_lr=False, reset_posterior=True,
    )
    return encode(message, {"global_mean": unflatten(mean, runtime.layout),
                            "global_precision": unflatten(np.full_like(mean, precision), runtime.layout)}), mean


def run_round(runtime, server_round, strategy):
    content, global_mean = instruction(runtime, server_round)
    reply = get_algorithm(strategy).client_update(content, runtime)
    return decode(reply, pb.BayesADMMReply, {g: runtime.layout for g in GROUPS}, sender="client"), global_mean


def test_bayesadmm_client_dual_step_and_state(tmp_path):
    runtime = make_runtime(tmp_path, "bayesadmm")
    payload, global_mean = run_round(runtime, 1, "bayesadmm")
    assert payload.message.resumed_from_round == 0 and payload.message.num_examples == 300
    m_k, s_k, v_k, u_k = (flatten(payload.tensors[g], runtime.layout) for g in GROUPS)
    # ess = N_k/(ρτ) = 300/(0.2·1e-3): precisions are large and above the prior's.
    assert (s_k > 1.0).all() and np.isfinite(m_k).all()
    np.testing.assert_allclose(v_k, 2e-4 * (s_k * m_k - 1.0 * global_mean), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(u_k, 2e-4 * (s_k - 1.0), rtol=1e-4, atol=1e-6)
    state = runtime.store.load()
    assert state.metadata["round"] == "1" and {"ivon_hess", "ivon_momentum", "ivon_step"} <= set(state.tensors)
    # A new process (new runtime) for round 2 continues from those duals.
    payload, _ = run_round(make_runtime(tmp_path, "bayesadmm"), 2, "bayesadmm")
    assert payload.message.resumed_from_round == 1
    # The same federation's state replayed at round 1 (another run, same name) is refused.
    with pytest.raises(ValueError, match="earlier run of federation"):
        run_round(make_runtime(tmp_path, "bayesadmm"), 1, "bayesadmm")


def test_fedadmm_client_is_a_point_estimate_with_linear_dual(tmp_path):
    runtime = make_runtime(tmp_path, "fedadmm")
    content, global_mean = instruction(runtime, 1, dual_step=0.2)
    payload = decode(get_algorithm("fedadmm").client_update(content, runtime), pb.BayesADMMReply,
                     {g: runtime.layout for g in GROUPS}, sender="client")
    m_k, s_k, v_k, u_k = (flatten(payload.tensors[g], runtime.layout) for g in GROUPS)
    assert (s_k == 1.0).all() and (u_k == 0.0).all()
    np.testing.assert_allclose(v_k, 0.2 * (m_k - global_mean), rtol=1e-5, atol=1e-7)  # Eq. 22
    assert np.abs(m_k - global_mean).max() > 0  # it trained
