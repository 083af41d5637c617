"""What every fedbayes server strategy shares: decoding replies through the wire schema,
rejecting bad ones without stopping the round, and knowing which stable client sent what."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import TypeVar

import numpy as np
from flwr.app import Message
from flwr.common import log
from google.protobuf.message import Message as ProtoMessage

from protos import payloads_pb2 as pb
from protos.codec import Payload, PayloadError, TensorLayout, check_payload_size, claimed_client_id, decode
from tasks.config import RunSettings

M = TypeVar("M", bound=ProtoMessage)


@dataclass
class ServerState:
    """What a strategy's server half must carry across a server restart, besides the global arrays the
    round loop checkpoints itself: tensors (float32/float64 numpy) and string metadata (e.g. JSON).
    Keys are the strategy's own. Randomness is derived from (seed, round), so no RNG state is needed."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class RoundReport:
    """Who took part in the last round: accepted client ids, and why others were left out."""

    sent: int = 0
    accepted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "client-3 (node 42)" -> reason


def sample_nodes(nodes: Iterable[int], fraction: float, minimum: int, seed: int, server_round: int) -> list[int]:
    """The nodes to train this round: a `fraction` of the connected ones (at least `minimum`), drawn with a
    per-round seed so that a server resumed from its checkpoint draws as an uninterrupted one would."""
    nodes = sorted(nodes)
    count = min(len(nodes), max(minimum, round(fraction * len(nodes))))
    return sorted(random.Random(seed * 1_000_003 + server_round).sample(nodes, count))


def local_training(
    settings: RunSettings, server_round: int, weight_decay: float = 0.0, epochs: int | None = None
) -> pb.LocalTraining:
    """The local-training part of every strategy's instruction: the run's epochs (unless the strategy
    asks for others), batch size, optimizer and seed, and this round's learning rate (constant or cosine).
    Weight decay only where the strategy's objective has it; Bayesian ones regularise with their prior."""
    return pb.LocalTraining(
        epochs=settings.local_epochs if epochs is None else epochs, batch_size=settings.batch_size,
        learning_rate=settings.round_lr(server_round), optimizer=settings.optimizer, weight_decay=weight_decay,
        seed=settings.seed,
    )


class WireStrategyMixin:
    """Mixed into a Flower Strategy; keeps the node -> client id map and the round report."""

    settings: RunSettings
    round_report: RoundReport
    client_of_node: dict[int, str]

    def _init_wire(self) -> None:
        self.round_report = RoundReport()
        self.client_of_node = {}

    def server_state(self) -> ServerState:
        """Checkpointed after every round (server/checkpoint.py); stateless strategies keep nothing."""
        return ServerState()

    def restore_server_state(self, state: ServerState) -> None:
        """Continue from `server_state()` as saved by an earlier server process."""
        if state.tensors or state.metadata:
            raise ValueError(f"{type(self).__name__} keeps no server state, but the checkpoint has some")

    def posterior_samples(self, count: int, generator) -> list[dict]:
        """Weight samples of the global posterior for a predictive ensemble; none for point estimates."""
        return []

    def node_label(self, node_id: int) -> str:
        client = self.client_of_node.get(node_id)
        return f"client {client!r} (node {node_id})" if client else f"node {node_id}"

    def decode_replies(
        self,
        replies: Iterable[Message],
        message_type: type[M],
        layouts: Mapping[str, TensorLayout],
        server_round: int,
        check: Callable[[Payload[M]], None] | None = None,
    ) -> list[Payload[M]]:
        """Valid payloads of this round, by client id; errors and bad payloads are logged and left out. `check` adds
        the strategy's own semantic checks (e.g. positive precisions): a PayloadError it raises rejects
        that reply only."""
        accepted: list[Payload[M]] = []
        for reply in replies:
            node_id = reply.metadata.src_node_id
            label = self.node_label(node_id)
            if reply.has_error():
                self._reject(label, f"client error: {reply.error.reason}")
                continue
            claimed = claimed_client_id(reply.content, message_type)
            if claimed and node_id not in self.client_of_node:
                label = f"client {claimed!r} (node {node_id})"
            try:
                check_payload_size(reply.content, self.settings.max_payload_mb, sender=label)
                payload = decode(reply.content, message_type, layouts, sender=label)
                if check is not None:
                    check(payload)
            except PayloadError as error:
                self._reject(label, f"rejected payload: {error}")
                continue
            header = payload.message.header
            if header.server_round != server_round:
                self._reject(label, f"reply is for round {header.server_round}, not {server_round}")
                continue
            self.client_of_node[node_id] = header.client_id
            self.round_report.accepted.append(header.client_id)
            accepted.append(payload)
        log(INFO, "round %d: %d accepted, %d left out", server_round, len(accepted), len(self.round_report.rejected))
        # In client-id order, so aggregates do not depend on the order replies happened to arrive in.
        return sorted(accepted, key=lambda payload: payload.message.header.client_id)

    def _reject(self, label: str, reason: str) -> None:
        self.round_report.rejected[label] = reason
        log(WARNING, "%s: %s", label, reason)


@dataclass
class Membership:
    """The clients a server has accepted a reply from: each one's N_k and the last round it replied in.
    FedDyn and FedLap take K and N from here (../shared/specs/feddyn-fedlap-splits.md §9 P14: "the server
    learns N_k from num_examples"), so K grows when a client joins and never shrinks when one vanishes."""

    examples: dict[str, int] = field(default_factory=dict)
    last_round: dict[str, int] = field(default_factory=dict)

    def record(self, client: str, num_examples: int, server_round: int) -> None:
        self.examples[client] = num_examples
        self.last_round[client] = server_round

    @property
    def clients(self) -> int:
        return len(self.examples)

    @property
    def total_examples(self) -> int:
        return sum(self.examples.values())

    def to_metadata(self) -> dict[str, str]:
        return {"examples": json.dumps(self.examples), "last_round": json.dumps(self.last_round)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> Membership:
        return cls(json.loads(metadata["examples"]), json.loads(metadata["last_round"]))


def client_population(known_clients: int, known_examples: int, num_examples: int, fresh: bool) -> tuple[int, int]:
    """(K, N) as a client sees them: the server's counts, plus this client itself when it has no state yet
    after round 1 (the server has not heard of it). N = 0 means the server knows no sizes yet (round 1)."""
    if fresh and known_examples > 0:
        return known_clients + 1, known_examples + num_examples
    return max(known_clients, 1), known_examples
