"""What fedbayes sets on Flower's messages that Flower's public API leaves to its own stores."""

from __future__ import annotations

from flwr.app import Message


def assign_message_id(message: Message, message_id: str) -> None:
    """Give `message` the id a store would assign it: Flower's Metadata keeps it in a private field that only
    Flower's own stores set (an error reply the SuperLink makes, a message pushed to an in-process grid).

    Args:
        message: the message.
        message_id: its id.
    """
    message.metadata.__dict__["_message_id"] = message_id
