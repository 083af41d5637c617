"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) over the fedbayes wire schema.

Server half: a seeded `fraction-train` of the nodes, and the example-weighted average
w = sum_k N_k w_k / sum_k N_k (in float64) of the replies that pass the checks. Client half: E local epochs of
Adam/SGD on the mean minibatch loss, plus FedProx's proximal term mu/2 * ||w - w_global||^2 (squared norm, as
in the paper; Flower's docstring example uses the unsquared norm).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedbayes.bayes.params import flatten, get_parameters, set_parameters, unflatten, weighted_mean
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import TensorLayout, decode, encode, new_header
from fedbayes.strategies.base import WireStrategy, local_training, round_metrics
from fedbayes.tasks.config import RunSettings


class FedAvg(WireStrategy):
    """FedAvg; FedProx when `proximal_mu` > 0 (its clients add mu/2 * ||w - w_global||^2)."""

    def __init__(self, settings: RunSettings, layout: TensorLayout, proximal_mu: float = 0.0) -> None:
        super().__init__(settings)
        self.layout = layout
        self.proximal_mu = proximal_mu

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        settings = self.settings
        instruction = pb.FedAvgInstruction(
            header=new_header(settings.federation, server_round),
            training=local_training(settings, server_round, weight_decay=settings.weight_decay),
            proximal_mu=self.proximal_mu,
        )
        weights = {name: arrays[name].numpy() for name in self.layout}
        return self.instructions(instruction, {"weights": weights}, self.sample(grid, server_round))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        payloads = self.decode_replies(replies, pb.FedAvgReply, {"weights": self.layout}, server_round)
        if not payloads:
            return None, None
        average = weighted_mean([flatten(p.tensors["weights"], self.layout) for p in payloads],
                                [p.message.num_examples for p in payloads])
        self.commit(payloads, server_round)
        weights = unflatten(average.astype(np.float32), self.layout)
        return ArrayRecord({name: Array(value) for name, value in weights.items()}), round_metrics(payloads)


def fedprox(settings: RunSettings, layout: TensorLayout) -> FedAvg:
    return FedAvg(settings, layout, proximal_mu=settings.proximal_mu)


def client_update(content: RecordDict, runtime: ClientRuntime) -> RecordDict:
    """Client half: load the global model, train locally, send the new weights back."""
    payload = decode(content, pb.FedAvgInstruction, {"weights": runtime.layout}, sender="server")
    instruction = payload.message
    set_parameters(runtime.model, payload.tensors["weights"])
    train_loss, compute_seconds = train_locally(
        runtime, instruction.training, instruction.header.server_round, instruction.proximal_mu
    )
    reply = pb.FedAvgReply(
        header=new_header(
            instruction.header.federation, instruction.header.server_round, runtime.node.client_id
        ),
        num_examples=len(runtime.data.labels),
        train_loss=train_loss,
        compute_seconds=compute_seconds,
    )
    return encode(reply, {"weights": get_parameters(runtime.model)})


def train_locally(
    runtime: ClientRuntime, training: pb.LocalTraining, server_round: int, proximal_mu: float = 0.0
) -> tuple[float, float]:
    """FedAvg's local training of `runtime.model` from its current weights (FedPA's burn-in rounds
    run exactly this); returns the last epoch's loss and the compute seconds."""
    extra_loss = None
    if proximal_mu > 0.0:
        anchor = [p.detach().clone().to(runtime.device) for p in runtime.model.parameters()]
        extra_loss = _proximal_term(proximal_mu, anchor)
    model = runtime.model.to(runtime.device)
    losses = train_epochs(
        model,
        runtime.data,
        make_optimizer(model, training),
        training.epochs,
        training.batch_size,
        runtime.device,
        seed=runtime.local_seed(server_round),
        extra_loss=extra_loss,
    )
    model.cpu()
    return losses


def _proximal_term(mu: float, anchor: list[torch.Tensor]):
    def proximal(model: torch.nn.Module) -> torch.Tensor:
        squared = sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))
        return 0.5 * mu * squared

    return proximal
