"""`fedbayes superlink`: Flower's own SuperLink, whose log stream ends sooner after its run.

`flwr run --stream` (what `fedbayes run` and so `fedbayes local` wait on) ends when the SuperLink ends the run's log
stream, and Flower 1.39's SuperLink looks for new log lines and for the run's end every 0.5 s
(`LOG_STREAM_INTERVAL`, flwr/superlink/servicer/control/control_handlers.py): every run's command waited 0-0.5 s
after its ServerApp had ended (2026-11-28, 2-core machine: last row -> exit 0.8-1.5 s against the BayesADMM authors'
single process, 0.9-1.0 s). This entry point runs the same `flower-superlink` (same arguments and behaviour) with that
interval at `STREAM_INTERVAL`; a look is two reads of the SuperLink's state, only while a log is streamed. Once Flower
has stopped its servers the process ends without the interpreter's teardown (`exit_without_teardown`).

The patch is tied to the code it was read in: any Flower but 1.39.0 is refused rather than patched blindly.
"""

from __future__ import annotations

import sys

from fedbayes.deploy.processes import exit_without_teardown

PATCHED_FLOWER = "1.39.0"
STREAM_INTERVAL = 0.1  # seconds between a streamed log's looks for new lines and for the run's end (Flower: 0.5)


def patch_flower(interval: float) -> None:
    import flwr
    from flwr.superlink.servicer.control import control_handlers

    if flwr.__version__ != PATCHED_FLOWER or not hasattr(control_handlers, "LOG_STREAM_INTERVAL"):
        raise SystemExit(
            f"fedbayes superlink patches Flower {PATCHED_FLOWER}'s log stream, but Flower {flwr.__version__} is "
            "installed; use `flower-superlink` instead"
        )
    control_handlers.LOG_STREAM_INTERVAL = interval  # read by _stream_logs at every look


def main(argv: list[str]) -> int:
    """Run `flower-superlink` with `argv` as its arguments; the process ends with it (`exit_without_teardown`)."""
    patch_flower(STREAM_INTERVAL)
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *argv]
    exit_without_teardown(flower_superlink)
