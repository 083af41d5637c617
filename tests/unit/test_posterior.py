"""fedbayes.posterior: the uncertainty decomposition against closed forms, and a Posterior read from a hand-made file
(inputs scaled as the run's data, weight samples drawn as the server draws them, particles all used)."""

import math

import numpy as np
import pytest
import torch

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.bayes.params import unflatten
from fedbayes.posterior import load
from fedbayes.posterior.file import Header, ModelSpec, write_posterior_file
from fedbayes.posterior.uncertainty import predictive
from fedbayes.tasks.config import round_seed

LAYOUT = {"1.weight": (2, 3), "1.bias": (2,)}  # logreg on (1, 1, 3) inputs, 2 classes


def test_identical_members_have_no_mutual_information():
    member = torch.tensor([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]])
    prediction = predictive(member.expand(5, 2, 3))
    expected = -(member * member.log()).sum(1).double()
    torch.testing.assert_close(prediction.entropy, expected)
    torch.testing.assert_close(prediction.expected_entropy, expected)
    torch.testing.assert_close(prediction.mutual_information, torch.zeros(2, dtype=torch.float64), atol=1e-7, rtol=0)
    assert prediction.members == 5


def test_two_confident_members_that_disagree_have_log_2_of_mutual_information():
    prediction = predictive(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]]))
    assert prediction.probs.tolist() == [[0.5, 0.5]]
    assert prediction.entropy.item() == pytest.approx(math.log(2))
    assert prediction.expected_entropy.item() == 0.0  # 0 log 0 = 0
    assert prediction.mutual_information.item() == pytest.approx(math.log(2))


def test_uncertainty_of_a_mixed_ensemble_by_hand():
    members = torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]], dtype=torch.float64)
    prediction = predictive(members)

    def h(p):
        return -sum(q * math.log(q) for q in p)

    total, aleatoric = h([0.7, 0.3]), (h([0.9, 0.1]) + h([0.5, 0.5])) / 2
    assert prediction.entropy.item() == pytest.approx(total)
    assert prediction.expected_entropy.item() == pytest.approx(aleatoric)
    assert prediction.mutual_information.item() == pytest.approx(total - aleatoric)
    assert prediction.predicted.tolist() == [0]


def test_member_probabilities_must_be_three_dimensional():
    with pytest.raises(ValueError, match=r"\(S, N, C\)"):
        predictive(torch.rand(4, 3))


def write_file(
    path, kind="gaussian-diagonal", precision=4.0, input_scale=1.0, pixel_scale=1.0, particles=0, extra=None
):
    rng = np.random.default_rng(0)
    mean = {name: rng.normal(size=shape).astype(np.float32) for name, shape in LAYOUT.items()}
    tensors = {f"mean/{name}": value for name, value in mean.items()}
    if kind == "gaussian-diagonal":
        tensors |= {f"precision/{name}": np.full(shape, precision) for name, shape in LAYOUT.items()}
    tensors |= extra or {}
    header = Header(
        strategy="bayesadmm",
        kind=kind,
        note="a test posterior",
        model=ModelSpec("logreg", (), "sigmoid", 1),
        input_shape=(1, 1, 3),
        num_classes=2,
        input_scale=input_scale,
        pixel_scale=pixel_scale,
        dataset="npz:/data",
        round=7,
        federation="fed",
        seed=3,
        ensemble_samples=4,
        eval_batch_size=100,
        parameters=LAYOUT,
        buffers={},
        particles=particles,
        fedbayes_version="test",
    )
    write_posterior_file(path, header, tensors)
    return mean


def test_samples_are_drawn_as_the_server_draws_them(tmp_path):
    """Default seed = the server's round seed: the draws are Gaussian.sample's with it, split like BayesADMM's."""
    mean = write_file(tmp_path / "q.safetensors", precision=4.0)
    posterior = load(tmp_path / "q.safetensors")
    flat_mean = torch.cat([torch.from_numpy(mean[name]).double().ravel() for name in LAYOUT])
    expected = Gaussian(flat_mean, torch.full_like(flat_mean, 4.0)).sample(
        4, torch.Generator().manual_seed(round_seed(3, 7))
    )
    drawn = posterior.members(4)
    assert len(drawn) == 4
    for draw, sample in zip(drawn, expected):
        for name, value in unflatten(sample.numpy(), LAYOUT).items():
            assert np.array_equal(draw[name], value)
    other = posterior.members(4, seed=11)
    assert not np.array_equal(other[0]["1.bias"], drawn[0]["1.bias"])
    assert np.array_equal(posterior.members(4, seed=11)[0]["1.bias"], other[0]["1.bias"])
    assert posterior.members(0) == [posterior.mean]


