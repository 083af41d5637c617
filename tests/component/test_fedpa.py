"""FedPA's halves in one process: burn-in rounds are FedAvg bit for bit (T5), sampling rounds, the server
optimizers, rejection of bad replies, checkpoints, config."""

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedbayes.bayes.params import flatten, get_parameters
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode, encode, new_header
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.server.round_core import RoundCore
from fedbayes.strategies import get_algorithm
from fedbayes.strategies.fedpa.server import FedPA
from fedbayes.tasks.config import ConfigError
from tests.support import LAYOUT, FakeGrid, answers, reply_envelope, round_core, settings, weights


def fedpa_reply(client_id="client-0", server_round=1, num_examples=10, value=0.5, bias=None):
    message = pb.FedPAReply(samples=4)
    delta = weights(value) if bias is None else {**weights(value), "fc.bias": bias}
    return encode(reply_envelope(client_id, server_round, num_examples), message, {"delta": delta})


def arrays_of(value: float) -> ArrayRecord:
    return ArrayRecord({name: Array(array) for name, array in weights(value).items()})


def start_round(core: RoundCore, server_round: int, value: float = 1.0):
    return core.configure(server_round, arrays_of(value), FakeGrid([11, 12, 13]))


# ---- server half ----------------------------------------------------------------------------------
def test_the_server_announces_the_phase_and_each_phase_its_epochs():
    strategy = round_core(
        FedPA(
            settings(
                strategy="fedpa",
                **{"burn-in-rounds": 2, "local-epochs": 5, "samples": 3, "local-burnin-epochs": 1, "shrinkage": 0.5},
            ),
            LAYOUT,
        )
    )
    for server_round, sampling, epochs in ((1, False, 5), (2, False, 5), (3, True, 4)):
        messages = start_round(strategy, server_round).messages
        assert len(messages) == 3
        instruction = decode(
            messages[0].content, pb.Instruction, pb.FedPAInstruction, {"weights": LAYOUT}, sender="server"
        ).message
        assert (instruction.sampling, instruction.training.epochs) == (sampling, epochs)
        assert (instruction.shrinkage, instruction.samples, instruction.local_burnin_epochs) == (0.5, 3, 1)


def test_sgd_with_lr_one_is_the_weighted_model_average_and_bad_replies_are_left_out():
    strategy = round_core(FedPA(settings(strategy="fedpa"), LAYOUT))
    start_round(strategy, 1, value=1.0)
    nan_reply = fedpa_reply("client-2", value=0.1, bias=np.array([0.1, np.nan, 0.1], dtype=np.float32))
    plan, replies = answers(
        strategy,
        1,
        {
            11: fedpa_reply("client-0", num_examples=10, value=0.2),  # model 0.8
            12: fedpa_reply("client-1", num_examples=30, value=0.6),  # model 0.4
            13: nan_reply,
            14: fedpa_reply("client-3", num_examples=0, value=0.6),
            15: fedpa_reply("client-4", server_round=2),
        },
    )
    outcome = strategy.aggregate(plan, replies)
    for name in LAYOUT:
        np.testing.assert_allclose(outcome.arrays[name].numpy(), (10 * 0.8 + 30 * 0.4) / 40, rtol=1e-6)
    assert outcome.report.accepted == ["client-0", "client-1"]
    reasons = outcome.report.rejected
    assert "field 'delta/fc.bias': contains NaN or Inf" in reasons["client 'client-2' (node 13)"]
    assert "field 'num_examples': 0 is not in [1, max-client-examples" in reasons["client 'client-3' (node 14)"]
    assert "round 2" in reasons["client 'client-4' (node 15)"]
    assert outcome.metrics["delta-norm"] == pytest.approx(math.sqrt(15) * 0.5) and outcome.metrics["samples"] == 4


def server_steps(strategy: RoundCore, gradients: list[float]) -> list[float]:
    """θ (one coordinate) after each round, starting at 1, when every client sends `gradient`."""
    value, values = 1.0, []
    for server_round, gradient in enumerate(gradients, start=1):
        start_round(strategy, server_round, value)
        arrays = strategy.aggregate(
            *answers(strategy, server_round, {11: fedpa_reply(server_round=server_round, value=gradient)})
        ).arrays
        value = float(arrays["fc.bias"].numpy()[0])
        values.append(value)
    return values


