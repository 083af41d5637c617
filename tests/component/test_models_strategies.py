"""The convolutional models under every strategy: two clients with tiny image partitions run two rounds of each
strategy's real client half against its real server half (encoded payloads, durable stores under tmp_path), and
the dropout mode of every pass (train in local training, eval in curvature and evaluation)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedbayes.bayes.curvature import diag_ggn
from fedbayes.bayes.metrics import predict_probs
from fedbayes.bayes.params import buffer_layout, get_parameters, parameter_layout
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies import get_algorithm, run_settings
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.models import CONV_MODELS, build_model
from tests.support import DEFAULTS, NO_GPU, FakeGrid, client_runtime, reply_message, round_core

SHAPE, CLASSES = (3, 16, 16), 10  # CIFAR's channels at a quarter of the pixels: the smallest cnn-acar accepts
TINY = {  # one short epoch, few particles and steps: the point is that every piece runs on these models
    "local-epochs": 1,
    "batch-size": 8,
    "particles": 2,
    "local-steps": 2,
    "distill-steps": 2,
    "server-steps": 2,
    "server-fit-steps": 2,
    "burn-in-rounds": 1,
    "samples": 2,
    "local-burnin-epochs": 0,
    "fraction-train": 1.0,
}
STRATEGIES = (
    "fedavg",
    "fedprox",
    "bayesadmm",
    "fedadmm",
    "feddyn",
    "fedlap",
    "fedlap-cov",
    "fedlap-func",
    "fedpa",
    "dsvgd",
    "p-dsvgd",
)


def image_data(size: int, seed: int) -> Dataset:
    """`size` images whose class is the brightest of 10 fixed pixel patterns (learnable, not random)."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.rand(CLASSES, *SHAPE, generator=torch.Generator().manual_seed(99))
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    images = 0.5 * torch.rand(size, *SHAPE, generator=generator) + patterns[labels]
    return Dataset("cifar10", images, labels, CLASSES, pixel_scale=1.0)


def image_task(folder) -> str:
    """The run-config `dataset` of image_data's task: a test.npz of its images under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    test = image_data(20, seed=0)
    np.savez(folder / "test.npz", x=test.images.numpy(), y=test.labels.numpy())
    return f"npz:{folder}"


def run_rounds(tmp_path, model: str, strategy: str, rounds: int = 2, device: str = "cpu", on_forward=None):
    """`rounds` rounds of two clients through the strategy's real halves; `on_forward(module, args, output)` is
    hooked onto each client's model."""
    task = {"dataset": image_task(tmp_path / "task")}  # the images' shape, for a server half that reads it
    settings = run_settings({**DEFAULTS, **TINY, "model": model, "strategy": strategy, **task})
    algorithm = get_algorithm(strategy)
    runtimes = {
        node: client_runtime(settings, f"client-{node}", tmp_path, image_data(6 + 2 * node, node), device)
        for node in (1, 2)
    }
    if on_forward is not None:
        for runtime in runtimes.values():
            runtime.model.register_forward_hook(on_forward)
    layout = runtimes[1].layout
    server = round_core(algorithm.build_server(settings, layout))
    torch.manual_seed(settings.seed)
    initial = get_parameters(build_model(model, SHAPE, CLASSES))
    arrays = ArrayRecord({name: Array(value) for name, value in initial.items()})
    for server_round in range(1, rounds + 1):
        plan = server.configure(server_round, arrays, FakeGrid(runtimes))
        messages = plan.messages
        replies = [
            reply_message(algorithm.client_half()(m.content, runtimes[m.metadata.dst_node_id]), m.metadata.dst_node_id)
            for m in messages
        ]
        updated = server.aggregate(plan, replies).arrays
        assert updated is not None, f"{strategy} on {model}: round {server_round} was rejected"
        arrays = updated
    return server, initial, {name: arrays[name].numpy() for name in layout}


