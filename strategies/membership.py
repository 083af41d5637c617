"""Who a federation's clients are, as the server counts them and as a client sees itself in those counts: K (the
clients the server has accepted a reply from) and N (their examples). FedDyn's α_k and FedLap's ρ_k depend on them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Membership:
    """The clients a server has accepted a reply from: each one's N_k and the last round it replied in.
    FedDyn and FedLap take K and N from here (the server learns N_k from each reply's num_examples), so K grows
    when a client joins and never shrinks when one vanishes."""

    examples: dict[str, int] = field(default_factory=dict)
    last_round: dict[str, int] = field(default_factory=dict)

    def copy(self) -> Membership:
        """A copy that records independently of this one.

        Returns:
            The same counts, in new dicts.
        """
        return Membership(dict(self.examples), dict(self.last_round))

    def without(self, client: str) -> Membership:
        """A copy without `client` (forgotten): K and N no longer count it.

        Args:
            client: the client's id; one not recorded leaves the copy equal to this.

        Returns:
            The copy; this one is unchanged.
        """
        return Membership(
            {c: n for c, n in self.examples.items() if c != client},
            {c: r for c, r in self.last_round.items() if c != client},
        )

    def record(self, client: str, num_examples: int, server_round: int) -> None:
        """Count a reply the server accepted, replacing what the client reported before.

        Args:
            client: the client's id.
            num_examples: its N_k, the reply's num_examples.
            server_round: the round the reply answers.
        """
        self.examples[client] = num_examples
        self.last_round[client] = server_round

    @property
    def clients(self) -> int:
        """K: the clients recorded."""
        return len(self.examples)

    @property
    def total_examples(self) -> int:
        """N: the sum of their N_k."""
        return sum(self.examples.values())

    def to_metadata(self) -> dict[str, str]:
        """The membership as string metadata, for a checkpoint (from_metadata reads it back).

        Returns:
            {"examples": JSON of client -> N_k, "last_round": JSON of client -> round}.
        """
        return {"examples": json.dumps(self.examples), "last_round": json.dumps(self.last_round)}

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str]) -> Membership:
        """The membership `to_metadata` wrote.

        Args:
            metadata: string metadata holding its "examples" and "last_round" (other keys are ignored).

        Returns:
            The membership.

        Raises:
            KeyError: a key is missing.
            json.JSONDecodeError: a value is not JSON.
        """
        return cls(json.loads(metadata["examples"]), json.loads(metadata["last_round"]))


def client_population(known_clients: int, known_examples: int, num_examples: int, fresh: bool) -> tuple[int, int]:
    """(K, N) as a client sees them: the server's counts, plus this client itself when it has no state yet
    after round 1 (the server has not heard of it). N = 0 means the server knows no sizes yet (round 1).

    Args:
        known_clients: K as the server's instruction reports it.
        known_examples: N as the server's instruction reports it; 0 before any reply was accepted.
        num_examples: this client's N_k.
        fresh: the client has no durable state yet.

    Returns:
        (K, N): K is at least 1; N stays 0 while the server knows no sizes.
    """
    if fresh and known_examples > 0:
        return known_clients + 1, known_examples + num_examples
    return max(known_clients, 1), known_examples
