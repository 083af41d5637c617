"""Flower's object pulls without their 1 s first back-off, and the ServerApp's bounded by `max-payload-mb`, under the
name the docs use. The code is fedbayes.tasks.object_pulls: the ServerApp's round loop uses it too, and only
fedbayes.deploy imports fedbayes.deploy."""

from fedbayes.tasks.object_pulls import (
    DEFAULT_BACKOFF,
    OBJECT_OVERHEAD_BYTES,
    PATCHED_FLOWER,
    bound_reply_pulls,
    bounded_pulls,
    pull_backoff,
    seconds_from_env,
    shorten_pull_backoff,
)

__all__ = [
    "DEFAULT_BACKOFF",
    "OBJECT_OVERHEAD_BYTES",
    "PATCHED_FLOWER",
    "bound_reply_pulls",
    "bounded_pulls",
    "pull_backoff",
    "seconds_from_env",
    "shorten_pull_backoff",
]
