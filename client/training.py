"""The local training loop shared by every strategy whose client runs plain SGD/Adam epochs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from protos import payloads_pb2 as pb
from tasks.datasets import Dataset

ExtraLoss = Callable[[torch.nn.Module], torch.Tensor]


def make_optimizer(model: torch.nn.Module, training: pb.LocalTraining) -> torch.optim.Optimizer:
    if training.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    if training.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    raise ValueError(f"training.optimizer must be 'adam' or 'sgd', got {training.optimizer!r}")


def train_epochs(
    model: torch.nn.Module,
    data: Dataset,
    training: pb.LocalTraining,
    device: torch.device,
    seed: int,
    extra_loss: ExtraLoss | None = None,
) -> float:
    """Run `training.epochs` epochs of minibatch training; return the last epoch's mean loss.

    The loss is the mean minibatch cross-entropy plus `extra_loss(model)` (e.g. FedProx's
    proximal term), matching the per-example scaling the strategies' specs assume.
    """
    if training.epochs < 1 or training.batch_size < 1:
        raise ValueError(f"training needs epochs >= 1 and batch_size >= 1, got {training.epochs}, {training.batch_size}")
    if len(data.labels) == 0:
        raise ValueError("this client has no training examples")
    model.to(device).train()
    optimizer = make_optimizer(model, training)
    images, labels = data.images.to(device), data.labels.to(device)
    generator = torch.Generator().manual_seed(seed)
    epoch_loss = 0.0
    for _ in range(training.epochs):
        order = torch.randperm(len(labels), generator=generator).to(device)
        loss_sum, batches = 0.0, 0
        for start in range(0, len(labels), training.batch_size):
            batch = order[start : start + training.batch_size]
            loss = F.cross_entropy(model(images[batch]), labels[batch])
            if extra_loss is not None:
                loss = loss + extra_loss(model)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum, batches = loss_sum + loss.item(), batches + 1
        epoch_loss = loss_sum / batches
    model.cpu()
    return epoch_loss
