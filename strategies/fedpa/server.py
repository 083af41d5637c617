"""FedPA's server half: the server optimizer stepped with the averaged delta (Alg. 1)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from logging import INFO

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.common import log

from fedbayes.bayes.params import TensorLayout, flatten
from fedbayes.bayes.robust import RULES, robust_mean
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload
from fedbayes.strategies.base import (
    GlobalPosterior,
    RoundRejected,
    ServerState,
    ServerStrategy,
    TensorGroups,
    Update,
    local_training,
    steps_per_epoch,
)
from fedbayes.strategies.fedpa.math import weighted_mean_delta
from fedbayes.strategies.fedpa.settings import FedPASettings

OPTIMIZER_PREFIX = "optimizer/"  # the server optimizer's tensors in a checkpoint


class ServerOptimizer:
    """SERVEROPT of Alg. 1: a torch optimizer over the flat global model (float64), stepped with the
    averaged client delta as its gradient (SGD/momentum = FedAvgM, Adam with bias correction
    as the released code's Keras Adam, Adagrad with an initial accumulator)."""

    def __init__(self, settings: FedPASettings, size: int) -> None:
        self.theta = torch.nn.Parameter(torch.zeros(size, dtype=torch.float64))
        self.optimizer: torch.optim.Optimizer
        if settings.server_optimizer == "sgd":
            self.optimizer = torch.optim.SGD([self.theta], lr=settings.server_lr, momentum=settings.server_momentum)
        elif settings.server_optimizer == "adam":
            self.optimizer = torch.optim.Adam(
                [self.theta],
                lr=settings.server_lr,
                betas=(settings.server_beta1, settings.server_beta2),
                eps=settings.server_eps,
            )
        else:
            self.optimizer = torch.optim.Adagrad(
                [self.theta],
                lr=settings.server_lr,
                eps=settings.server_eps,
                initial_accumulator_value=settings.server_adagrad_init,
            )

    def step(self, theta: torch.Tensor, pseudo_gradient: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.theta.copy_(theta)
        self.theta.grad = pseudo_gradient.to(torch.float64).clone()
        self.optimizer.step()
        return self.theta.detach().clone()

    def state(self) -> dict[str, np.ndarray]:
        state = self.optimizer.state_dict()["state"].get(0, {})
        return {key: value.detach().numpy().copy() for key, value in state.items() if isinstance(value, torch.Tensor)}

    def load_state(self, tensors: dict[str, np.ndarray]) -> None:
        saved = self.optimizer.state_dict()
        saved["state"] = {0: {key: torch.from_numpy(value.copy()) for key, value in tensors.items()}} if tensors else {}
        self.optimizer.load_state_dict(saved)


class FedPA(ServerStrategy[ServerOptimizer]):
    """FedPA's server: generalized federated optimization (Alg. 1) with burn-in and sampling rounds. Its state is the
    server optimizer (momentum, Adam moments, Adagrad sums, step count), never reset when the clients switch phase."""

    reply_type = pb.FedPAReply
    robust_rules = RULES
    hyperparameters: FedPASettings
    theta: torch.Tensor  # the global model sent this round, flat float64

    def initial_state(self) -> ServerOptimizer:
        return ServerOptimizer(self.hyperparameters, sum(math.prod(shape) for shape in self.layout.values()))

    def is_sampling_round(self, server_round: int) -> bool:
        return server_round > self.hyperparameters.burn_in_rounds

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedPAInstruction, TensorGroups]:
        hp = self.hyperparameters
        weights = {name: arrays[name].numpy() for name in self.layout}
        self.theta = torch.from_numpy(flatten(weights, self.layout))
        sampling = self.is_sampling_round(server_round)
        instruction = pb.FedPAInstruction(
            training=local_training(
                self.settings.training,
                server_round,
                weight_decay=self.settings.weight_decay,
                epochs=hp.local_burnin_epochs + hp.samples if sampling else None,
            ),
            sampling=sampling,
            shrinkage=hp.shrinkage,
            local_burnin_epochs=hp.local_burnin_epochs,
            samples=hp.samples,
        )
        return instruction, {"weights": weights}

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        return {"delta": self.layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        return flatten(payload.tensors["delta"], self.layout)

    def state_norm(self) -> float:
        return self.theta.norm().item()

    def update_scale(self, payload: Payload) -> float:
        """The client's SGD steps an epoch: its delta is the change they make (or, after the burn-in rounds, that
        change shrunk by its samples' covariance)."""
        return steps_per_epoch(payload, self.settings.training)

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[ServerOptimizer]:
        examples = [float(p.reply.num_examples) for p in payloads]
        settings = self.settings
        if settings.robust_aggregation == "none":
            deltas = [torch.from_numpy(self.update_of(p)) for p in payloads]
            pseudo_gradient = weighted_mean_delta(deltas, examples)
        else:
            pseudo_gradient = torch.from_numpy(
                robust_mean(
                    [self.update_of(p) for p in payloads],
                    examples,
                    settings.robust_aggregation,
                    settings.clip_ratio,
                    settings.trim_fraction,
                )
            )
        if not torch.isfinite(pseudo_gradient).all():  # finite deltas can still overflow their sum
            raise RoundRejected("the averaged delta is not finite")
        server_optimizer = copy.deepcopy(self.state)  # stepped here, kept only if the round commits
        theta = server_optimizer.step(self.theta, pseudo_gradient)
        if not torch.isfinite(theta).all():
            raise RoundRejected("the global model would be non-finite; lower server-lr")
        metrics = {
            "delta-norm": pseudo_gradient.norm().item(),
            "samples": float(np.mean([p.message.samples for p in payloads])),
            "correction-norm": float(np.mean([p.message.correction_norm for p in payloads])),
        }
        log(
            INFO,
            "round %d (%s): |Δ| %.4g, mean samples %.1f, mean |Δ - (x0 - x̄)| %.4g",
            server_round,
            "sampling" if self.is_sampling_round(server_round) else "burn-in",
            metrics["delta-norm"],
            metrics["samples"],
            metrics["correction-norm"],
        )
        return Update(theta.numpy(), server_optimizer, metrics)

    def save_state(self, state: ServerOptimizer) -> ServerState:
        return ServerState({f"{OPTIMIZER_PREFIX}{key}": value for key, value in state.state().items()})

    def load_state(self, saved: ServerState) -> ServerOptimizer:
        optimizer = self.initial_state()
        optimizer.load_state(
            {
                name.removeprefix(OPTIMIZER_PREFIX): value
                for name, value in saved.tensors.items()
                if name.startswith(OPTIMIZER_PREFIX)
            }
        )
        return optimizer

    def global_posterior(self) -> GlobalPosterior:
        return GlobalPosterior(
            "a point estimate θ: FedPA's server holds no posterior estimate beyond it (each "
            "client's shrinkage covariance Σ̂ stays on the client, which sends only "
            "Δ = Σ̂⁻¹(θ − x̄))"
        )
