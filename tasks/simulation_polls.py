"""Flower's simulation engine asks its in-memory LinkState for each node's instruction without checking every
stored message for every node.

Flower 1.39's simulation process (`flwr-simulation`, which also runs our ServerApp) hands instructions to its virtual
clients from a thread that calls `InMemoryLinkState.get_message_ins(node_id, limit=1)` for every node every 0.1 s.
Each call checks every message in the store, under the state's lock (expiry, and that both ends are in the
federation), whichever node the message is for. A round's instructions stay in the store until their replies are
taken, so with 100 clients that is 10,000 checks every 0.1 s: the thread took 38% of a core of a 2-core machine
through a 100-client round, beside the clients that should have had it (py-spy of `reproduce_table1.py --setup
fmnist-100-two-class`, 91% of the process's samples).

`check_only_own_messages(grid)`, called by the ServerApp with its grid, makes that call on the engine's link state
(the one behind the simulation's InMemoryGrid) check only the undelivered messages addressed to the asking node.
Which messages it returns, in which order, and that a returned message was checked and is marked delivered, are
Flower's. A message for another node is checked when that node asks (the engine asks for every node every 0.1 s),
instead of at every node's ask. It changes that one object's method, and only on the Flower it was read in.
"""

from __future__ import annotations

from types import MethodType
from typing import Any

PATCHED_FLOWER = "1.39.0"


def check_only_own_messages(grid: object) -> bool:
    """Patch the link state behind the simulation's `grid`; False (and nothing changed) for another grid (a
    deployment ServerApp's) or on a Flower other than the one this was read in."""
    import flwr
    from flwr.server.superlink.linkstate import InMemoryLinkState
    from flwr.superlink.grid import InMemoryGrid

    if flwr.__version__ != PATCHED_FLOWER or not isinstance(grid, InMemoryGrid):
        return False
    state = grid.state
    if not isinstance(state, InMemoryLinkState):
        return False
    state.get_message_ins = MethodType(get_message_ins, state)  # type: ignore[method-assign]
    return True


def get_message_ins(self: Any, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Any]:
    """Flower 1.39's `InMemoryLinkState.get_message_ins`, checking only the messages it may return."""
    from flwr.supercore.date import now

    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found = []
    with self.lock:
        addressed = [
            message_id
            for message_id, message in self.message_ins_store.items()
            if (metadata := message.metadata).dst_node_id == node_id
            and metadata.delivered_at == ""
            and (run_id is None or metadata.run_id == run_id)
        ]
        for message_id in addressed:
            self._check_stored_messages({message_id})  # deletes it if expired or out of the federation
            if (message := self.message_ins_store.get(message_id)) is not None:
                found.append(message)
            if limit and len(found) == limit:
                break
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found
