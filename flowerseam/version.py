"""The one version gate: the Flower release every patch in this package was read in."""

from __future__ import annotations

PATCHED_FLOWER = "1.39.0"


def flower_is_patched() -> bool:
    """Whether the installed Flower is the one the patches were read in.

    Returns:
        True on Flower PATCHED_FLOWER; a patch that is only an optimisation then changes nothing.
    """
    import flwr

    return flwr.__version__ == PATCHED_FLOWER


def require_patched_flower(who: str, what: str, instead: str) -> None:
    """Refuse to patch a Flower other than the one the patches were read in.

    Args:
        who: the command that patches ("fedbayes supernode"), for the message.
        what: the part of Flower it patches ("SuperNode loop"), for the message.
        instead: the command to use instead (Flower's own), for the message.

    Raises:
        SystemExit: the installed Flower is not PATCHED_FLOWER.
    """
    import flwr

    if not flower_is_patched():
        raise SystemExit(
            f"{who} patches Flower {PATCHED_FLOWER}'s {what}, but Flower {flwr.__version__} is installed; "
            f"use `{instead}` instead"
        )
