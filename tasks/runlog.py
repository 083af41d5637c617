"""Lines the ServerApp logs that the command-line tools read back from the streamed run log.

The ServerApp runs in Flower's executor, maybe on another machine; all `fedbayes run` and `fedbayes local`
see of it is the log `flwr run --stream` prints and the run's status. Flower reports a failed ServerApp
only as a status whose details hold the exception's message, not its type, and a federation named by
the ServerApp itself is known nowhere else, so both are logged as one line of a fixed form; so is what run config
`tracking` has to say (where it sends, each time it fails), which `fedbayes local` shows beside its table.
"""

from __future__ import annotations

import re

RUN_FAILED = "fedbayes run failed: "


class RunFailed(RuntimeError):
    """The run did not complete. The message is one line, `fedbayes run failed: <reason>`."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{RUN_FAILED}{reason}")


_NEW_FEDERATION = 'fedbayes: new federation "{name}"; to resume it, submit the same run config with federation="{name}"'
_NEW_FEDERATION_PATTERN = re.compile(r'fedbayes: new federation "([A-Za-z0-9._-]+)"')


def run_failed_line(error: BaseException) -> str:
    """`fedbayes run failed: <ExceptionType>: <message>`, the message folded onto the same line."""
    message = " ".join(str(error).split())
    return f"{RUN_FAILED}{type(error).__name__}: {message}" if message else f"{RUN_FAILED}{type(error).__name__}"


def failure_reason(line: str) -> str | None:
    """What follows `fedbayes run failed: ` in a log line, or None if the line is no such report."""
    _, found, reason = line.partition(RUN_FAILED)
    return reason.strip() if found else None


def new_federation_line(name: str) -> str:
    return _NEW_FEDERATION.format(name=name)


def new_federation(line: str) -> str | None:
    """The federation a log line announces as newly named by the ServerApp, or None."""
    match = _NEW_FEDERATION_PATTERN.search(line)
    return match.group(1) if match else None


TRACKING = "fedbayes tracking: "  # where run config `tracking` sends, and each time it fails (server/tracking.py)


def tracking_line(message: str) -> str:
    """`fedbayes tracking: <message>`, the message on one line."""
    return f"{TRACKING}{' '.join(message.split())}"


def tracking_notice(line: str) -> str | None:
    """What follows `fedbayes tracking: ` in a log line, or None if the line is no such notice."""
    _, found, notice = line.partition(TRACKING)
    return notice.strip() if found else None
