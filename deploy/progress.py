"""The progress line of `fedbayes local` and `fedbayes run`: round i/N, time elapsed, ETA, accuracy so far and the
clients accepted in the last round.

On a terminal it is one line at the bottom, redrawn in place (carriage return) every second and when a round ends,
with the other output scrolling above it. Where the output is no terminal (a pipe, a log file) each round adds one
plain line, `progress: round 3/10 | 0:12 elapsed | ETA 0:25 | accuracy 0.8123 | clients 3/3`, and nothing is redrawn.
After a round the server did not evaluate (run config `eval-every`) it shows the last accuracy there is, with its
round: `accuracy 0.8123 (round 5)`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from fedbayes.tasks.events import CHECKPOINTED, COMMITTED, EVALUATED, Event

TICK = 1.0  # seconds between redraws of the live line (its elapsed time)
CLEAR_LINE = "\r\x1b[K"  # back to the line's start, then erase it
DEFAULT_COLUMNS = 80


@dataclass(frozen=True)
class RoundDone:
    """A round of the run done: its number and the run's rounds, its accuracy (None: not evaluated), and the replies it
    accepted of those it sent work."""

    round: int
    rounds: int  # of the run
    accuracy: float | None  # None: the round was not evaluated
    clients: int  # replies accepted
    clients_sent: int


class RoundEvents:
    """Folds the ServerApp's events (tasks/events.py) into the rounds they finish: a round is done once it is
    checkpointed, with the clients its commit accepted and, if it was evaluated, its accuracy."""

    def __init__(self) -> None:
        self.clients: dict[int, tuple[int, int]] = {}  # round -> (accepted, sent)
        self.accuracy: dict[int, float] = {}

    def feed(self, event: Event) -> RoundDone | None:
        """The round `event` finishes, or None for any other event.

        Args:
            event: the ServerApp's next event.

        Returns:
            The round done, once its checkpointed event comes (with what its committed and evaluated events said).
        """
        if event.round is None:
            return None
        if event.type == COMMITTED:
            self.clients[event.round] = (event.fields["clients"], event.fields["clients_sent"])
        elif event.type == EVALUATED and "accuracy" in event.fields["metrics"]:
            self.accuracy[event.round] = event.fields["metrics"]["accuracy"]
        elif event.type == CHECKPOINTED:
            clients, sent = self.clients.pop(event.round, (0, 0))
            return RoundDone(event.round, event.fields["rounds"], self.accuracy.pop(event.round, None), clients, sent)
        return None


def clock_text(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour.

    Args:
        seconds: a duration, rounded to whole seconds; not negative.

    Returns:
        The text.
    """
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """`print` other output through it; `round_done` after each round; `close` (or leave the `with`) at the end."""

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """Start the live line (and its ticker thread) where `stream` is a terminal.

        Args:
            stream: where it writes; None: stdout.
            clock: the monotonic clock, in seconds.
        """
        self.stream = stream or sys.stdout
        self.clock = clock
        self.live = self.stream.isatty()
        self.started = clock()
        self.first: tuple[float, int] | None = None  # (when, round) of the first round seen end
        self.last: RoundDone | None = None
        self.last_evaluated: RoundDone | None = None
        self.last_at = 0.0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, name="progress", daemon=True) if self.live else None
        if self.ticker is not None:
            self.ticker.start()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def print(self, text: str) -> None:
        """A line of other output, above the live line.

        Args:
            text: the line (a trailing newline is optional).
        """
        with self.lock:
            if self.live:
                line = text.rstrip("\n")
                self.stream.write(f"{CLEAR_LINE}{line}\n")
                self._draw()
            else:
                self.stream.write(text if text.endswith("\n") else f"{text}\n")
            self.stream.flush()

    def round_done(self, done: RoundDone) -> None:
        """Note a round done: the live line is redrawn, or elsewhere a `progress:` line written.

        Args:
            done: the round.
        """
        with self.lock:
            now = self.clock()
            self.first = self.first or (now, done.round)
            self.last, self.last_at = done, now
            if done.accuracy is not None:
                self.last_evaluated = done
            if self.live:
                self._draw()
            else:
                self.stream.write(f"progress: {self.status()}\n")
            self.stream.flush()

    def close(self) -> None:
        """Stop redrawing; the live line stays, as it was last, with a newline after it."""
        self.stopped.set()
        if self.ticker is not None:
            self.ticker.join()
            with self.lock:
                self._draw()
                self.stream.write("\n")
                self.stream.flush()
            self.ticker = None

    def status(self) -> str:
        """The live line's text: round, elapsed time, ETA, the last evaluated accuracy and the round's clients.

        Returns:
            One line, not cut to the terminal's width.
        """
        elapsed = f"{clock_text(self.clock() - self.started)} elapsed"
        if self.last is None:
            return f"{elapsed} | waiting for the first round"
        done = self.last
        return (
            f"round {done.round}/{done.rounds} | {elapsed} | ETA {self._eta(done)} | {self._accuracy()} | "
            f"clients {done.clients}/{done.clients_sent}"
        )

    def _accuracy(self) -> str:
        evaluated = self.last_evaluated
        if evaluated is None:
            return "accuracy -"
        return f"accuracy {evaluated.accuracy:.4f}" + ("" if evaluated is self.last else f" (round {evaluated.round})")

    def _eta(self, last: RoundDone) -> str:
        """The rounds left times the time a round took: over the rounds seen since the first one that ended here, or,
        with one seen so far, since the start (a resumed run's first round here is not round 1). `last`: the last
        round seen (self.last)."""
        left = last.rounds - last.round
        if left <= 0:
            return "0:00"
        assert self.first is not None  # set with the first round seen
        first_at, first_round = self.first
        per_round = (
            (self.last_at - first_at) / (last.round - first_round)
            if last.round > first_round
            else self.last_at - self.started
        )
        return clock_text(max(0.0, per_round * left - (self.clock() - self.last_at)))

    def _draw(self) -> None:
        # cut to the terminal's width: a line that wraps would not be redrawn in place (a new pty says 0 columns)
        width = (os.get_terminal_size(self.stream.fileno()).columns or DEFAULT_COLUMNS) - 1
        self.stream.write(f"{CLEAR_LINE}{self.status()[:width]}")

    def _tick(self) -> None:
        while not self.stopped.wait(TICK):
            with self.lock:
                self._draw()
                self.stream.flush()
