"""One-line reports of a run, for people: the ServerApp's log lines of its failure, of a federation it named and of
what run config `tracking` has to say; and `fedbayes run`'s own last line when a run did not complete.

The tools read none of the ServerApp's lines: they read its events (tasks/events.py), which carry the same facts
as data. `fedbayes local` reads the reason on `fedbayes run`'s last line (`fedbayes run failed: <reason>`,
deploy/flwr_run.py) where the ServerApp sent no event with it (`flwr run` itself failed).
"""

from __future__ import annotations

RUN_FAILED = "fedbayes run failed: "


class RunFailed(RuntimeError):
    """The run did not complete. The message is one line, `fedbayes run failed: <reason>`."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{RUN_FAILED}{reason}")


_NEW_FEDERATION = 'fedbayes: new federation "{name}"; to resume it, submit the same run config with federation="{name}"'


def error_reason(error: BaseException) -> str:
    """An exception as one line of reason.

    Args:
        error: the exception.

    Returns:
        `<ExceptionType>: <message>`, the message's whitespace folded onto one line; the type alone without a message.
    """
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def run_failed_line(error: BaseException) -> str:
    """`fedbayes run`'s last line for a run that did not complete.

    Args:
        error: what ended the run.

    Returns:
        `fedbayes run failed: <ExceptionType>: <message>`, the message folded onto the same line.
    """
    return f"{RUN_FAILED}{error_reason(error)}"


def failure_reason(line: str) -> str | None:
    """The reason a `fedbayes run failed: ` line gives.

    Args:
        line: a line of `fedbayes run`'s output.

    Returns:
        What follows `fedbayes run failed: `, stripped, or None if the line holds no such report.
    """
    _, found, reason = line.partition(RUN_FAILED)
    return reason.strip() if found else None


def new_federation_line(name: str) -> str:
    """The ServerApp's log line of a federation it named, saying how to resume it.

    Args:
        name: the federation's name.

    Returns:
        `fedbayes: new federation "NAME"; to resume it, submit the same run config with federation="NAME"`.
    """
    return _NEW_FEDERATION.format(name=name)


TRACKING = "fedbayes tracking: "  # where run config `tracking` sends, and each time it fails (server/tracking.py)


def tracking_line(message: str) -> str:
    """The ServerApp's log line of what run config `tracking` has to say.

    Args:
        message: where tracking sends, or how it failed.

    Returns:
        `fedbayes tracking: <message>`, the message's whitespace folded onto one line.
    """
    return f"{TRACKING}{' '.join(message.split())}"
