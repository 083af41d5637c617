"""Flower constants fedbayes reads that Flower does not export publicly (flwr.common.constant)."""

from flwr.common.constant import (
    HEARTBEAT_MIN_INTERVAL,
    PUBLIC_KEY_ALREADY_IN_USE_MESSAGE,
    ErrorCode,
)

__all__ = ["HEARTBEAT_MIN_INTERVAL", "PUBLIC_KEY_ALREADY_IN_USE_MESSAGE", "ErrorCode"]
