"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) over the fedbayes wire schema.

Server half: Flower's own FedAvg/FedProx do node sampling and the example-weighted average
w = sum_k N_k w_k / sum_k N_k; we only put their messages through protos/ (FedAvgInstruction /
FedAvgReply) and reject bad replies. Client half: E local epochs of Adam/SGD on the mean minibatch
loss, plus FedProx's proximal term mu/2 * ||w - w_global||^2 (squared norm, as in the paper; Flower's
docstring example uses the unsquared norm).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import FedProx as FlowerFedProx
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

from bayes.params import get_parameters, set_parameters
from client.runtime import ClientRuntime
from client.training import make_optimizer, train_epochs
from protos import payloads_pb2 as pb
from protos.codec import TensorLayout, decode, encode, new_header
from strategies.base import RoundReport, WireStrategyMixin, local_training
from tasks.config import RunSettings


class _FedAvgWire(WireStrategyMixin):
    """Puts the Flower strategy's train messages and replies through the wire schema."""

    def __init__(self, settings: RunSettings, layout: TensorLayout, **flower_options) -> None:
        super().__init__(
            fraction_train=settings.fraction_train,
            fraction_evaluate=0.0,  # the server evaluates the global model centrally
            min_train_nodes=settings.min_clients,
            min_available_nodes=settings.min_clients,
            **flower_options,
        )
        self.settings = settings
        self.layout = layout
        self._init_wire()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        sampled = list(super().configure_train(server_round, arrays, config, grid))  # Flower samples nodes
        settings = self.settings
        instruction = pb.FedAvgInstruction(
            header=new_header(settings.federation, server_round),
            training=local_training(settings, server_round, weight_decay=settings.weight_decay),
            proximal_mu=float(config.get("proximal-mu", 0.0)),  # set by Flower's FedProx
        )
        content = encode(instruction, {"weights": {name: arrays[name].numpy() for name in self.layout}})
        self.round_report = RoundReport(sent=len(sampled))
        return [
            Message(content, dst_node_id=message.metadata.dst_node_id, message_type=MessageType.TRAIN)
            for message in sampled
        ]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        payloads = self.decode_replies(replies, pb.FedAvgReply, {"weights": self.layout}, server_round)
        if not payloads:
            return None, None
        # Re-shaped into the records Flower's aggregation helpers expect.
        records = [
            RecordDict(
                {
                    "arrays": ArrayRecord({name: Array(value) for name, value in payload.tensors["weights"].items()}),
                    "metrics": MetricRecord(
                        {
                            self.weighted_by_key: payload.message.num_examples,
                            "train-loss": payload.message.train_loss,
                            "compute-seconds": payload.message.compute_seconds,
                        }
                    ),
                }
            )
            for payload in payloads
        ]
        return aggregate_arrayrecords(records, self.weighted_by_key), self.train_metrics_aggr_fn(
            records, self.weighted_by_key
        )


class FedAvg(_FedAvgWire, FlowerFedAvg):
    """FedAvg: Flower's sampling and weighted averaging, fedbayes payloads."""


class FedProx(_FedAvgWire, FlowerFedProx):
    """FedProx: FedAvg whose clients add mu/2 * ||w - w_global||^2 to their loss."""

    def __init__(self, settings: RunSettings, layout: TensorLayout) -> None:
        super().__init__(settings, layout, proximal_mu=settings.proximal_mu)


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
