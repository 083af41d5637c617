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
from fedbayes.strategies.base import StatelessStrategy, TensorGroups, Update, local_training, steps_per_epoch


class FedAvg(StatelessStrategy):
    """FedAvg: the clients train from the global model; the server averages their models."""

    reply_type = pb.FedAvgReply
    robust_rules = RULES
    global_weights: np.ndarray  # w_g as sent this round, flat float64: what the replies' updates are measured from

    @property
    def proximal_mu(self) -> float:
        """μ of the clients' proximal term: 0 is FedAvg."""
        return 0.0

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedAvgInstruction, TensorGroups]:
        training = local_training(self.settings, server_round, weight_decay=self.settings.weight_decay)
        weights = {name: arrays[name].numpy() for name in self.layout}
        self.global_weights = flatten(weights, self.layout)
        return pb.FedAvgInstruction(training=training, proximal_mu=self.proximal_mu), {"weights": weights}

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        return {"weights": self.layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        return flatten(payload.tensors["weights"], self.layout) - self.global_weights

    def state_norm(self) -> float:
        return float(np.linalg.norm(self.global_weights))

    def update_scale(self, payload: Payload) -> float:
        """The client's SGD steps an epoch: its weights' change is their sum."""
        return steps_per_epoch(payload, self.settings)

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[None]:
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
        return Update(average.astype(np.float32))


class FedProx(FedAvg):
    """FedProx: FedAvg whose clients add μ/2·‖w − w_global‖² to their loss (squared norm, as in the paper; Flower's
    docstring example uses the unsquared norm)."""

    @property
    def proximal_mu(self) -> float:
        return self.hyperparameters.proximal_mu