def test_samples_have_the_posterior_variance(tmp_path):
    write_file(tmp_path / "q.safetensors", precision=4.0)
    draws = load(tmp_path / "q.safetensors").members(4000, seed=0)
    bias = np.stack([draw["1.bias"] for draw in draws])
    assert bias.var(axis=0) == pytest.approx([0.25, 0.25], rel=0.1)  # 1 / precision


def test_a_tight_posterior_is_certain_of_its_model_and_a_wide_one_is_not(tmp_path):
    x = np.random.default_rng(1).normal(size=(50, 1, 1, 3)).astype(np.float32)
    write_file(tmp_path / "tight.safetensors", precision=1e12)
    write_file(tmp_path / "wide.safetensors", precision=0.01)
    tight = load(tmp_path / "tight.safetensors").predict(x, samples=8)
    wide = load(tmp_path / "wide.safetensors").predict(x, samples=8)
    at_mean = load(tmp_path / "tight.safetensors").predict(x, samples=0)
    assert at_mean.members == 1 and torch.all(at_mean.mutual_information == 0)
    torch.testing.assert_close(tight.probs, at_mean.probs, atol=1e-4, rtol=0)
    assert tight.mutual_information.max() < 1e-6 < wide.mutual_information.min()


def test_particles_are_all_used_whatever_the_samples(tmp_path):
    """Three particles that move the mean's class-0 logit by 0, +2 and -2 (class 1's the other way): the prediction
    averages exactly those three models, which disagree."""
    mean = write_file(tmp_path / "unused.safetensors")
    shift = {"1.weight": np.array([[1.0], [-1.0]]), "1.bias": np.array([1.0, -1.0])}
    offsets = (0.0, 1.0, -1.0)
    moved = [
        {name: (value + offset * shift[name]).astype(np.float32) for name, value in mean.items()} for offset in offsets
    ]
    particles = {f"particles/{name}": np.stack([particle[name] for particle in moved]) for name in LAYOUT}
    write_file(tmp_path / "p.safetensors", kind="particles", particles=3, extra=particles)
    posterior = load(tmp_path / "p.safetensors")
    x = np.random.default_rng(2).normal(size=(20, 1, 1, 3)).astype(np.float32)
    prediction = posterior.predict(x, samples=1)
    assert prediction.members == 3
    images = posterior.inputs(x)
    expected = predictive(posterior.member_probs(moved, images, 100, torch.device("cpu")))
    torch.testing.assert_close(prediction.probs, expected.probs, rtol=0, atol=0)
    assert (prediction.mutual_information > 0).all()


def test_point_estimates_predict_with_their_one_model(tmp_path):
    write_file(tmp_path / "w.safetensors", kind="point")
    prediction = load(tmp_path / "w.safetensors").predict(np.zeros((3, 1, 1, 3), np.float32), samples=32)
    assert prediction.members == 1 and torch.all(prediction.mutual_information == 0)


def test_inputs_are_scaled_as_the_runs_data(tmp_path):
    write_file(tmp_path / "q.safetensors", input_scale=255.0, pixel_scale=1 / 255)
    posterior = load(tmp_path / "q.safetensors")
    pixels = np.array([[[0, 128, 255]]], dtype=np.uint8)  # (N, H, W): one channel
    assert posterior.inputs(pixels).tolist() == [[[[0.0, 128.0, 255.0]]]]  # x / 255 * input-scale 255
    assert posterior.inputs(np.full((1, 1, 1, 3), 0.5, np.float32)).tolist() == [[[[127.5, 127.5, 127.5]]]]
    with pytest.raises(ValueError, match=r"shape \(1, 4\); the model of .* takes \(1, 1, 3\)"):
        posterior.inputs(np.zeros((2, 1, 4), np.float32))
    with pytest.raises(ValueError, match="NaN or Inf"):
        posterior.inputs(np.full((1, 1, 1, 3), np.nan, np.float32))
    with pytest.raises(ValueError, match="dtype int64"):
        posterior.inputs(np.zeros((1, 1, 1, 3), np.int64))
