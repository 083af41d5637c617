"""The local training loop every client half shares: minibatch epochs with any torch optimizer,
including IVON (whose gradients are taken at sampled weights), and the extra terms of a local objective whose
gradients are known in closed form (FedDyn's, FedLap's; FedProx's and federated ADMM's in their client halves)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fedbayes.bayes.params import TensorList, parameter_views
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.tasks.datasets import Dataset

if TYPE_CHECKING:
    from fedbayes.client.runtime import ClientRuntime

# An extra term of the local objective: called at the parameters after the loss's backward pass, it adds its gradient
# to theirs and returns its value (0-dim, on their device), which the reported loss includes.
GradientTerm = Callable[[TensorList], torch.Tensor]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, targets) -> mean loss


def make_optimizer(model: torch.nn.Module, training: pb.LocalTraining) -> torch.optim.Optimizer:
    """The optimizer the instruction's local training names, over all of `model`'s parameters.

    Args:
        model: the model to train; on the device it trains on, so the optimizer's state is made there.
        training: the instruction's local training: its `optimizer` ("adam" or "sgd"), `learning_rate` and
            `weight_decay` (L2, added by the optimizer).

    Returns:
        A fresh torch Adam or SGD (no momentum).

    Raises:
        ValueError: `training.optimizer` is neither "adam" nor "sgd".
    """
    if training.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    if training.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    raise ValueError(f"training.optimizer must be 'adam' or 'sgd', got {training.optimizer!r}")


def train_epochs(
    model: torch.nn.Module,
    data: Dataset,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    batch_size: int,
    device: torch.device,
    seed: int,
    extra_term: GradientTerm | None = None,
    sampled_weights: Callable[[], AbstractContextManager] = nullcontext,
    mc_samples: int = 1,
    max_grad_norm: float = 0.0,
    loss_fn: Loss = F.cross_entropy,
    after_step: Callable[[], None] | None = None,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """Minibatch training on `loss_fn` (mean cross-entropy by default) + `extra_term`; returns the last
    epoch's mean loss and the seconds spent training. `model` must already be on `device` (the
    optimizer holds its parameters); build the optimizer before calling, so its one-off cost (the
    first torch optimizer in a process imports torch._dynamo, 1.5-3 s) is not counted as training.
    The client's whole partition is moved to `device` once, and the loop reads nothing back to the host
    until the end (one `.item()` per call), so a GPU runs the epochs without waiting on the CPU.

    For IVON, `sampled_weights` is `lambda: optimizer.sampled_params(train=True)`: each of the
    `mc_samples` gradients is taken at a fresh weight sample, and one step uses their average.
    `max_grad_norm` > 0 clips each step's gradient to that global norm (the official FedDyn code uses 10).
    `after_step()` runs after every optimizer step (FedPA averages the iterates into samples).
    `generator` draws each epoch's minibatch permutation; by default a generator seeded with `seed`.

    Args:
        model: the model to train, on `device`; trained in place and left in train mode.
        data: the client's examples.
        optimizer: the optimizer over `model`'s parameters (make_optimizer, or IVON).
        epochs: passes over `data`, at least 1.
        batch_size: examples per minibatch, at least 1; the last minibatch of an epoch may be smaller.
        device: where the model is and the data is moved to.
        seed: seeds the minibatch permutations when `generator` is None.
        extra_term: a term added to the loss, its gradient added after the loss's backward pass; None for none.
        sampled_weights: a context manager factory entered around each gradient (IVON's weight sampling).
        mc_samples: gradients per step, at least 1, each at a fresh `sampled_weights()`.
        max_grad_norm: clips each step's gradient to this global L2 norm when > 0; 0 does not clip.
        loss_fn: (model output, targets) -> mean loss.
        after_step: called after every optimizer step; None for nothing.
        generator: draws the permutations; None for one seeded with `seed`.

    Returns:
        (the last epoch's mean minibatch loss, including `extra_term`; the wall-clock seconds of the call).

    Raises:
        ValueError: `epochs` or `batch_size` is below 1, or `data` has no examples.
    """
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"training needs epochs >= 1 and batch_size >= 1, got {epochs}, {batch_size}")
    if len(data.labels) == 0:
        raise ValueError("this client has no training examples")
    started = time.perf_counter()
    model.train()
    images, labels = data.images.to(device), data.labels.to(device)
    parameters: list[torch.Tensor] = list(model.parameters())
    generator = torch.Generator().manual_seed(seed) if generator is None else generator
    epoch_loss = torch.zeros((), dtype=torch.float64, device=device)
    for _ in range(epochs):
        order = torch.randperm(len(labels), generator=generator).to(device)
        loss_sum, batches = torch.zeros((), dtype=torch.float64, device=device), 0
        for start in range(0, len(labels), batch_size):
            batch = order[start : start + batch_size]
            for _ in range(mc_samples):
                with sampled_weights():
                    optimizer.zero_grad(set_to_none=True)
                    loss = loss_fn(model(images[batch]), labels[batch])
                    loss.backward()
                    if extra_term is not None:  # at the same (sampled) weights
                        loss = loss.detach() + extra_term(parameters)
            if max_grad_norm > 0.0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            if after_step is not None:
                after_step()
            loss_sum, batches = loss_sum + loss.detach(), batches + 1  # on the device: no host sync per step
        epoch_loss = loss_sum / batches
    mean_loss = epoch_loss.item()  # the one host sync: it waits for the device, so the time below is complete
    return mean_loss, time.perf_counter() - started


def gradients(parameters: TensorList) -> list[torch.Tensor]:
    """Each parameter's .grad, a zero one made where it has none (a parameter the loss does not reach).

    Args:
        parameters: the model's parameters; a missing .grad is set to zeros on each.

    Returns:
        The .grad tensors, in `parameters`' order; adding to them changes the gradients.
    """
    grads = []
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    return grads


def add_flat_gradient(parameters: TensorList, gradient: torch.Tensor) -> None:
    """Add `gradient` (one flat vector in parameter order) to the gradients of the parameters that require one (as
    autograd would: a frozen parameter gets none), as one multi-tensor add (`torch._foreach_add_`): one kernel on a
    GPU, and on the CPU the same numbers as an add per tensor.

    Args:
        parameters: the model's parameters, in `model.parameters()` order.
        gradient: 1-D, as many elements as `parameters` together, on their device and of their dtype.
    """
    pairs = [(p, piece) for p, piece in zip(parameters, parameter_views(gradient, parameters)) if p.requires_grad]
    if pairs:
        torch._foreach_add_(gradients([p for p, _ in pairs]), [piece for _, piece in pairs])


def anchored_penalty(anchor: torch.Tensor, weight: torch.Tensor | float) -> GradientTerm:
    """½ Σ_j weight_j (θ_j − anchor_j)² over the flattened parameters θ (in `model.parameters()` order), gradient
    weight·(θ − anchor): the cavity/proximal term FedDyn, FedLap and FedLap-Cov add to the mean minibatch loss
    (docs/algorithms/fedlap.md). `weight` is a scalar or one value per parameter, already in mean-loss units; both
    tensors must be on the model's device.

    Args:
        anchor: the flat anchor, as many elements as the parameters.
        weight: a scalar, or a flat tensor of one weight per parameter element.

    Returns:
        The term: it adds weight·(θ − anchor) to the parameters' gradients and returns the penalty (0-dim).
    """

    def penalty(parameters: TensorList) -> torch.Tensor:
        diff = torch.cat([p.detach().reshape(-1) for p in parameters]) - anchor
        add_flat_gradient(parameters, weight * diff)
        return 0.5 * (weight * diff.square()).sum()

    return penalty


def added(first: GradientTerm, second: GradientTerm) -> GradientTerm:
    """The term first + second: each adds its gradient, the value is their sum.

    Args:
        first: a term, called first.
        second: a term, called second.

    Returns:
        The combined term.
    """
    return lambda parameters: first(parameters) + second(parameters)


def train_anchored(
    runtime: ClientRuntime,
    training: pb.LocalTraining,
    start: torch.Tensor,
    anchor: torch.Tensor,
    weight: torch.Tensor | float,
    server_round: int,
    max_grad_norm: float = 0.0,
    extra_term: GradientTerm | None = None,
) -> tuple[torch.Tensor, float, float]:
    """The local solve FedDyn, FedLap, FedLap-Cov and FedLap-Func share: from the flat weights `start`,
    `training.epochs` of a fresh optimizer on mean CE + ½ Σ weight·(θ − anchor)² (+ `extra_term`, in mean-loss units on
    the model's device: FedLap-Func's function-space terms) (+ the optimizer's weight decay). Returns the trained flat
    weights (float64, CPU), the last epoch's mean loss and the training seconds.

    Args:
        runtime: the client's runtime: its model (loaded with `start`, trained, then left on the CPU), data, device
            and the local seed.
        training: the instruction's local training (optimizer, learning rate, weight decay, epochs, batch size, seed).
        start: the flat weights to start from, as many elements as the model's parameters.
        anchor: the penalty's flat anchor, the same size.
        weight: the penalty's weight: a scalar or one per parameter element, in mean-loss units.
        server_round: the round; with `training.seed` it seeds the minibatch order (ClientRuntime.local_seed).
        max_grad_norm: clips each step's gradient to this global norm when > 0.
        extra_term: a further term of the objective; None for none.

    Returns:
        (trained flat weights, float64 on the CPU; the last epoch's mean loss; the training seconds).

    Raises:
        ValueError: an unknown optimizer, epochs or batch size below 1, or no training examples (train_epochs).
    """
    model = runtime.model
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(start.to(torch.float32), model.parameters())
    model.to(runtime.device)
    device_anchor = anchor.to(runtime.device, torch.float32)
    device_weight = weight.to(runtime.device, torch.float32) if isinstance(weight, torch.Tensor) else weight
    penalty = anchored_penalty(device_anchor, device_weight)
    if extra_term is not None:
        penalty = added(penalty, extra_term)
    train_loss, seconds = train_epochs(
        model,
        runtime.data,
        make_optimizer(model, training),
        training.epochs,
        training.batch_size,
        runtime.device,
        seed=runtime.local_seed(training.seed, server_round),
        extra_term=penalty,
        max_grad_norm=max_grad_norm,
    )
    local = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().double()
    model.cpu()
    return local, train_loss, seconds
