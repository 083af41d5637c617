"""An out-of-tree strategy with messages of its own, written as a user would write one (README "Write your own
strategy"): FedAvgM, FedAvg with server momentum (Hsu et al. 2019, "Measuring the effects of non-identical data
distribution for federated visual classification"). Its clients send their change to the global model, w_k − w_g;
the server keeps the momentum m ← β·m + Σ_k n_k/n·(w_k − w_g) and moves the model by w_g + η·m.

Not part of fedbayes, and fedbayes is not edited for it: its messages are in fedavgm.proto (which imports fedbayes'
common.proto) and the generated fedavgm_pb2.py; its halves register them with fedbayes' codec when they are defined.
The tests put tests/plugins on PYTHONPATH and run it as `strategy = "fedavgm_plugin:FEDAVGM"`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord

from fedavgm_plugin import fedavgm_pb2
from fedbayes.bayes.params import TensorLayout, flatten, get_parameters, set_parameters, weighted_mean
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_layouts
from fedbayes.protos.codec import Payload
from fedbayes.strategies import Algorithm
from fedbayes.strategies.base import ServerState, ServerStrategy, TensorGroups, Update, local_training
from fedbayes.strategies.fedavg.client import train_locally
from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, key


@dataclass(frozen=True)
class FedAvgMSettings:
    """FedAvgM's run-config keys, named after it: a key another strategy declares too must mean the same there
    (same default and type; FedPA has a `server-momentum` of its own)."""

    fedavgm_momentum: float = key(0.9, "β of the server's momentum (0: FedAvg)", NON_NEGATIVE)
    fedavgm_lr: float = key(1.0, "η, the server's step along its momentum", POSITIVE)


class FedAvgM(ServerStrategy[np.ndarray]):
    """The server's state is its momentum m (flat float64, in layout order)."""

    reply_type = fedavgm_pb2.FedAvgMReply
    global_weights: np.ndarray  # w_g as sent this round: the clients' deltas are from it

    def initial_state(self) -> np.ndarray:
        return np.zeros(sum(int(np.prod(shape)) for shape in self.layout.values()))

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[fedavgm_pb2.FedAvgMInstruction, TensorGroups]:
        weights = {name: arrays[name].numpy() for name in self.layout}
        self.global_weights = flatten(weights, self.layout)
        training = local_training(self.settings.training, server_round)
        return fedavgm_pb2.FedAvgMInstruction(training=training), {"weights": weights}

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        return {"delta": self.layout}

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[np.ndarray]:
        mean_delta = weighted_mean(
            [flatten(p.tensors["delta"], self.layout) for p in payloads], [p.reply.num_examples for p in payloads]
        )
        momentum = self.hyperparameters.fedavgm_momentum * self.state + mean_delta
        weights = self.global_weights + self.hyperparameters.fedavgm_lr * momentum
        return Update(weights.astype(np.float32), momentum, {"momentum_norm": float(np.linalg.norm(momentum))})

    def save_state(self, state: np.ndarray) -> ServerState:
        return ServerState(tensors={"momentum": state})

    def load_state(self, saved: ServerState) -> np.ndarray:
        return saved.tensors["momentum"].astype(np.float64)


def local_update(local: LocalRound) -> LocalResult:
    """FedAvg's local epochs from the global model; the reply is the change they made."""
    model, layout = local.runtime.model, local.runtime.layout
    set_parameters(model, local.tensors["weights"])
    train_loss, compute_seconds = train_locally(local.runtime, local.instruction.training, local.server_round)
    trained = get_parameters(model, layout)
    delta = {name: trained[name] - local.tensors["weights"][name] for name in layout}
    return LocalResult(fedavgm_pb2.FedAvgMReply(), {"delta": delta}, train_loss, compute_seconds)


FEDAVGM = Algorithm(
    FedAvgM, ClientHalf(fedavgm_pb2.FedAvgMInstruction, local_update, model_layouts("weights")), FedAvgMSettings
)