@pytest.mark.parametrize(
    ("optimizer", "expected"),
    [
        # FedAvgM: v <- 0.9 v + g, θ <- θ - η v
        (
            {"server-optimizer": "sgd", "server-lr": 0.5, "server-momentum": 0.9},
            [1 - 0.5 * 0.2, 1 - 0.5 * 0.2 - 0.5 * 0.38],
        ),
        # Adam with bias correction: first step η g / (|g| + τ)
        ({"server-optimizer": "adam", "server-lr": 0.1, "server-eps": 1e-3}, [1 - 0.1 * 0.2 / (0.2 + 1e-3), None]),
        # Adagrad: s <- s0 + g², θ <- θ - η g / (√s + τ)
        (
            {"server-optimizer": "adagrad", "server-lr": 1.0, "server-eps": 1e-5, "server-adagrad-init": 0.1},
            [1 - 0.2 / (math.sqrt(0.1 + 0.04) + 1e-5), None],
        ),
    ],
)
def test_server_optimizers_follow_their_formulas(optimizer, expected):
    values = server_steps(round_core(FedPA(settings(strategy="fedpa", **optimizer), LAYOUT)), [0.2, 0.2])
    for value, want in zip(values, expected):
        if want is not None:
            assert value == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize(("optimizer", "rule"), [("sgd", "none"), ("adam", "none"), ("sgd", "median")])
def test_a_server_restored_from_its_state_steps_from_the_same_theta(optimizer, rule):
    """θ is FedPA's declared state: a server restored from round 1's state, before it sends anything itself, screens
    round 2's replies against the θ round 1 made and steps its optimizer from it, exactly as the server it
    replaces does."""
    config = settings(
        strategy="fedpa",
        **{"server-optimizer": optimizer, "server-lr": 0.5, "server-momentum": 0.9, "robust-aggregation": rule},
    )
    core = round_core(FedPA(config, LAYOUT))
    start_round(core, 1, value=1.0)
    first = {
        11: fedpa_reply("client-0", num_examples=10, value=0.2),
        12: fedpa_reply("client-1", num_examples=30, value=0.6),
    }
    assert core.aggregate(*answers(core, 1, first)).arrays is not None
    saved = core.state_dict()
    assert saved.tensors["theta"].dtype == np.float32
    restored = round_core(FedPA(config, LAYOUT))
    restored.load_state_dict(saved)
    np.testing.assert_array_equal(restored.strategy.theta, core.strategy.theta)
    assert restored.strategy.theta.dtype == np.float64
    second = {
        11: fedpa_reply("client-0", server_round=2, num_examples=10, value=0.1),
        12: fedpa_reply("client-1", server_round=2, num_examples=30, value=-0.3),
    }
    original, resumed = (server.aggregate(*answers(server, 2, second)) for server in (core, restored))
    assert resumed.report.accepted == original.report.accepted == ["client-0", "client-1"]
    assert resumed.metrics["delta-norm"] == original.metrics["delta-norm"]
    for name in LAYOUT:
        np.testing.assert_array_equal(resumed.arrays[name].numpy(), original.arrays[name].numpy())


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
def test_a_resumed_server_continues_its_optimizer(tmp_path, optimizer):
    """Two rounds, checkpoint, a new strategy restored from it: round 3 as if never interrupted."""
    config = settings(
        strategy="fedpa",
        **{"server-optimizer": optimizer, "server-momentum": 0.9 if optimizer == "sgd" else 0.0, "server-lr": 0.1},
    )
    straight = server_steps(round_core(FedPA(config, LAYOUT)), [0.2, -0.1, 0.3])
    first = round_core(FedPA(config, LAYOUT))
    values = server_steps(first, [0.2, -0.1])
    store = CheckpointStore(tmp_path, "fed", {})
    store.save(
        Checkpoint(
            2, {name: np.full(shape, values[-1], np.float32) for name, shape in LAYOUT.items()}, first.state_dict(), 1.0
        )
    )
    resumed = round_core(FedPA(config, LAYOUT))
    resumed.load_state_dict(store.load().strategy_state)
    start_round(resumed, 3, values[-1])
    arrays = resumed.aggregate(*answers(resumed, 3, {11: fedpa_reply(server_round=3, value=0.3)})).arrays
    assert float(arrays["fc.bias"].numpy()[0]) == pytest.approx(straight[-1], rel=1e-6)
    assert float(arrays["fc.bias"].numpy()[0]) != pytest.approx(
        server_steps(round_core(FedPA(config, LAYOUT)), [0.3])[0], rel=1e-6
    )  # a fresh optimizer would step differently


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("server-optimizer", "rmsprop", "'server-optimizer' must be one of sgd, adam, adagrad"),
        ("shrinkage", -0.1, "'shrinkage' must be >= 0"),
        ("samples", 0, "'samples' must be >= 1"),
        ("burn-in-rounds", -1, "'burn-in-rounds' must be >= 0"),
    ],
)
def test_bad_fedpa_config_names_its_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        settings(strategy="fedpa", **{key: value})


