"""Per-reply isolation for the round core (server/round_core.py): one client can neither stop the federation nor
put its reply into the state.

  screen       each reply's update (its change to the state, `ServerStrategy.update_of`) is measured against the
               round's other updates, per unit of its client's expected size, and the state itself (bayes/robust.py
               screen_bounds) before anything is aggregated; an absurd one is refused alone.
  culprits     when the replies together still make an unusable state (non-finite, not positive definite), the
               round is not lost: `usable_subset` finds the replies to leave out and the round is committed from
               the others.
  quarantine   a node whose replies are refused `max-client-rejections` rounds in a row sits out
               `quarantine-rounds` rounds of sampling and scheduling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fedbayes.strategies.base import RoundRejected

P = TypeVar("P")


@dataclass
class Isolated:
    """What `usable_subset` found: the replies to commit and the state they make (None: none usable), and each
    left-out reply with the reason."""

    used: list
    result: Any
    left_out: list[tuple[Any, str]] = field(default_factory=list)


def usable_subset(payloads: Sequence[P], attempt: Callable[[list[P]], Any], size_of: Mapping[int, float]) -> Isolated:
    """The largest-first search for the replies that make a round unusable. `attempt(replies)` returns the state
    those replies make or raises RoundRejected; `size_of[id(reply)]` is its update norm (0 when unknown).

    1. All replies together: usable? Done.
    2. A reply whose state alone is unusable is a culprit on its own: left out.
    3. Of the rest, the one whose leaving out makes the round usable, trying the longest updates first; when no
       single one does (several culprits together), the longest is left out and the search repeats.
    Costs at most K + K(K+1)/2 attempts, and only in a round that fails.

    Args:
        payloads: the round's replies that passed screening, in reply order.
        attempt: replies -> the state they make; raises RoundRejected when that state is unusable. Any other
            exception propagates.
        size_of: id(reply) -> its update's norm; a reply missing from it counts as 0.

    Returns:
        The replies used and their state (every reply when all together are usable), and each reply left out with
        the reason; when no subset was found usable, none used, a None state and every reply left out (none at all
        for no payloads).
    """
    remaining = list(payloads)
    if not remaining:
        return Isolated([], None)
    try:
        return Isolated(remaining, attempt(remaining))
    except RoundRejected as rejected:
        together = str(rejected)
    if len(remaining) == 1:
        return Isolated([], None, [(remaining[0], together)])
    left_out = []
    for payload in list(remaining):
        try:
            attempt([payload])
        except RoundRejected as alone:
            left_out.append((payload, f"the state it makes on its own would be unusable: {alone}"))
            remaining.remove(payload)
    while remaining:
        try:
            return Isolated(remaining, attempt(remaining), left_out)
        except RoundRejected as rejected:
            together = str(rejected)
        if len(remaining) == 1:
            break
        longest_first = sorted(remaining, key=lambda payload: -size_of.get(id(payload), 0.0))
        for suspect in longest_first:
            rest = [payload for payload in remaining if payload is not suspect]
            try:
                result = attempt(rest)
            except RoundRejected:
                continue
            left_out.append(
                (
                    suspect,
                    f"with it the round's state would be unusable ({together}); the round was "
                    "committed from the other replies",
                )
            )
            return Isolated(rest, result, left_out)
        left_out.append(
            (
                longest_first[0],
                f"with it the round's state would be unusable ({together}), and no "
                "single other reply explains it: the longest update was left out",
            )
        )
        remaining.remove(longest_first[0])
    left_out += [(payload, f"rejected with this round's aggregate: {together}") for payload in remaining]
    return Isolated([], None, left_out)


@dataclass
class Quarantine:
    """Nodes whose replies were refused `max_rejections` rounds in a row sit out `rounds` rounds. Keyed by node:
    sampling and scheduling pick nodes, and a refused reply may claim any client id."""

    max_rejections: int
    rounds: int
    refusals: dict[int, int] = field(default_factory=dict)  # node -> consecutive rounds its reply was refused
    until: dict[int, int] = field(default_factory=dict)  # node -> the last round it sits out

    def excludes(self, node: int, server_round: int) -> bool:
        """Whether `node` sits out `server_round`.

        Args:
            node: a Flower node id.
            server_round: the round being sampled or scheduled.

        Returns:
            True while the round is at or before the last round it sits out.
        """
        return self.until.get(node, 0) >= server_round

    def active(self, server_round: int) -> dict[int, int]:
        """The quarantines still in force in `server_round`.

        Args:
            server_round: the round.

        Returns:
            Node -> the last round it sits out, for nodes that sit out `server_round`.
        """
        return {node: last for node, last in self.until.items() if last >= server_round}

    def record(self, server_round: int, refused: set[int], accepted: set[int]) -> list[int]:
        """After a round: count the nodes whose reply was refused, forgive those accepted (a silent node keeps its
        count). Quarantines over by the next round are dropped.

        Args:
            server_round: the round just ended.
            refused: the nodes with a reply refused this round.
            accepted: the nodes with a reply accepted this round; a node in both counts as accepted.

        Returns:
            The nodes quarantined now, ascending; each sits out the next `rounds` rounds.
        """
        for node in accepted:
            self.refusals.pop(node, None)
        quarantined = []
        for node in sorted(refused - accepted):
            self.refusals[node] = self.refusals.get(node, 0) + 1
            if self.refusals[node] >= self.max_rejections:
                del self.refusals[node]
                self.until[node] = server_round + self.rounds
                quarantined.append(node)
        self.until = self.active(server_round + 1)
        return quarantined

    def to_metadata(self) -> dict[str, dict[str, int]]:
        """The counts for a checkpoint (restore reads them back).

        Returns:
            {"refusals": node -> consecutive refused rounds, "until": node -> last round sat out}, nodes as strings.
        """
        return {
            "refusals": {str(n): c for n, c in self.refusals.items()},
            "until": {str(n): r for n, r in self.until.items()},
        }

    def restore(self, metadata: Mapping[str, Mapping[str, int]]) -> None:
        """Replace the counts with those `to_metadata` wrote.

        Args:
            metadata: its "refusals" and "until".

        Raises:
            KeyError: either is missing.
            ValueError: a node or count is not an integer.
        """
        self.refusals = {int(node): int(count) for node, count in metadata["refusals"].items()}
        self.until = {int(node): int(last) for node, last in metadata["until"].items()}
