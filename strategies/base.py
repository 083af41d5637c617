"""What every fedbayes server strategy shares: decoding replies through the wire schema,
rejecting bad ones without stopping the round, and knowing which stable client sent what."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import TypeVar

from flwr.app import Message
from flwr.common import log
from google.protobuf.message import Message as ProtoMessage

from protos.codec import Payload, PayloadError, TensorLayout, claimed_client_id, decode

M = TypeVar("M", bound=ProtoMessage)


@dataclass
class RoundReport:
    """Who took part in the last round: accepted client ids, and why others were left out."""

    sent: int = 0
    accepted: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # "client-3 (node 42)" -> reason


class WireStrategyMixin:
    """Mixed into a Flower Strategy; keeps the node -> client id map and the round report."""

    round_report: RoundReport
    client_of_node: dict[int, str]

    def _init_wire(self) -> None:
        self.round_report = RoundReport()
        self.client_of_node = {}

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
    ) -> list[Payload[M]]:
        """Valid payloads of this round; errors and bad payloads are logged and left out."""
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
                payload = decode(reply.content, message_type, layouts, sender=label)
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
        return accepted

    def _reject(self, label: str, reason: str) -> None:
        self.round_report.rejected[label] = reason
        log(WARNING, "%s: %s", label, reason)
