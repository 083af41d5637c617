"""FedAvg's and FedProx's client half: local epochs from the global model (FedProx: plus the proximal term)."""

from __future__ import annotations

from typing import cast

import torch

from fedbayes.bayes.params import get_parameters, set_parameters
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_layouts
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb


def local_update(local: LocalRound) -> LocalResult:
    """Load the global model, train locally (FedProx: with the proximal term), send the new weights back."""
    instruction = local.instruction
    set_parameters(local.runtime.model, local.tensors["weights"])
    train_loss, compute_seconds = train_locally(
        local.runtime, instruction.training, local.server_round, instruction.proximal_mu
    )
    return LocalResult(
        pb.FedAvgReply(),
        {"weights": get_parameters(local.runtime.model, local.runtime.layout)},
        train_loss,
        compute_seconds,
    )


client_update = ClientHalf(pb.FedAvgInstruction, local_update, model_layouts("weights"))


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
        seed=runtime.local_seed(training.seed, server_round),
        extra_loss=extra_loss,
    )
    model.cpu()
    return losses


def _proximal_term(mu: float, anchor: list[torch.Tensor]):
    def proximal(model: torch.nn.Module) -> torch.Tensor:
        squared = cast(torch.Tensor, sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor)))  # 0 + ...
        return 0.5 * mu * squared

    return proximal
