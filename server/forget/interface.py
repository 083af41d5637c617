"""What forgetting asks of the round core (server/round_core.py RoundCore offers it): the settings and strategy it
runs, what it knows of the clients as values, one message to a node between rounds and the check of its answer, and
the commit of a Change. Forgetting reaches no further into the core."""

from __future__ import annotations

from typing import Any, Protocol

from flwr.app import Message
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.params import TensorLayout
from fedbayes.protos.codec import Layouts, Payload
from fedbayes.server.round_core import Change
from fedbayes.strategies.base import ServerState, ServerStrategy, TensorGroups
from fedbayes.tasks.config import RunSettings


class BetweenRounds(Protocol):
    """The round core as forgetting sees it (module docstring)."""

    settings: RunSettings
    strategy: ServerStrategy[Any]

    @property
    def buffer_layout(self) -> TensorLayout:
        """The layout of the model's buffers (BatchNorm statistics; empty for a model without)."""
        ...

    def client_of(self, node: int) -> str | None:
        """The client id bound to `node`.

        Args:
            node: a node id.

        Returns:
            Its client id, or None where none is bound to it.
        """
        ...

    def bound_node(self, client: str) -> int | None:
        """The node `client` is bound to.

        Args:
            client: a client id.

        Returns:
            Its node, or None where it is bound to none.
        """
        ...

    def last_accepted(self) -> dict[str, int]:
        """The last accepted round of every client.

        Returns:
            Client id -> the last round whose reply of it was accepted (a copy).
        """
        ...

    def ledger_records(self) -> tuple[dict[str, Any], ...]:
        """Every forget and readmission applied (server/identity.py ForgetLedger).

        Returns:
            Their records, oldest first.
        """
        ...

    def forget_of(self, client: str) -> dict[str, Any] | None:
        """The record of the last forget of `client`.

        Args:
            client: a client id.

        Returns:
            The record, if its id is revoked; None otherwise.
        """
        ...

    def contributed_rounds(self, client: str) -> list[list[int]]:
        """The rounds whose reply of `client` was accepted.

        Args:
            client: a client id.

        Returns:
            Those rounds as [first, last] ranges, oldest first (none: no reply of it was accepted).
        """
        ...

    def message_between_rounds(
        self, server_round: int, node: int, body: ProtoMessage | None = None, tensors: TensorGroups | None = None
    ) -> Message:
        """A message to `node` between rounds, outside any round's bookkeeping: the part of a forget only the node's
        client can compute, or, with no body, the confirmation that its client is forgotten.

        Args:
            server_round: the round the message follows.
            node: the node to send it to.
            body: the strategy's message (None: the confirmation that the node's client is forgotten).
            tensors: the message's tensor groups.

        Returns:
            The TRAIN message, with a new nonce; from here on only its answer is taken from `node`.
        """
        ...

    def reply_label(self, reply: Message) -> str:
        """How logs name the sender of `reply`.

        Args:
            reply: a reply as received.

        Returns:
            Its node with its bound client, or the client it claims to be (both where they differ).
        """
        ...

    def checked_lone_reply(
        self, reply: Message, client: str, reply_type: Any, layouts: Layouts, server_round: int
    ) -> Payload[Any]:
        """`client`'s answer to `message_between_rounds`, checked as a round's reply is.

        Args:
            reply: the node's answer.
            client: the client id it must be of.
            reply_type: the reply's body type (the wire schema).
            layouts: the layouts of the reply's tensor groups.
            server_round: the round the message followed.

        Returns:
            The decoded reply, every check passed.

        Raises:
            PayloadError: naming what is wrong; whatever the strategy's check raises, as it raises it.
        """
        ...

    def state_dict(self, change: Change | None = None) -> ServerState:
        """The server's state besides the global arrays, as it is or as `change` would make it (nothing is changed).

        Args:
            change: a change to save the state as it would make it (None: the state as it is).

        Returns:
            The strategy's `save_state`, with the core's part in its metadata.
        """
        ...

    def adopt(self, change: Change) -> None:
        """Take a committed change (a forget's or a readmission's) as the federation's state.

        Args:
            change: the change, committed (its checkpoint is on disk).
        """
        ...

    def checkpoint_written(self, state: ServerState) -> None:
        """A checkpoint holding `state` (from `state_dict()`) is on disk: later instructions ask the clients to keep
        the states of its accepted rounds.

        Args:
            state: the checkpoint's strategy state, as `state_dict()` made it.
        """
        ...
