"""The device path of local training: the whole partition, the model and the optimizer state on the training device,
and nothing read back to the host inside the loop. The CUDA checks need a GPU and skip without one."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from fedbayes.bayes.ivon import IVONWithPrior
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.tasks.compute import resolve_device
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.models import build_model
from tests.support import NO_GPU


def tiny_images(size: int = 40) -> Dataset:
    generator = torch.Generator().manual_seed(0)
    return Dataset(
        "cifar10",
        torch.rand(size, 3, 16, 16, generator=generator),
        torch.randint(0, 10, (size,), generator=generator),
        10,
        pixel_scale=1.0,
    )


def optimizers(model: torch.nn.Module, first: str = "adam"):
    yield make_optimizer(model, pb.LocalTraining(epochs=1, batch_size=8, learning_rate=1e-3, optimizer=first))
    ivon = IVONWithPrior(model.parameters(), lr=1e-3, ess=1e5, hess_init=1.0)
    yield ivon, (lambda: ivon.sampled_params(train=True))


def count_item_calls(monkeypatch) -> list[int]:
    calls = [0]
    original = torch.Tensor.item

    def counted(tensor):
        calls[0] += 1
        return original(tensor)

    monkeypatch.setattr(torch.Tensor, "item", counted)
    return calls


@pytest.mark.parametrize("optimizer_kind", ["sgd", "ivon"])
def test_training_reads_one_number_back_per_call_not_per_step(monkeypatch, optimizer_kind):
    """2 epochs x 5 minibatches read the loss back once (a GPU would otherwise wait for every step). SGD and IVON
    read nothing back themselves; torch's Adam reads its step counter, a CPU tensor, which costs a GPU no sync."""
    torch.manual_seed(0)
    model = build_model("cnn-acar", (3, 16, 16), 10)
    sgd, (ivon, sampled) = optimizers(model, first="sgd")
    calls = count_item_calls(monkeypatch)
    if optimizer_kind == "sgd":
        loss, _ = train_epochs(model, tiny_images(), sgd, 2, 8, torch.device("cpu"), seed=0)
    else:
        loss, _ = train_epochs(model, tiny_images(), ivon, 2, 8, torch.device("cpu"), seed=0, sampled_weights=sampled)
    assert calls[0] == 1
    assert math.isfinite(loss) and loss > 0.0


def test_asking_for_cuda_without_a_gpu_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("optimizer_kind", ["adam", "ivon"])
def test_cuda_training_keeps_everything_on_the_gpu_without_per_step_syncs(optimizer_kind):
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = build_model("cnn-zenke", (3, 16, 16), 10).to(device)
    adam, (ivon, sampled) = optimizers(model)
    seen = set()
    model.register_forward_hook(lambda module, args, out: seen.add((args[0].device.type, out.device.type)))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if optimizer_kind == "adam":
                train_epochs(model, tiny_images(), adam, 2, 8, device, seed=0)
                state = [t for s in adam.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            else:
                train_epochs(model, tiny_images(), ivon, 2, 8, device, seed=0, sampled_weights=sampled)
                state = [ivon.param_groups[0]["hess"], ivon.param_groups[0]["momentum"]]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert seen == {("cuda", "cuda")}
    assert all(t.device.type == "cuda" for t in state if t.numel() > 1)
    assert len(syncs) < 10, [str(w.message) for w in syncs]  # 10 optimizer steps: fewer syncs than steps
