"""Run config `noise`: with `shared`, every BayesADMM client draws IVON's weight noise and its minibatch order from
the server's noise seed, the same in every round (the reference code); with `independent`, from its own seed. The
permutation and the noise come from one generator, the permutation first, so the noise does not replay the draws
that made the initial weights."""

import numpy as np
import pytest
import torch

import fedbayes.strategies.bayesadmm.client as bayesadmm
from fedbayes.bayes.ivon import IVONWithPrior
from fedbayes.bayes.params import flatten, get_parameters, unflatten
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode, encode, new_header
from fedbayes.strategies import run_settings
from fedbayes.strategies.bayesadmm.server import BayesADMM
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.models import build_model, parse_hidden
from tests.support import DEFAULTS, partition_runtime, settings

GROUPS = ("local_mean", "local_precision", "dual_mean", "dual_precision")


def runtime(tmp_path, client_id, noise):
    """A client on partition 0 of the split: two of them with different ids hold equal data."""
    run = settings(strategy="bayesadmm", fraction=0.05, model="logreg", input_scale=255.0, noise=noise, seed=7)
    return partition_runtime(run, tmp_path / client_id, client_id=client_id)


def instruction(client, server_round, shared_noise, noise_seed=7):
    torch.manual_seed(0)
    mean = flatten(get_parameters(client.model), client.layout)
    message = pb.BayesADMMInstruction(
        family="diagonal",
        training=pb.LocalTraining(epochs=1, batch_size=32, learning_rate=5e-5, optimizer="adam", seed=0),
        rho=0.2,
        dual_step=2e-4,
        temperature=1e-3,
        hess_init=1e-3,
        beta1=0.9,
        beta2=0.9998,
        mc_samples=1,
        rescale_lr=False,
        reset_posterior=True,
        shared_noise=shared_noise,
        noise_seed=noise_seed,
    )
    return encode(
        pb.Instruction(header=new_header(client.settings.federation, server_round)),
        message,
        {
            "global_mean": unflatten(mean, client.layout),
            "global_precision": unflatten(np.ones_like(mean), client.layout),
        },
    )


@pytest.fixture
def draws(monkeypatch):
    """Per local training: (minibatch-order seed, torch's global generator state, i.e. IVON's noise stream)."""
    recorded = []
    real = bayesadmm.train_epochs

    def spy(*args, **kwargs):
        recorded.append((kwargs["seed"], torch.random.get_rng_state().clone()))
        return real(*args, **kwargs)

    monkeypatch.setattr(bayesadmm, "train_epochs", spy)
    return recorded


def local_mean(reply, client):
    return flatten(
        decode(reply, pb.Reply, pb.BayesADMMReply, {g: client.layout for g in GROUPS}, sender="client").tensors[
            "local_mean"
        ],
        client.layout,
    )


def train(clients, server_round, shared_noise):
    return [local_mean(bayesadmm.client_update(instruction(c, server_round, shared_noise), c), c) for c in clients]


def test_shared_noise_is_one_stream_for_every_client_and_round(tmp_path, draws):
    clients = [runtime(tmp_path, name, "shared") for name in ("alice", "bob")]
    assert len(clients[0].data.labels) == len(clients[1].data.labels) > 0
    first = train(clients, 1, shared_noise=True)
    train(clients, 2, shared_noise=True)
    seeds = {seed for seed, _ in draws}
    assert seeds == {7} and len(draws) == 4
    for _, state in draws[1:]:
        assert torch.equal(state, draws[0][1])
    np.testing.assert_array_equal(first[0], first[1])  # equal data + equal noise: the same local posterior


def test_independent_noise_differs_between_clients_and_rounds(tmp_path, draws):
    clients = [runtime(tmp_path, name, "independent") for name in ("alice", "bob")]
    first = train(clients, 1, shared_noise=False)
    train(clients, 2, shared_noise=False)
    assert len({seed for seed, _ in draws}) == 4
    states = [state for _, state in draws]
    assert not any(torch.equal(a, b) for i, a in enumerate(states) for b in states[i + 1 :])
    assert not np.array_equal(first[0], first[1])


def sent_instruction(run) -> pb.BayesADMMInstruction:
    """Round 1's instruction as the server sends it, decoded."""
    from flwr.app import Array, ArrayRecord

    from tests.support import FakeGrid, round_core

    layout = {"weight": (2, 5), "bias": (2,)}
    arrays = ArrayRecord({"weight": Array(np.zeros((2, 5), np.float32)), "bias": Array(np.zeros(2, np.float32))})
    [message] = round_core(BayesADMM(run, layout)).configure(1, arrays, FakeGrid([1])).messages
    groups = {"global_mean": layout, "global_precision": layout}
    return decode(message.content, pb.Instruction, pb.BayesADMMInstruction, groups, sender="server").message


def test_server_sends_the_run_seed_as_noise_seed():
    for noise, shared in (("shared", True), ("independent", False)):
        run = run_settings({**DEFAULTS, "strategy": "bayesadmm", "model": "logreg", "noise": noise, "seed": 11})
        sent = sent_instruction(run)
        assert (sent.shared_noise, sent.noise_seed) == (shared, 11)


def test_the_shared_noise_does_not_replay_the_draws_of_the_initial_weights(tmp_path, monkeypatch):
    # The server draws the initial weights from torch's generator seeded with the run seed (server/app.py), and the
    # clients seed it with the same seed for the noise. The reference code draws an epoch's permutation from that
    # generator before the noise, so its noise is not the initial weights' own uniforms transformed; drawing the
    # permutation elsewhere made every round's first noise exactly that, correlated about -0.35 with the weights.
    client = runtime(tmp_path, "alice", "shared")
    run = client.settings
    torch.manual_seed(run.seed)
    model = build_model(run.model, (1, 28, 28), 10, parse_hidden(run.hidden), run.activation, run.pool)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    noises = []
    real = IVONWithPrior._sample_params

    def spy(optimizer):
        averages, noise = real(optimizer)
        noises.append(noise.clone())
        return averages, noise

    monkeypatch.setattr(IVONWithPrior, "_sample_params", spy)
    bayesadmm.client_update(instruction(client, 1, True, sent_instruction(run).noise_seed), client)
    # the global precision is uniform in this instruction, so the noise's scale is too
    assert abs(np.corrcoef(weights, noises[0].numpy())[0, 1]) < 0.05
    torch.manual_seed(run.seed)  # what a noise drawn first from the seeded generator is
    assert np.corrcoef(weights, torch.randn(len(weights)).numpy())[0, 1] < -0.3


def test_noise_key_is_checked():
    with pytest.raises(ConfigError, match="'noise'"):
        run_settings({**DEFAULTS, "noise": "same"})