def assert_trained(server, initial, final, model: str, strategy: str) -> None:
    scheduled = {"dsvgd": {"client-1", "client-2"}}.get(strategy)  # DSVGD: one client per round, in turn
    assert set(server.accepted_rounds) == (scheduled or {"client-1", "client-2"})
    assert all(np.isfinite(value).all() for value in final.values())
    moved = sum(float(np.abs(final[name] - initial[name]).sum()) for name in initial)
    assert moved > 0.0, f"{strategy} left {model}'s global weights where they started"


@pytest.mark.parametrize("model", ["cnn-zenke", "cnn-acar", "resnet20"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_the_convolutional_models(tmp_path, model, strategy):
    assert_trained(*run_rounds(tmp_path, model, strategy), model, strategy)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_a_cnn_on_the_gpu(tmp_path, strategy):
    seen = set()
    server, initial, final = run_rounds(
        tmp_path, "cnn-acar", strategy, device="cuda", on_forward=lambda module, args, out: seen.add(out.device.type)
    )
    assert_trained(server, initial, final, "cnn-acar", strategy)
    assert seen == {"cuda"}, f"{strategy}'s client ran forward passes on {sorted(seen)}"


def test_groupnorm_resnet_trains_under_bayesadmm(tmp_path):
    server, initial, final = run_rounds(tmp_path, "resnet20-gn", "bayesadmm")
    assert server.accepted_rounds == {"client-1": 2, "client-2": 2}
    assert any(not np.array_equal(final[name], initial[name]) for name in initial)


def test_full_covariance_bayesadmm_refuses_a_cnn_by_its_config_key():
    settings = run_settings({**DEFAULTS, "model": "cnn-acar", "strategy": "bayesadmm-full"})
    layout = parameter_layout(build_model("cnn-acar", SHAPE, CLASSES))
    with pytest.raises(ConfigError, match="needs model=logreg"):
        get_algorithm("bayesadmm-full").build_server(settings, layout)


class DropoutModes:
    """Records the mode of every dropout layer of a model each time one runs."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modes: list[bool] = []
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.register_forward_hook(lambda layer, args, out: self.modes.append(layer.training))

    def take(self) -> set[bool]:
        modes, self.modes = set(self.modes), []
        return modes


def test_dropout_is_on_in_local_training_and_off_in_curvature_and_evaluation():
    data = image_data(16, 0)
    torch.manual_seed(0)
    model = build_model("cnn-zenke", SHAPE, CLASSES)
    recorder = DropoutModes(model)
    model.eval()  # whatever mode it comes in, training switches dropout on
    training = pb.LocalTraining(epochs=1, batch_size=8, learning_rate=1e-3, optimizer="adam")
    train_epochs(model, data, make_optimizer(model, training), 1, 8, torch.device("cpu"), seed=0)
    assert recorder.take() == {True}
    first = diag_ggn(model, data.images[:4])
    assert recorder.take() == {False}
    assert model.training  # diag_ggn restores the mode it found
    torch.testing.assert_close(diag_ggn(model, data.images[:4]), first)  # no dropout noise in the curvature
    predict_probs(model, data.images, 8, torch.device("cpu"))
    assert recorder.take() == {False}


def test_dsvgd_particles_draw_independent_dropout_masks():
    """Loop 1's gradients run the model in train mode with one dropout mask per particle: two identical particles
    get different gradients (with dropout off, or one shared mask, they would be equal)."""
    from fedbayes.strategies.dsvgd.client import MinibatchLossGradient

    data = image_data(8, 0)
    torch.manual_seed(0)
    model = build_model("cnn-zenke", SHAPE, CLASSES).eval()
    layout = parameter_layout(model)
    theta = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    gradient = MinibatchLossGradient(model, layout, data, 8, seed=0, device=torch.device("cpu"))
    gradients = gradient(torch.stack([theta, theta]))
    assert model.training
    assert not torch.allclose(gradients[0], gradients[1])


@pytest.mark.parametrize("model", CONV_MODELS)
def test_dsvgd_initial_particles_follow_the_layers(model):
    """Conv and Linear weights are drawn U(±1/√fan_in) per particle; normalisation scales start at 1 and shifts
    and thresholds at 0 in every particle."""
    from fedbayes.strategies.dsvgd.math import initial_particles

    layout = parameter_layout(build_model(model, SHAPE, CLASSES))
    particles = initial_particles(layout, 3, seed=0)
    offset = 0
    for name, shape in layout.items():
        block = particles[:, offset : offset + int(np.prod(shape))]
        offset += block.shape[1]
        if len(shape) >= 2 and name.endswith(".weight"):
            bound = 1 / np.sqrt(np.prod(shape[1:]))
            assert np.abs(block).max() <= bound and np.abs(block).max() > 0.5 * bound
            assert not np.array_equal(block[0], block[1])
        elif name.endswith((".gamma", ".weight")):
            assert (block == 1).all(), name
        elif name.endswith((".beta", ".tau")) or len(layout.get(name.replace(".bias", ".weight"), ())) < 2:
            assert (block == 0).all(), name
    assert offset == particles.shape[1]


class BatchNormNet(torch.nn.Module):
    """A model with buffers: BatchNorm's running statistics are state, not parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.norm = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, CLASSES)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


@pytest.mark.parametrize("strategy", ["fedavg", "bayesadmm", "fedadmm", "feddyn", "fedlap", "fedpa"])
def test_a_model_with_buffers_trains_and_the_core_averages_its_buffers(tmp_path, strategy, monkeypatch):
    """Every strategy's math runs on the parameters; the round core sends the global buffers, and averages the
    clients' buffers after their training, weighted by their example counts."""
    monkeypatch.setattr("fedbayes.client.runtime.build_run_model", lambda *args: BatchNormNet())
    settings = run_settings({**DEFAULTS, **TINY, "strategy": strategy, "burn-in-rounds": 0})
    algorithm = get_algorithm(strategy)
    runtimes = {
        node: client_runtime(settings, f"client-{node}", tmp_path, image_data(6 + 2 * node, node)) for node in (1, 2)
    }
    for client in runtimes.values():
        torch.manual_seed(0)
        client.model = BatchNormNet()
        client.layout, client.buffer_layout = parameter_layout(client.model), buffer_layout(client.model)
    assert set(runtimes[1].buffer_layout) == {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked"}
    server = round_core(algorithm.build_server(settings, runtimes[1].layout, runtimes[1].buffer_layout))
    torch.manual_seed(0)
    arrays = ArrayRecord({name: Array(value) for name, value in get_parameters(BatchNormNet()).items()})
    for server_round in (1, 2):
        plan = server.configure(server_round, arrays, FakeGrid(runtimes))
        messages = plan.messages
        replies = [
            reply_message(algorithm.client_half()(m.content, runtimes[m.metadata.dst_node_id]), m.metadata.dst_node_id)
            for m in messages
        ]
        arrays = server.aggregate(plan, replies).arrays
        assert arrays is not None, f"{strategy}: round {server_round} was rejected"
        # what each client trained its buffers to, this round, weighted by its 8 and 10 examples
        expected = (8 * runtimes[1].model.norm.running_mean + 10 * runtimes[2].model.norm.running_mean) / 18
        np.testing.assert_allclose(arrays["norm.running_mean"].numpy(), expected.numpy(), rtol=1e-5, atol=1e-7)
        assert np.abs(arrays["norm.running_mean"].numpy()).max() > 0  # they moved from their zero start
    assert set(arrays.keys()) == set(runtimes[1].layout) | set(runtimes[1].buffer_layout)
    assert all(np.isfinite(arrays[name].numpy()).all() for name in arrays.keys())


@pytest.mark.parametrize("strategy", ["dsvgd", "fedlap-func"])
def test_dsvgd_and_fedlap_func_refuse_a_model_with_buffers_by_name(strategy):
    settings = run_settings({**DEFAULTS, **TINY, "strategy": strategy})
    model = BatchNormNet()
    with pytest.raises(ConfigError, match="the model has buffers .*norm.running_mean.*GroupNorm"):
        get_algorithm(strategy).build_server(settings, parameter_layout(model), buffer_layout(model))
