"""FedPA's server half: the server optimizer stepped with the averaged delta (Alg. 1)."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
THETA_KEY = "theta"  # θ as sent, in a checkpoint


class ServerOptimizer:
    """SERVEROPT of Alg. 1: a torch optimizer over the flat global model (float64), stepped with the
    averaged client delta as its gradient (SGD/momentum = FedAvgM, Adam with bias correction
    as the released code's Keras Adam, Adagrad with an initial accumulator). Its parameter is a work buffer that
    each step overwrites with the θ it steps from; what persists is the optimizer's own state (`state`)."""

    def __init__(self, settings: FedPASettings, size: int) -> None:
        """An optimizer with no steps taken.

        Args:
            settings: FedPA's hyperparameters (server-optimizer, server-lr and the chosen optimizer's own).
            size: the number of the model's parameters.
        """
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
        """One step of the optimizer from `theta`, with `pseudo_gradient` as its gradient (its state advances).

        Args:
            theta: the flat global model to step from.
            pseudo_gradient: the averaged client delta, flat.

        Returns:
            The stepped model, flat float64 (a copy of the optimizer's parameter).
        """
        with torch.no_grad():
            self.theta.copy_(theta)
        self.theta.grad = pseudo_gradient.to(torch.float64).clone()
        self.optimizer.step()
        return self.theta.detach().clone()

    def state(self) -> dict[str, np.ndarray]:
        """The optimizer's state tensors (momentum, moments, sums, step count), by name; none before its first step.

        Returns:
            Copies of the tensors of the optimizer's state, by name.
        """
        state = self.optimizer.state_dict()["state"].get(0, {})
        return {key: value.detach().numpy().copy() for key, value in state.items() if isinstance(value, torch.Tensor)}

    def load_state(self, tensors: dict[str, np.ndarray]) -> None:
        """Continue from the state `state()` returned.

        Args:
            tensors: the tensors `state()` returned (none: no step taken yet).
        """
        saved = self.optimizer.state_dict()
        saved["state"] = {0: {key: torch.from_numpy(value.copy()) for key, value in tensors.items()}} if tensors else {}
        self.optimizer.load_state_dict(saved)


@dataclass
class FedPAState:
    """FedPA's server state: θ as sent (flat float64 of the float32 values the wire carries; None until round 1's
    instruction sets it from the initial model), what the replies' deltas are measured from and the server optimizer
    steps from, and the server optimizer, never reset when the clients switch phase."""

    theta: np.ndarray | None
    optimizer: ServerOptimizer


class FedPA(ServerStrategy[FedPAState]):
    """FedPA's server: generalized federated optimization (Alg. 1) with burn-in and sampling rounds. Its state
    (FedPAState) is θ as sent and the server optimizer (momentum, Adam moments, Adagrad sums, step count); a
    checkpoint holds both, so a resumed server steps from the same θ with the same optimizer."""

    reply_type = pb.FedPAReply
    robust_rules = RULES
    hyperparameters: FedPASettings

    def initial_state(self) -> FedPAState:
        """No θ yet (round 1's instruction sets it) and an optimizer with no steps taken.

        Returns:
            The state before round 1.
        """
        size = sum(math.prod(shape) for shape in self.layout.values())
        return FedPAState(None, ServerOptimizer(self.hyperparameters, size))

    @property
    def theta(self) -> np.ndarray:
        """θ as sent this round, flat float64."""
        assert self.state.theta is not None, "θ is set in round 1's instruction"
        return self.state.theta

    def is_sampling_round(self, server_round: int) -> bool:
        """Whether the clients sample in `server_round` (after the burn-in rounds) rather than train as FedAvg.

        Args:
            server_round: the round.

        Returns:
            True in a sampling round.
        """
        return server_round > self.hyperparameters.burn_in_rounds

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedPAInstruction, TensorGroups]:
        """The round's training (epochs: burn-in plus samples in a sampling round) and the global model.

        Args:
            server_round: the round.
            arrays: the global arrays; θ is set from them in round 1.
            nodes: the nodes the round is sent to.

        Returns:
            The FedPA instruction and its tensor groups (the global weights).
        """
        hp = self.hyperparameters
        weights = {name: arrays[name].numpy() for name in self.layout}
        if self.state.theta is None:
            self.state.theta = flatten(weights, self.layout)
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
        """A reply's one tensor group: the client's delta, laid out as the model.

        Returns:
            The layout of the reply's "delta" group.
        """
        return {"delta": self.layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        """The client's delta, flat (what the screen measures).

        Args:
            payload: an accepted reply.

        Returns:
            Its delta, flat float64.
        """
        return flatten(payload.tensors["delta"], self.layout)

    def state_norm(self) -> float:
        """The norm of θ as sent (the screen's scale for the updates).

        Returns:
            ‖θ‖.
        """
        return torch.from_numpy(self.theta).norm().item()

    def update_scale(self, payload: Payload) -> float:
        """The client's SGD steps an epoch: its delta is the change they make (or, after the burn-in rounds, that
        change shrunk by its samples' covariance).

        Args:
            payload: an accepted reply.

        Returns:
            Its SGD steps an epoch.
        """
        return steps_per_epoch(payload, self.settings.training)

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[FedPAState]:
        """The server optimizer, stepped from θ with the example-weighted (or robust) mean delta; nothing changed.

        Args:
            payloads: the round's accepted replies, in client-id order.
            server_round: the round.

        Returns:
            The new θ (flat float64), the state once the round is committed (that θ as the wire carries it, and the
            stepped optimizer), and the round's metrics (delta-norm, samples, correction-norm).

        Raises:
            RoundRejected: the mean delta or the new θ is not finite.
        """
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
        server_optimizer = copy.deepcopy(self.state.optimizer)  # stepped here, kept only if the round commits
        theta = server_optimizer.step(torch.from_numpy(self.theta), pseudo_gradient)
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
        weights = theta.numpy()
        # the next round sends θ as float32, the wire's precision: its deltas are measured from that; one that
        # overflows float32 is the core's to refuse (the global model would not be finite)
        with np.errstate(over="ignore"):
            sent = weights.astype(np.float32).astype(np.float64)
        return Update(weights, FedPAState(sent, server_optimizer), metrics)

    def save_state(self, state: FedPAState) -> ServerState:
        """θ in float32, exactly as it was sent (nothing before round 1), and the optimizer's state tensors.

        Args:
            state: the state to save.

        Returns:
            Its tensors for the checkpoint.
        """
        tensors = {f"{OPTIMIZER_PREFIX}{key}": value for key, value in state.optimizer.state().items()}
        if state.theta is not None:
            tensors[THETA_KEY] = state.theta.astype(np.float32)
        return ServerState(tensors)

    def load_state(self, saved: ServerState) -> FedPAState:
        """The state `save_state` saved.

        Args:
            saved: the checkpoint's strategy state.

        Returns:
            θ (None where the checkpoint holds none) and the optimizer, continued from their saved tensors.
        """
        state = self.initial_state()
        state.optimizer.load_state(
            {
                name.removeprefix(OPTIMIZER_PREFIX): value
                for name, value in saved.tensors.items()
                if name.startswith(OPTIMIZER_PREFIX)
            }
        )
        if THETA_KEY in saved.tensors:
            state.theta = saved.tensors[THETA_KEY].astype(np.float64)
        return state

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the posterior: θ alone.

        Returns:
            Its description: a point estimate.
        """
        return GlobalPosterior(
            "a point estimate θ: FedPA's server holds no posterior estimate beyond it (each "
            "client's shrinkage covariance Σ̂ stays on the client, which sends only "
            "Δ = Σ̂⁻¹(θ − x̄))"
        )
