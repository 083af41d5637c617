"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) over the fedbayes wire schema.

Server half: a seeded `fraction-train` of the nodes, and the example-weighted average
w = sum_k N_k w_k / sum_k N_k (in float64) of the replies that pass the checks; with run config
`robust-aggregation`, w = w_g + R(w_k - w_g) for R = clip, median or trimmed-mean (bayes/robust.py). Client half: E local epochs of
Adam/SGD on the mean minibatch loss, plus FedProx's proximal term mu/2 * ||w - w_global||^2 (squared norm, as
in the paper; Flower's docstring example uses the unsquared norm).
"""

from __future__ import annotations

import numpy as np
import torch

from fedbayes.bayes.params import flatten, get_parameters, set_parameters, weighted_mean
from fedbayes.bayes.robust import RULES, robust_mean
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_layouts
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, TensorLayout
from fedbayes.strategies.base import Update, WireStrategy, local_training
from fedbayes.tasks.config import NON_NEGATIVE, Key, RunSettings

FEDPROX_HYPERPARAMETERS = (
    Key("proximal-mu", 0.01, "FedProx: μ of the clients' proximal term μ/2·‖w − w_g‖²", NON_NEGATIVE),
)


class FedAvg(WireStrategy):
    """FedAvg; FedProx when `proximal_mu` > 0 (its clients add mu/2 * ||w - w_global||^2)."""

    reply_type = pb.FedAvgReply
    robust_rules = RULES

    def __init__(self, settings: RunSettings, layout: TensorLayout, proximal_mu: float = 0.0) -> None:
        super().__init__(settings, layout)
        self.proximal_mu = proximal_mu
        self.global_weights: np.ndarray | None = None  # w_g as sent this round, flat float64

    def instruction(self, server_round, arrays, nodes):
        training = local_training(self.settings, server_round, weight_decay=self.settings.weight_decay)
        weights = {name: arrays[name].numpy() for name in self.layout}
        self.global_weights = flatten(weights, self.layout)
        return pb.FedAvgInstruction(training=training, proximal_mu=self.proximal_mu), {"weights": weights}

    def reply_layouts(self):
        return {"weights": self.layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        return flatten(payload.tensors["weights"], self.layout) - self.global_weights

    def state_norm(self) -> float:
        return float(np.linalg.norm(self.global_weights))

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        examples = [p.message.num_examples for p in payloads]
        settings = self.settings
        if settings.robust_aggregation == "none":
            average = weighted_mean([flatten(p.tensors["weights"], self.layout) for p in payloads], examples)
        else:
            average = self.global_weights + robust_mean([self.update_of(p) for p in payloads], examples,
                                                        settings.robust_aggregation, settings.clip_ratio,
                                                        settings.trim_fraction)
        return Update(average.astype(np.float32))


def fedprox(settings: RunSettings, layout: TensorLayout) -> FedAvg:
    return FedAvg(settings, layout, proximal_mu=settings.proximal_mu)


# ---- client half ----------------------------------------------------------------------------------
def local_update(local: LocalRound) -> LocalResult:
    """Load the global model, train locally (FedProx: with the proximal term), send the new weights back."""
    instruction = local.instruction
    set_parameters(local.runtime.model, local.tensors["weights"])
    train_loss, compute_seconds = train_locally(local.runtime, instruction.training, local.server_round,
                                                instruction.proximal_mu)
    return LocalResult(pb.FedAvgReply(train_loss=train_loss, compute_seconds=compute_seconds),
                       {"weights": get_parameters(local.runtime.model, local.runtime.layout)})


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
        squared = sum((p - a).pow(2).sum() for p, a in zip(model.parameters(), anchor))
        return 0.5 * mu * squared

    return proximal
