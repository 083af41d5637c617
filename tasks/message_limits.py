"""How large a message between a SuperLink, its SuperNodes and the ServerApp may be: the `--max-message-mb` option of
`fedbayes superlink` and `fedbayes supernode`, and the byte limits the patches of Flower's object transfers count
against (fedbayes.flowerseam.object_pulls, .supernode, .superlink)."""

from __future__ import annotations

import math
import os

# What a reply's objects may take beyond max-payload-mb: every object's head and child ids, the Message's metadata
# and the records' framing, a few hundred bytes per object; what is then still over is refused by
# check_payload_size (protos/codec.py), which counts the records themselves.
OBJECT_OVERHEAD_BYTES = 2**20
MAX_MESSAGE_OPTION = "--max-message-mb"


def message_bytes_limit(max_message_mb: float) -> int:
    """The most bytes of objects a message may take: its records plus OBJECT_OVERHEAD_BYTES of framing.

    Args:
        max_message_mb: the records' bound, in MiB (> 0).

    Returns:
        The bound in bytes.
    """
    return int(max_message_mb * 2**20) + OBJECT_OVERHEAD_BYTES


def default_max_message_mb() -> float:
    """What a SuperLink or SuperNode bounds messages at unless told.

    Returns:
        The run config's max-payload-mb default, in MiB.
    """
    from fedbayes.tasks.config import RunSettings, keys_of

    return float(next(key.default for key in keys_of(RunSettings) if key.name == "max-payload-mb"))


def max_message_option(argv: list[str]) -> tuple[float, list[str]]:
    """`fedbayes superlink`'s and `fedbayes supernode`'s own option, taken out of their arguments.

    Args:
        argv: the command's arguments, Flower's and --max-message-mb among them.

    Returns:
        The --max-message-mb given (default: `default_max_message_mb()`), in MiB, and the other arguments, for
        Flower's command as they are.

    Raises:
        SystemExit: naming the option, for a value that is not a finite number of MiB > 0.
    """
    import argparse

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(MAX_MESSAGE_OPTION, default=str(default_max_message_mb()))
    known, rest = parser.parse_known_args(argv)
    try:
        megabytes = float(known.max_message_mb)
    except ValueError:
        megabytes = math.nan
    if not 0 < megabytes < math.inf:
        raise SystemExit(f"{MAX_MESSAGE_OPTION} must be a finite number of MiB > 0, got {known.max_message_mb!r}")
    return megabytes, rest


def seconds_from_env(name: str, default: float, maximum: float) -> float:
    """An environment variable as a number of seconds.

    Args:
        name: the variable.
        default: its value when it is unset, in seconds.
        maximum: the largest value allowed, in seconds.

    Returns:
        The seconds, in (0, maximum].

    Raises:
        ValueError: naming the variable, when it is no number or is outside (0, maximum] (`default` included).
    """
    value = os.environ.get(name, str(default))
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not 0 < seconds <= maximum:
        raise ValueError(f"{name} must be in (0, {maximum:g}] seconds, got {seconds}")
    return seconds