# ---- client half ----------------------------------------------------------------------------------
def client_runtime(**overrides) -> ClientRuntime:
    node = NodeSettings.from_node_config({"partition-id": 0, "num-partitions": 20}, default_device="cpu")
    return ClientRuntime.create(settings(strategy="fedpa", fraction=0.1, model="logreg", **overrides), node)


TRAINING = pb.LocalTraining(epochs=3, batch_size=32, learning_rate=0.01, optimizer="adam", seed=1)


def fedpa_round(runtime, global_weights, server_round, sampling, shrinkage=0.0, samples=3):
    instruction = pb.FedPAInstruction(
        training=TRAINING, sampling=sampling, shrinkage=shrinkage, local_burnin_epochs=1, samples=samples
    )
    content = encode(pb.Instruction(header=new_header("fed", server_round)), instruction, {"weights": global_weights})
    reply = get_algorithm("fedpa").client_half()(content, runtime)
    return decode(reply, pb.Reply, pb.FedPAReply, {"delta": runtime.layout}, sender="client")


def test_a_burn_in_round_is_fedavg_bit_for_bit():
    runtime = client_runtime()
    global_weights = get_parameters(runtime.model)
    fedavg = encode(
        pb.Instruction(header=new_header("fed", 4)),
        pb.FedAvgInstruction(training=TRAINING),
        {"weights": global_weights},
    )
    reply = get_algorithm("fedavg").client_half()(fedavg, runtime)
    trained = decode(reply, pb.Reply, pb.FedAvgReply, {"weights": runtime.layout}, sender="client").tensors["weights"]
    payload = fedpa_round(runtime, global_weights, 4, sampling=False)
    for name in runtime.layout:  # x_0 - θ_final, with θ_final exactly FedAvg's local model
        np.testing.assert_array_equal(payload.tensors["delta"][name], global_weights[name] - trained[name])
    assert payload.message.samples == 0 and payload.reply.num_examples == 300


def test_a_sampling_round_returns_the_shrinkage_delta():
    runtime = client_runtime()
    global_weights = get_parameters(runtime.model)
    plain = fedpa_round(runtime, global_weights, 5, sampling=True, shrinkage=0.0)
    corrected = fedpa_round(runtime, global_weights, 5, sampling=True, shrinkage=10.0)
    assert plain.message.samples == corrected.message.samples == 3
    plain_delta, corrected_delta = (flatten(p.tensors["delta"], runtime.layout) for p in (plain, corrected))
    # ρ = 0: Δ = x_0 - x̄, the iterate-averaged FedAvg delta (up to float32 round-off of the recurrence)
    assert plain.message.correction_norm < 1e-5 * np.linalg.norm(plain_delta)
    # Same seed, same chain: the difference is the covariance, whose norm the client reports.
    assert np.linalg.norm(corrected_delta - plain_delta) == pytest.approx(corrected.message.correction_norm, rel=1e-4)
    assert corrected.message.correction_norm > 0.1 * np.linalg.norm(plain_delta)
    burn_in = flatten(fedpa_round(runtime, global_weights, 5, sampling=False).tensors["delta"], runtime.layout)
    assert 0 < np.linalg.norm(plain_delta) < np.linalg.norm(burn_in)  # x̄ lags the last iterate
