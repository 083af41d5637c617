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
        return Membership(dict(self.examples), dict(self.last_round))

    def without(self, client: str) -> Membership:
        """A copy without `client` (forgotten): K and N no longer count it."""
        return Membership(
            {c: n for c, n in self.examples.items() if c != client},
            {c: r for c, r in self.last_round.items() if c != client},
        )

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
