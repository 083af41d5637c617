"""FedAvg's and FedProx's server half: the example-weighted mean of the clients' models (in float64); with run config
`robust-aggregation`, w = w_g + R(w_k - w_g) for R = clip, median or trimmed-mean (bayes/robust.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord

from fedbayes.bayes.params import TensorLayout, flatten, weighted_mean
from fedbayes.bayes.robust import RULES, robust_mean
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload
from fedbayes.strategies.base import (
    ServerState,
    ServerStrategy,
    TensorGroups,
    Update,
    local_training,
    steps_per_epoch,
)


class FedAvg(ServerStrategy[np.ndarray | None]):
    """FedAvg: the clients train from the global model; the server averages their models. Its state is w_g as sent,
    flat float64 (float32 values, as the wire carries them; None until round 1's instruction sets it from the
    initial model): what the replies' updates are measured from, and a committed round's new weights, which the next
    round sends; a checkpoint holds it, so a resumed server measures from the same w_g."""

    reply_type = pb.FedAvgReply
    robust_rules = RULES

    def initial_state(self) -> np.ndarray | None:
        """The state before round 1: no w_g yet.

        Returns:
            None; round 1's instruction sets w_g from the initial model.
        """
        return None

    @property
    def global_weights(self) -> np.ndarray:
        """w_g as sent this round, flat float64."""
        assert self.state is not None, "w_g is set in round 1's instruction"
        return self.state

    @property
    def proximal_mu(self) -> float:
        """μ of the clients' proximal term: 0 is FedAvg."""
        return 0.0

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedAvgInstruction, TensorGroups]:
        """This round's instruction: train locally from the global model (FedProx: with the proximal term). Round 1's
        also sets w_g, the state, from `arrays`.

        Args:
            server_round: the round, >= 1; it sets the learning rate.
            arrays: the global arrays the core holds (parameters and buffers); the parameters of `layout` are sent.
            nodes: the nodes the round is sent to; every one gets the same instruction.

        Returns:
            The instruction (local training and proximal μ, 0 for FedAvg) and its tensor group "weights": the global
            model's parameters as float32 arrays.
        """
        training = local_training(self.settings.training, server_round, weight_decay=self.settings.weight_decay)
        weights = {name: arrays[name].numpy() for name in self.layout}
        if self.state is None:
            self.state = flatten(weights, self.layout)
        return pb.FedAvgInstruction(training=training, proximal_mu=self.proximal_mu), {"weights": weights}

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layout of a reply's tensors.

        Returns:
            {"weights": layout}: the client's trained parameters.
        """
        return {"weights": self.layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        """The reply's update, what the screen measures.

        Args:
            payload: an accepted reply.

        Returns:
            w_k − w_g, flat float64 in layout order.
        """
        return flatten(payload.tensors["weights"], self.layout) - self.global_weights

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`.

        Returns:
            ‖w_g‖, the Euclidean norm of the global weights as sent.
        """
        return float(np.linalg.norm(self.global_weights))

    def update_scale(self, payload: Payload) -> float:
        """The client's SGD steps an epoch: its weights' change is their sum.

        Args:
            payload: an accepted reply; its num_examples sets the steps.

        Returns:
            ⌈num_examples / batch-size⌉, > 0.
        """
        return steps_per_epoch(payload, self.settings.training)

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[np.ndarray | None]:
        """The new global model from the round's accepted replies, without changing the strategy.

        Args:
            payloads: the accepted replies, in client-id order, at least one.
            server_round: the round; the mean does not depend on it.

        Returns:
            The example-weighted mean of the clients' weights (float64 arithmetic), or, with robust-aggregation,
            w_g + R(w_k − w_g) for the rule R (bayes/robust.py), rounded to float32; as the new weights and, in float64,
            as the state.
        """
        examples = [p.reply.num_examples for p in payloads]
        settings = self.settings
        if settings.robust_aggregation == "none":
            average = weighted_mean([flatten(p.tensors["weights"], self.layout) for p in payloads], examples)
        else:
            average = self.global_weights + robust_mean(
                [self.update_of(p) for p in payloads],
                examples,
                settings.robust_aggregation,
                settings.clip_ratio,
                settings.trim_fraction,
            )
        weights = average.astype(np.float32)
        return Update(weights, weights.astype(np.float64))

    def save_state(self, state: np.ndarray | None) -> ServerState:
        """w_g in float32, exactly as it was sent (nothing before round 1).

        Args:
            state: w_g, flat float64, or None before round 1.

        Returns:
            The checkpoint's part: tensor "global", or nothing for None.
        """
        return ServerState() if state is None else ServerState({"global": state.astype(np.float32)})

    def load_state(self, saved: ServerState) -> np.ndarray | None:
        """The state `save_state` saved.

        Args:
            saved: a checkpoint's strategy state.

        Returns:
            w_g as float64, or None for a checkpoint saved before round 1.
        """
        return saved.tensors["global"].astype(np.float64) if "global" in saved.tensors else None


class FedProx(FedAvg):
    """FedProx: FedAvg whose clients add μ/2·‖w − w_global‖² to their loss (squared norm, as in the paper; Flower's
    docstring example uses the unsquared norm)."""

    @property
    def proximal_mu(self) -> float:
        return self.hyperparameters.proximal_mu
