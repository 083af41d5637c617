"""Client identity on the server: which node may speak for which client id.

A reply's header names its client id, but the client chose that name. The server binds the id to the node
(Flower's node id; with node authentication, the node of one registered public key) and holds it to that:
  - `client-registry` names a JSON file {client-id: node-id} written by `fedbayes pki register --client-id`:
    then an id is accepted only from its registered node (re-read at the start of every round, so new
    registrations count).
  - otherwise an id is bound to the first node that presents it in an accepted reply, for the life of the
    federation (checkpointed). With `client-identity = "reconnect"` (insecure federations, where a restarted
    SuperNode gets a new node id) it may move to a new node once its old node has left the federation.
Either way a node cannot change its id, two nodes cannot share one, and at most `max-clients` ids are ever
counted (a node inventing a new id each round is refused once the bound is reached).

A forgotten client's id is revoked (server/forget/): every later reply claiming it is refused by name, from any
node, until the operator readmits it (`fedbayes forget RUN --readmit ID`), after which it is a new client. The
ledger of what forgetting needs (each client's accepted rounds, the revoked ids, the record of every forget) is
checkpointed with the bindings.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import ERROR
from pathlib import Path
from typing import Any

from flwr.common import log

from fedbayes.protos.codec import PayloadError
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.storage import MAX_CLIENT_ID_LENGTH, FileTooLarge, is_safe_name, read_bounded

# A registry entry's bytes beyond its client id: quotes, a colon, a node id (at most 20 digits), a comma, indentation.
REGISTRY_ENTRY_BYTES = MAX_CLIENT_ID_LENGTH + 64


def read_registry(path: str, max_clients: int) -> dict[str, int]:
    """{client id: node id} from the operator's registry file, which may take what `max_clients` entries take (checked
    before it is read).

    Args:
        path: the registry file (run config `client-registry`).
        max_clients: the run's `max-clients`; the file may be at most max_clients x REGISTRY_ENTRY_BYTES + 1 KiB.

    Returns:
        Client id -> node id.

    Raises:
        ConfigError: naming `client-registry`, when the file is too large, unreadable, not JSON, or not an object of
            safe client ids to integer node ids.
    """
    limit = max_clients * REGISTRY_ENTRY_BYTES + 1024
    try:
        entries = json.loads(read_bounded(Path(path), limit, f"a registry of max-clients={max_clients} ids"))
    except FileTooLarge as error:
        raise ConfigError(f"run config 'client-registry': {error}; raise max-clients for a larger one") from None
    except (OSError, ValueError, RecursionError) as error:
        raise ConfigError(f"run config 'client-registry': cannot read {path}: {error}") from None
    if not isinstance(entries, dict) or not all(
        isinstance(client, str) and is_safe_name(client) and isinstance(node, int) and not isinstance(node, bool)
        for client, node in entries.items()
    ):
        raise ConfigError(f"run config 'client-registry': {path} must be a JSON object of client id -> node id")
    return entries


@dataclass
class ForgetLedger:
    """What forgetting a client needs the server to remember (server/forget/): the rounds whose reply of each
    client was accepted, as [first, last] ranges; the revoked ids (forgotten and not readmitted); and the record of
    every forget and readmission applied, oldest first (their audit lines). A forget or readmission makes a new
    ledger rather than editing this one, so the state it was computed from stays as it was until the caller commits."""

    contributed: dict[str, list[list[int]]] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()
    records: tuple[dict[str, Any], ...] = ()

    def record_contribution(self, client: str, server_round: int) -> None:
        """The round's accepted reply of `client` (the one in-place change: rounds only grow between forgets).

        Args:
            client: the client id.
            server_round: the round of the accepted reply; a round at or before the client's last recorded one
                changes nothing.
        """
        ranges = self.contributed.setdefault(client, [])
        if ranges and ranges[-1][1] == server_round - 1:
            ranges[-1][1] = server_round
        elif not ranges or ranges[-1][1] < server_round:
            ranges.append([server_round, server_round])

    def forgetting(self, client: str, record: Mapping[str, Any]) -> ForgetLedger:
        """A new ledger with `client` forgotten: its contributions dropped, its id revoked, `record` appended.

        Args:
            client: the client id.
            record: the forget's audit record ("event": "forgotten", "client", "node", "round", "request", ...).

        Returns:
            The new ledger; this one is unchanged.
        """
        return ForgetLedger(self._contributions_without(client), self.revoked | {client}, (*self.records, dict(record)))

    def readmitting(self, client: str, record: Mapping[str, Any]) -> ForgetLedger:
        """A new ledger in which `client` is no longer revoked, its contributions dropped, `record` appended.

        Args:
            client: the client id.
            record: the readmission's audit record.

        Returns:
            The new ledger; this one is unchanged.
        """
        return ForgetLedger(self._contributions_without(client), self.revoked - {client}, (*self.records, dict(record)))

    def _contributions_without(self, client: str) -> dict[str, list[list[int]]]:
        """A copy of `contributed` (the ranges are edited in place as rounds go by) without `client`."""
        return {c: [list(span) for span in ranges] for c, ranges in self.contributed.items() if c != client}

    def forget_of(self, client: str) -> dict[str, Any] | None:
        """The record of the last forget of `client`, if it is revoked.

        Args:
            client: the client id.

        Returns:
            That forget's record (as `forgetting` kept it), or None when `client` is not revoked.
        """
        if client not in self.revoked:
            return None
        return next(
            record for record in reversed(self.records) if record["event"] == "forgotten" and record["client"] == client
        )

    def confirmation_for(self, node: int) -> str:
        """The revoked client id that `node` itself asked to forget (its instructions say so), or "".

        Args:
            node: a Flower node id.

        Returns:
            The first such id in sorted order, or "" when `node` asked for none.
        """
        return next(
            (client for client in sorted(self.revoked) if (self.forget_of(client) or {}).get("node") == node), ""
        )

    def to_metadata(self) -> str:
        """The ledger as a checkpoint's metadata string (from_metadata reads it back).

        Returns:
            JSON of its contributions, revoked ids (sorted) and records, keys sorted.
        """
        return json.dumps(
            {"contributed": self.contributed, "revoked": sorted(self.revoked), "records": list(self.records)},
            sort_keys=True,
        )

    @classmethod
    def from_metadata(cls, metadata: str) -> ForgetLedger:
        """The ledger `to_metadata` wrote.

        Args:
            metadata: its JSON.

        Returns:
            The ledger.

        Raises:
            json.JSONDecodeError: `metadata` is not JSON.
            KeyError: it lacks "contributed", "revoked" or "records".
        """
        ledger = json.loads(metadata)
        return cls(ledger["contributed"], frozenset(ledger["revoked"]), tuple(ledger["records"]))


@dataclass
class ClientIdentities:
    """Which node speaks for which client id, and the forget ledger; checkpointed with the server's state.

    mode           "bound" (an id stays with its first node) or "reconnect" (it may move once its node has left)
    max_clients    the most ids ever counted (run config `max-clients`)
    registry_path  the operator's {client id: node id} file (run config `client-registry`); "" for none
    """

    mode: str  # "bound" | "reconnect"
    max_clients: int
    registry_path: str = ""
    node_of_client: dict[str, int] = field(default_factory=dict)
    ledger: ForgetLedger = field(default_factory=ForgetLedger)
    _registry: dict[str, int] = field(default_factory=dict)
    _registry_mtime: float | None = None

    def __post_init__(self) -> None:
        if self.registry_path:
            self._registry = read_registry(self.registry_path, self.max_clients)  # unusable at start: refuse to start
            self._registry_mtime = os.stat(self.registry_path).st_mtime

    def refresh_registry(self) -> None:
        """Re-read the registry if the operator rewrote it (once a round); a broken rewrite keeps the last good one."""
        if not self.registry_path:
            return
        try:
            mtime = os.stat(self.registry_path).st_mtime
            if mtime != self._registry_mtime:
                self._registry, self._registry_mtime = read_registry(self.registry_path, self.max_clients), mtime
        except (OSError, ConfigError) as error:
            log(ERROR, "client registry %s: %s; keeping the registry read before", self.registry_path, error)

    def bound_node(self, client: str) -> int | None:
        """The node that speaks for `client`: the registry's, else the one it is bound to (None: neither).

        Args:
            client: the client id.

        Returns:
            The node id; with a registry, only the registry's; None when none is known.
        """
        if self.registry_path:
            return self._registry.get(client)
        return self.node_of_client.get(client)

    def client_of(self, node: int) -> str | None:
        """The client id `node` speaks for: the one bound to it, else the one the registry gives it.

        Args:
            node: a Flower node id.

        Returns:
            The id, or None when `node` has none.
        """
        bound = [client for client, bound_node in self.node_of_client.items() if bound_node == node]
        registered = [client for client, registered_node in self._registry.items() if registered_node == node]
        candidates = bound or registered
        return candidates[0] if candidates else None

    def check(self, node: int, client: str, connected: Iterable[int], claimed: Mapping[str, int]) -> None:
        """Refuse (PayloadError, naming ids and nodes) a reply from `node` claiming `client`. `claimed`: the
        ids already accepted this round, each with its node.

        Args:
            node: the replying node's Flower id.
            client: the client id its reply's header names.
            connected: the node ids now in the federation (under `reconnect` an id may move off a node that left).
            claimed: client id -> node, for the ids already accepted this round.

        Raises:
            PayloadError: `client` is not a safe id of at most MAX_CLIENT_ID_LENGTH characters, is revoked, is
                another node's (bound or registered), is not in the registry, is a new id past `max-clients`, or
                already replied this round.
        """
        if not (is_safe_name(client) and len(client) <= MAX_CLIENT_ID_LENGTH):
            raise PayloadError(
                f"field 'header.client_id': {client[:MAX_CLIENT_ID_LENGTH]!r} is not a client id "
                f"([A-Za-z0-9._-], at most {MAX_CLIENT_ID_LENGTH} characters)"
            )
        forget = self.ledger.forget_of(client)
        if forget is not None:
            raise PayloadError(
                f"field 'header.client_id': client id {client!r} was forgotten after round "
                f"{forget['round']} (request {forget['request']}); the operator must readmit it first "
                "(fedbayes forget --readmit)"
            )
        self._check_owner(node, client, connected)
        # Only after the ownership checks: a spoofer must be named as one whether its reply came before or after
        # the real client's; what is left here is a second reply from the client's own node.
        if client in claimed:
            raise PayloadError(
                f"field 'header.client_id': client id {client!r} already replied this round from node {claimed[client]}"
            )

    def _check_owner(self, node: int, client: str, connected: Iterable[int]) -> None:
        """Refuse `node` speaking as `client` when the id is another node's (bound, or in the registry)."""
        own = self.client_of(node)
        if own is not None and own != client:
            raise PayloadError(
                f"field 'header.client_id': node {node} is client {own!r}; it may not speak as {client!r}"
            )
        if self.registry_path:
            registered = self._registry.get(client)
            if registered is None:
                raise PayloadError(f"field 'header.client_id': client id {client!r} is not in the client registry")
            if registered != node:
                raise PayloadError(
                    f"field 'header.client_id': client id {client!r} is registered to node "
                    f"{registered}, not node {node}"
                )
            return
        bound = self.node_of_client.get(client)
        if bound is None:
            if len(self.node_of_client) >= self.max_clients:
                raise PayloadError(
                    f"field 'header.client_id': new client id {client!r} refused: the federation "
                    f"already counts max-clients={self.max_clients} clients"
                )
        elif bound != node and not (self.mode == "reconnect" and bound not in set(connected)):
            raise PayloadError(
                f"field 'header.client_id': client id {client!r} is bound to node {bound}; node {node} may not use it"
            )

    def bind(self, node: int, client: str) -> None:
        """After an accepted reply: `client` is `node`'s (a reconnecting client moves to its new node).

        Args:
            node: the node whose reply was accepted.
            client: the client id it named.
        """
        self.node_of_client[client] = node

    def forgetting(self, client: str, record: Mapping[str, Any]) -> ClientIdentities:
        """A copy with `client` forgotten: unbound, its contributions dropped, its id revoked, `record` kept.

        Args:
            client: the client id.
            record: the forget's audit record (ForgetLedger.forgetting).

        Returns:
            The copy; this one is unchanged (it shares the registry read).
        """
        forgotten = copy.copy(self)  # not dataclasses.replace: that would read the registry file again
        forgotten.node_of_client = {c: node for c, node in self.node_of_client.items() if c != client}
        forgotten.ledger = self.ledger.forgetting(client, record)
        return forgotten

    def readmitting(self, client: str, record: Mapping[str, Any]) -> ClientIdentities:
        """A copy in which the revoked `client` may reply again (as a new client), `record` kept.

        Args:
            client: the revoked client id.
            record: the readmission's audit record.

        Returns:
            The copy; this one is unchanged (it shares the registry read).
        """
        readmitted = copy.copy(self)
        readmitted.node_of_client = dict(self.node_of_client)
        readmitted.ledger = self.ledger.readmitting(client, record)
        return readmitted

    def accepted_view(self, node: int, accepted_rounds: Mapping[str, int], connected: Iterable[int]) -> dict[str, int]:
        """The accepted rounds `node` is told: its own client's; for a node not yet known under
        `reconnect`, those of clients whose node has left (it may be one of them, restarted).

        Args:
            node: the node the instruction goes to.
            accepted_rounds: client id -> the last round whose reply the server accepted from it.
            connected: the node ids now in the federation.

        Returns:
            Client id -> accepted round, as above; empty for an unknown node outside `reconnect`.
        """
        own = self.client_of(node)
        if own is not None:
            return {own: accepted_rounds[own]} if own in accepted_rounds else {}
        if self.mode != "reconnect":
            return {}
        connected = set(connected)
        return {
            client: accepted_round
            for client, accepted_round in accepted_rounds.items()
            if self.node_of_client.get(client) not in connected
        }

    def to_metadata(self) -> str:
        """The bindings as a checkpoint's metadata string (restore reads it back); the ledger is saved apart.

        Returns:
            JSON of client id -> node id, keys sorted.
        """
        return json.dumps(self.node_of_client, sort_keys=True)

    def restore(self, metadata: str) -> None:
        """Replace the bindings with those `to_metadata` wrote.

        Args:
            metadata: its JSON.

        Raises:
            json.JSONDecodeError: `metadata` is not JSON.
            ValueError: a node id is not an integer.
        """
        self.node_of_client = {client: int(node) for client, node in json.loads(metadata).items()}
