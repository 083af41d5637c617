"""Flower's simulation engine asks its in-memory LinkState for each node's instruction without walking every stored
message for every node.

Flower 1.39's simulation process (`flwr-simulation`, which also runs our ServerApp) hands instructions to its virtual
clients from a thread that calls `InMemoryLinkState.get_message_ins(node_id, limit=1)` for every node every 0.1 s.
Each call checks every message in the store, under the state's lock (expiry, and that both ends are in the
federation), whichever node the message is for. A round's instructions stay in the store until their replies are
taken, so with 100 clients that is 10,000 checks every 0.1 s: the thread took 38% of a core of a 2-core machine
through a 100-client round, beside the clients that should have had it (py-spy of `reproduce_table1.py --setup
fmnist-100-two-class`, 91% of the process's samples; benchmarks/simulation_polls.py).

`check_only_own_messages(grid)`, called by the ServerApp with its grid, gives the engine's link state (the one behind
the simulation's InMemoryGrid) an `OwnMessages` index: the undelivered instructions by destination node, built from
the store once whenever the store has changed since, so that an ask checks only its own node's. Which messages an
ask returns, in which order, and that a returned message was checked and is marked delivered, are Flower's. A
message for another node is checked when that node asks (the engine asks for every node every 0.1 s), instead of at
every node's ask. It changes that one object's method, and only on the Flower it was read in.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from flwr.superlink.grid.inmemory_grid import InMemoryGrid  # the simulation engine's grid (server/app.py asks)

from fedbayes.flowerseam.version import flower_is_patched


def check_only_own_messages(grid: object) -> bool:
    """Give the link state behind the simulation's `grid` an OwnMessages index; False (and nothing changed) for another
    grid (a deployment ServerApp's) or on a Flower other than the one this was read in.

    Args:
        grid: the ServerApp's grid.

    Returns:
        Whether the link state's `get_message_ins` was replaced.
    """
    from flwr.server.superlink.linkstate import InMemoryLinkState

    if not flower_is_patched() or not isinstance(grid, InMemoryGrid):
        return False
    state = grid.state
    if not isinstance(state, InMemoryLinkState):
        return False
    state.get_message_ins = OwnMessages(state).get_message_ins  # type: ignore[method-assign]
    return True


class OwnMessages:
    """Flower 1.39's `InMemoryLinkState.get_message_ins` for one link state, from an index of the undelivered
    instructions by destination node.

    The index is rebuilt when the store has changed: when its size or its newest key differ from the last build's.
    Messages are only ever added at the end of the store, each under a new id (the simulation's InMemoryGrid gives
    every pushed message a fresh uuid4), so an addition changes the newest key and a removal without one changes the
    size. A stale entry (delivered or gone) is skipped when its node asks."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.built_for: tuple[int, str | None] | None = None
        self.waiting: dict[int, list[str]] = {}

    def get_message_ins(self, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Any]:
        """`InMemoryLinkState.get_message_ins`: the undelivered instructions for `node_id`, marked delivered now.

        Args:
            node_id: the asking node.
            limit: the most instructions to return; None: all.
            run_id: only that run's; None: any run's.

        Returns:
            The instructions, oldest first (expired ones, and those of nodes out of the federation, dropped).

        Raises:
            AssertionError: `limit` is below 1, as Flower's does.
        """
        from flwr.supercore.date import now

        if limit is not None and limit < 1:
            raise AssertionError("`limit` must be >= 1")
        store, found = self.state.message_ins_store, []
        with self.state.lock:
            for message_id in list(self._waiting_for(node_id)):
                message = store.get(message_id)
                if message is None or message.metadata.delivered_at != "":
                    self.waiting[node_id].remove(message_id)
                    continue
                if run_id is not None and message.metadata.run_id != run_id:
                    continue
                self.state._check_stored_messages({message_id})  # deletes it if expired or out of the federation
                if message_id in store:
                    found.append(message)
                if limit and len(found) == limit:
                    break
        delivered_at = now().isoformat()
        for message in found:
            message.metadata.delivered_at = delivered_at
        return found

    def _waiting_for(self, node_id: int) -> list[str]:
        store = self.state.message_ins_store
        signature = (len(store), next(reversed(store), None))
        if signature != self.built_for:
            waiting: defaultdict[int, list[str]] = defaultdict(list)
            for message_id, message in store.items():
                if message.metadata.delivered_at == "":
                    waiting[message.metadata.dst_node_id].append(message_id)
            self.waiting, self.built_for = dict(waiting), signature
        return self.waiting.get(node_id, [])
