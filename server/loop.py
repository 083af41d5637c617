"""The server's round loop: push each round's messages, poll for replies, aggregate, evaluate, log.

Flower's Strategy.start drives rounds through Grid.send_and_receive, which sleeps 3 s between
polls and has no per-round bound we control; this loop pushes and pulls itself every `poll-interval`
seconds, bounds every round by `round-timeout`, and maps errors the SuperLink makes on a node's behalf
(src_node_id 1) back to the node they were addressed to. benchmarks/round_overhead.py measured no gain
from polling faster than 3 s (the clients' side dominates), so the default is a modest 0.5 s.

Round t's evaluation, row and checkpoint run on a background thread while round t+1's clients train
(RoundFinisher); they are still written in round order, and finished before round t+1 aggregates. Round t+1's
instructions thus name round t accepted before checkpoint t may be on disk; they also name the accepted rounds
of the newest checkpoint that is (Header.checkpointed_rounds), and clients keep those states, so a server killed
in between resumes from checkpoint t-1 and its clients still hold every state it names.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, Error, Message
from flwr.common import log
from flwr.serverapp import Grid

from fedbayes.flowerseam.object_pulls import bound_reply_pulls, shorten_pull_backoff
from fedbayes.flowerseam.simulation_polls import check_only_own_messages
from fedbayes.protos.codec import check_payload_size, reply_timings
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.server.client_metrics import row_fields as client_metrics_row
from fedbayes.server.forget import ClientLink, Forgetting, server_lock
from fedbayes.server.round_core import RoundCore, RoundOutcome, RoundReport
from fedbayes.strategies.base import ServerState
from fedbayes.tasks.config import LoopSettings
from fedbayes.tasks.events import (
    CHECKPOINTED,
    COMMITTED,
    EVALUATED,
    FORGOTTEN,
    REFUSED,
    REPLIES,
    ROUND_STARTED,
    EventLog,
)
from fedbayes.tasks.storage import MAX_RECORD_BYTES, complete_lines, read_bounded, write_atomically

# (global arrays, round) -> metrics (numbers, reliability bins; None in a round not evaluated, server/evaluation.py)
Evaluate = Callable[[ArrayRecord, int], dict[str, Any]]
RESULTS_START = "results-start.json"  # in a federation's state directory: where its rows begin in its results file
RowSink = Callable[[dict[str, Any]], None]  # gets each results row as it is written; must not raise or block


class ResultsLog:
    """One JSON object per round, appended and flushed as soon as the round ends.

    A resumed run (`keep_through_round`: its checkpoint's round) drops the rows at the file's end of the rounds
    after its checkpoint, which it runs again, and keeps every line before them (an earlier run's, appended to).
    A new federation (no checkpoint) whose file is not empty does what run config `results-exists` says
    (`if_exists`): refuse (ConfigError naming the keys; the file is left as it is), append after what the file
    holds, or replace it. With `start_record` (a file in the federation's state directory) it notes there where its
    rows begin, so that the federation started again before its first checkpoint (stopped between round 1's row and
    its checkpoint) drops its own rows, which it runs again, instead of taking them for an earlier run's."""

    def __init__(
        self, path: str, keep_through_round: int = 0, if_exists: str = "refuse", start_record: Path | None = None
    ) -> None:
        self.path = Path(path) if path else None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if keep_through_round > 0:
            self._drop_rounds_after(self.path, keep_through_round)
        elif start_record is not None and (restarted_at := self._recorded_start(start_record, self.path)) is not None:
            self._keep_through(self.path, self._end_of_lines(self.path, restarted_at))
        else:
            if self.path.exists() and self.path.stat().st_size > 0:
                self._start_on_existing(self.path, if_exists)
            if start_record is not None:
                self._record_start(start_record, self.path)

    @staticmethod
    def _recorded_start(start_record: Path, path: Path) -> int | None:
        """The line this federation's rows began at in `path`, if it has started before and wrote them there."""
        try:
            record = json.loads(read_bounded(start_record, MAX_RECORD_BYTES, "a start record"))
        except FileNotFoundError:
            return None
        return int(record["first_line"]) if record["path"] == str(path.resolve()) else None

    @staticmethod
    def _record_start(start_record: Path, path: Path) -> None:
        first_line = _newlines(path) if path.exists() else 0
        record = {"path": str(path.resolve()), "first_line": first_line}
        write_atomically(start_record, json.dumps(record).encode())

    @staticmethod
    def _end_of_lines(path: Path, count: int) -> int:
        """The offset after the first `count` complete lines of `path` (all of them, if it has fewer)."""
        end = 0
        for line in complete_lines(path) if path.exists() else ():
            if line.number > count:
                break
            end = line.end
        return end

    @staticmethod
    def _keep_through(path: Path, end: int) -> None:
        """Cut `path` after offset `end` (a line's end): what follows goes, a last line cut short by a crash with it;
        nothing before it is read or rewritten."""
        with path.open("ab") as results_file:
            results_file.truncate(end)

    @classmethod
    def _drop_rounds_after(cls, path: Path, server_round: int) -> None:
        """Cut the rows of the rounds after `server_round` (and blank lines) from the file's end."""
        end = 0
        for line in complete_lines(path) if path.exists() else ():
            if line.text is None or (line.text.strip() and not cls._is_row_after(line.text, server_round)):
                end = line.end
        cls._keep_through(path, end)

    @staticmethod
    def _is_row_after(line: bytes, server_round: int) -> bool:
        """Whether `line` is the row of a round after `server_round`. A line that is no row (an earlier run's, a
        user's, one over the longest row read back) is not: the rows after it are the ones dropped."""
        try:
            row_round = json.loads(line)["round"]
        except (ValueError, TypeError, KeyError, RecursionError):
            return False
        return isinstance(row_round, int) and row_round > server_round

    @staticmethod
    def _start_on_existing(path: Path, if_exists: str) -> None:
        from fedbayes.tasks.preflight import results_exist_error

        if if_exists == "append":
            with path.open("rb+") as results_file:  # end a last line without a newline; delete nothing
                results_file.seek(-1, os.SEEK_END)
                if results_file.read(1) != b"\n":
                    results_file.write(b"\n")
        elif if_exists == "replace":
            path.write_text("")
        elif if_exists == "refuse":
            raise results_exist_error(path)
        else:
            raise ValueError(f"results-exists must be refuse, append or replace, got {if_exists!r}")

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` as one JSON line; nothing without a results path.

        Args:
            record: the round's results row, JSON-serialisable.

        Raises:
            OSError: the results file cannot be written.
        """
        if self.path is not None:
            with self.path.open("a") as results_file:
                results_file.write(json.dumps(record) + "\n")


def _newlines(path: Path) -> int:
    """The newlines in `path`, counted a MiB at a time."""
    with path.open("rb") as file:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(2**20), b""))


def wait_for_clients(grid: Grid, count: int, timeout: float, poll_interval: float) -> None:
    """Wait until at least `count` nodes are connected.

    Args:
        grid: the ServerApp's grid.
        count: the nodes to wait for.
        timeout: the most seconds to wait.
        poll_interval: seconds between two looks at the connected nodes.

    Raises:
        TimeoutError: fewer than `count` are connected after `timeout` seconds (how many are, in its message).
    """
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < count:
        if time.monotonic() > deadline:
            connected = len(list(grid.get_node_ids()))
            raise TimeoutError(f"only {connected} of the {count} clients asked for connected within {timeout:.0f} s")
        time.sleep(poll_interval)


ROW_KEYS = {"compute-seconds": "client_compute_seconds"}  # a round metric's key in the results row, where not its own
# A results row's wall-clock fields: the only ones that differ between two runs of the same seed.
TIMING_FIELDS = frozenset(
    {
        "round_seconds",
        "wall_seconds",
        "phase_seconds",
        "client_phase_seconds",
        "client_phase_max",
        "client_compute_seconds",
        "reply_seconds",
    }
)


class RunFailed(RuntimeError):
    """The federation trained nothing for `max-failed-rounds` rounds in a row, ended on rounds that trained nothing,
    or ended far worse than it began (`run_outcome_problem`)."""


# A run that ends on this many rounds in a row that accepted no reply fails, even where they are fewer than
# max-failed-rounds: it ended on a federation that no longer trains. One such round at the end can be a lone
# client's turn to leave (DSVGD's round robin samples one client a round).
ENDING_FAILED_ROUNDS = 2
# A run fails when its last evaluated accuracy is below this share of its first (of this start of the ServerApp):
# training diverged. Well above the noise of a few rounds, well below what forgetting a client costs.
ACCURACY_COLLAPSE = 0.5


@dataclass
class RoundOutcomes:
    """What the loop keeps of the rounds of this start to judge the run by: the rounds in a row that accepted no
    reply so far, and the first and last evaluated (round, accuracy)."""

    failed_since: int | None = None  # the first round of the current streak of rounds that accepted no reply
    failed_rounds: int = 0
    first_evaluated: tuple[int, float] | None = None
    last_evaluated: tuple[int, float] | None = None

    def round_trained(self, server_round: int, accepted: int) -> None:
        """Note a round's accepted replies: none extends the streak of failed rounds, any ends it.

        Args:
            server_round: the round.
            accepted: the replies it accepted.
        """
        if accepted:
            self.failed_since, self.failed_rounds = None, 0
        else:
            self.failed_since = self.failed_since or server_round
            self.failed_rounds += 1

    def evaluated(self, server_round: int, accuracy: float | None) -> None:
        """Note a round's evaluated accuracy, as the first evaluated (if none is yet) and the last.

        Args:
            server_round: the round.
            accuracy: its test accuracy; None (not evaluated) notes nothing.
        """
        if accuracy is not None:
            self.first_evaluated = self.first_evaluated or (server_round, accuracy)
            self.last_evaluated = (server_round, accuracy)

    def failed_span(self) -> str:
        """The current streak of failed rounds: "round 4" or "rounds 3-5".

        Returns:
            The span, for messages; only while a streak runs (`failed_rounds` > 0).
        """
        assert self.failed_since is not None
        last = self.failed_since + self.failed_rounds - 1
        return f"round {last}" if self.failed_rounds == 1 else f"rounds {self.failed_since}-{last}"


def run_outcome_problem(outcomes: RoundOutcomes, rounds_run: int) -> str | None:
    """Why a run that went through its `rounds_run` rounds (of this start) did not end well, or None if it did: it
    ended on ENDING_FAILED_ROUNDS or more rounds that accepted no reply (or every one of its rounds did), or its last
    evaluated accuracy is under ACCURACY_COLLAPSE of its first.

    Args:
        outcomes: the rounds of this start, through the last (its evaluation included).
        rounds_run: the rounds this start ran.

    Returns:
        The problem, for RunFailed's message; None for a run that ended well.
    """
    failed = outcomes.failed_rounds
    if failed and (failed == rounds_run or failed >= ENDING_FAILED_ROUNDS):
        if failed == rounds_run == 1:
            return f"its one round ({outcomes.failed_span()}) accepted no client reply"
        which = f"none of the {failed} rounds" if failed == rounds_run else f"none of the last {failed} rounds"
        return f"{which} accepted a client reply ({outcomes.failed_span()})"
    first, last = outcomes.first_evaluated, outcomes.last_evaluated
    if first is not None and last is not None and last[1] < ACCURACY_COLLAPSE * first[1]:
        return (
            f"accuracy fell from {first[1]:.4f} (round {first[0]}) to {last[1]:.4f} (round {last[0]}), under "
            f"{ACCURACY_COLLAPSE:g} x its first value: training diverged"
        )
    return None


def straggler_deadlines(
    half_seconds: float,
    waiting: Mapping[Any, int | None],
    replied_examples: Sequence[int],
    wait: float,
    waited_once: Set[Any],
) -> dict[Any, float]:
    """When the round stops waiting for each of the clients still `waiting` (client -> the examples of its last
    accepted reply, None: unknown) once half the replies are in, `half_seconds` after the round started (run config
    `straggler-wait` = `wait`), in seconds from the round's start: `half_seconds` x (1 + `wait` x its size), its size
    being its examples over the median of those that replied (`replied_examples`), at least 1. A client's compute grows
    with its examples, so the largest honest client is allowed its share, and one slower than its data explains is cut.
    A client of unknown size (or when no reply's is known) counts as size 1, except that one never `waited_once` for
    is waited for up to round-timeout (math.inf): the server learns its size from that reply.

    Args:
        half_seconds: seconds from the round's start until half the replies were in.
        waiting: the clients not yet replied -> the examples of their last accepted reply (None: unknown).
        replied_examples: the known examples of the clients that replied.
        wait: run config `straggler-wait`.
        waited_once: the clients of unknown size already waited for up to round-timeout once.

    Returns:
        Per waiting client, the seconds from the round's start after which the round stops waiting for it
        (math.inf: up to round-timeout).
    """
    reference = statistics.median(replied_examples) if replied_examples else None
    deadlines = {}
    for client, examples in waiting.items():
        if examples is None and client not in waited_once:
            deadlines[client] = math.inf
            continue
        size = max(1.0, examples / reference) if examples is not None and reference else 1.0
        deadlines[client] = half_seconds * (1 + wait * size)
    return deadlines


@dataclass
class Stragglers:
    """The round loop's straggler policy (`straggler_deadlines`) and what it keeps across rounds: `examples_of` a node
    (its client's last accepted reply's; None: unknown), and the nodes of unknown size it has waited for once."""

    wait: float
    examples_of: Callable[[int], int | None]
    waited_once: set[int] = field(default_factory=set)

    def deadlines(self, half_seconds: float, waiting: Iterable[int], replied: Iterable[int]) -> dict[int, float]:
        """Per waiting node, the seconds from the round's start after which the round stops waiting for it.

        Args:
            half_seconds: seconds from the round's start until half the replies were in.
            waiting: the nodes not yet replied.
            replied: the nodes that replied.

        Returns:
            Node -> its deadline (`straggler_deadlines`); the waiting nodes of unknown size are noted as waited for
            once, so a later round cuts them as size 1.
        """
        sizes = {node: self.examples_of(node) for node in waiting}
        replied_examples = [examples for node in replied if (examples := self.examples_of(node)) is not None]
        deadlines = straggler_deadlines(half_seconds, sizes, replied_examples, self.wait, self.waited_once)
        self.waited_once |= {node for node, examples in sizes.items() if examples is None}
        return deadlines

    def why(self, node: int, half_seconds: float, deadline: float) -> str:
        """Why the round stopped waiting for `node` at `deadline` seconds.

        Args:
            node: the node cut.
            half_seconds: seconds from the round's start until half the replies were in.
            deadline: its deadline (`deadlines`), finite.

        Returns:
            The reason its silence is reported with: straggler-wait, the half-time, and its size where over 1.
        """
        size = (deadline / half_seconds - 1) / self.wait
        scaled = f", x its size {size:.2g} ({self.examples_of(node)} examples against the median of those replies)"
        return (
            f"no reply within {deadline:.1f} s: straggler-wait={self.wait:g} x the {half_seconds:.1f} s half the "
            "replies took" + (scaled if size > 1 + 1e-9 else "")
        )


def exchange(
    grid: Grid,
    messages: Sequence[Message],
    timeout: float,
    poll_interval: float,
    phases: dict[str, float],
    stragglers: Stragglers | None = None,
    arrivals: dict[int, float] | None = None,
) -> tuple[list[Message], dict[int, str], dict[int, Error]]:
    """Send `messages` and collect replies until all arrived, `timeout` passed, or `stragglers`' deadlines passed
    (from the moment half the replies are in: `straggler_deadlines`); (replies, silent node -> why, node -> the error
    it answered with). A reply that comes later is never pulled: the server does not use it, and its client rolls
    back. Records in `phases` the seconds the push took and, from the push, until the first and the last reply; in
    `arrivals` (if given), per node that answered, the seconds from the push until its reply or error was pulled.

    Args:
        grid: the ServerApp's grid.
        messages: one message per node.
        timeout: the most seconds to wait for replies (round-timeout).
        poll_interval: seconds between two pulls.
        phases: where "push", "first_reply" and "last_reply" seconds are recorded.
        stragglers: the straggler policy (None, or `wait` 0: wait up to `timeout` for every reply).
        arrivals: where each answering node's seconds from the push are recorded (None: nowhere).

    Returns:
        The replies without error; each node that did not answer -> why (logged); each node whose answer is an
        error -> that error (a SuperLink-made one's under the node it was addressed to).
    """
    pushed = time.perf_counter()
    message_ids = list(grid.push_messages(messages))
    phases["push"] = time.perf_counter() - pushed
    destination = {mid: msg.metadata.dst_node_id for mid, msg in zip(message_ids, messages) if mid}
    pending = set(destination)
    replies: list[Message] = []
    errors: dict[int, Error] = {}
    started = time.monotonic()
    half = max(1, math.ceil(len(destination) / 2))
    deadlines: dict[int, float] | None = None  # per waiting node, seconds from `started`, once half the replies are in
    half_seconds = 0.0
    while pending and time.monotonic() < started + timeout:
        if stragglers is not None and stragglers.wait > 0 and deadlines is None and len(replies) >= half:
            half_seconds = time.monotonic() - started
            replied = [reply.metadata.src_node_id for reply in replies]
            deadlines = stragglers.deadlines(half_seconds, [destination[mid] for mid in pending], replied)
        if deadlines is not None and time.monotonic() > started + max(deadlines[destination[m]] for m in pending):
            break
        for reply in grid.pull_messages(list(pending)):
            phases.setdefault("first_reply", time.perf_counter() - pushed)
            phases["last_reply"] = time.perf_counter() - pushed
            node = destination.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if arrivals is not None:
                arrivals[node] = phases["last_reply"]
            pending.discard(reply.metadata.reply_to_message_id)
            if reply.has_error():
                # SuperLink-made errors (node unavailable) come from node 1: the node is the one the instruction
                # went to.
                errors[node] = reply.error
            else:
                replies.append(reply)
        if pending:
            time.sleep(poll_interval)
    silent = {}
    for message_id in pending:
        node = destination[message_id]
        deadline = deadlines[node] if deadlines is not None else math.inf
        cut = stragglers is not None and deadline < timeout
        silent[node] = (
            stragglers.why(node, half_seconds, deadline)
            if stragglers is not None and cut
            else f"no reply within round-timeout ({timeout:.0f} s)"
        )
        log(WARNING, "node %d: %s; the round goes on without it", node, silent[node])
    return replies, silent, errors


def client_link(grid: Grid, settings: LoopSettings) -> ClientLink:
    """One message to one node and its reply, between rounds (server/forget/: a client's part of its own forget),
    bounded by round-timeout like a round's exchange.

    Args:
        grid: the ServerApp's grid.
        settings: the loop's settings (round-timeout, poll-interval).

    Returns:
        The link: the nodes connected now, and `ask(message)`, the node's reply or why none came (its client's
        error, or no reply within round-timeout).
    """

    def ask(message: Message) -> Message | str:
        node = message.metadata.dst_node_id
        replies, silent, errors = exchange(grid, [message], settings.round_timeout, settings.poll_interval, {})
        if replies:
            return replies[0]
        if node in errors:
            return f"client error: {errors[node].reason}"
        return silent.get(node, "no reply")

    return ClientLink(lambda: set(grid.get_node_ids()), ask)


class PhaseTimer:
    """`with timer("name"):` adds the block's seconds to `timer.seconds["name"]`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def client_phases(replies: list[Message], summary: Callable[[list[float]], float]) -> dict[str, float]:
    """Per phase, `summary` (median, max) over this round's replies of the seconds each client reports
    (client/app.py).

    Args:
        replies: the round's replies.
        summary: reduces one phase's seconds over the replies that report it.

    Returns:
        Phase name -> `summary` of its seconds, by name (none: no reply reports timings).
    """
    reported = [reply_timings(reply.content) for reply in replies if not reply.has_error()]
    names = sorted({name for timings in reported for name in timings})
    return {name: summary([t[name] for t in reported if name in t]) for name in names}


def failure_reasons(report: RoundReport) -> str:
    """Why a round accepted no reply, for RunFailed's message.

    Args:
        report: the round's report.

    Returns:
        Each rejected sender with its reason, or that no client was sent work.
    """
    return "; ".join(f"{who}: {why}" for who, why in report.rejected.items()) or "no client was sent work"


@dataclass
class FinishedRound:
    """What a round leaves for its evaluation, row and checkpoint, taken right after it aggregated: the global
    arrays, the row without its metrics, and the federation's state as the checkpoint must hold it."""

    server_round: int
    arrays: ArrayRecord
    started: float  # time.monotonic() when the round began
    row: dict[str, Any]
    phases: PhaseTimer
    client_phases: dict[str, dict[str, float]]  # the row's client_phase_seconds (medians) and client_phase_max
    state: ServerState


def yield_cpu() -> None:
    """Lowest CPU priority for the calling thread (Linux: a thread's nice value is its own): the pipelined
    evaluation then uses cores the clients leave idle, and never slows down clients training on this machine."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux: the evaluation competes at normal priority
        pass


class RoundFinisher:
    """Evaluates a finished round, then writes its row, then its checkpoint, in round order.

    Pipelined (the default), this runs on one background thread while the next round's clients train: the
    evaluation of round t overlaps round t+1's configure and exchange. `wait()` returns once the previous round
    is finished (and raises what finishing it raised); the loop calls it before it aggregates the next round,
    so the evaluation never sees the strategy change under it, before it stops, and before it raises. What the
    next round's exchange did not hide is the row's `previous_round` phase. Row t is always on disk before
    checkpoint t, and checkpoint t before row t+1, exactly as without pipelining; the numbers are the same
    (tests/component/test_loop.py). The thread runs at the lowest CPU priority (yield_cpu): on a machine whose cores the
    clients keep busy it waits for them rather than slowing them down."""

    def __init__(
        self,
        evaluate: Evaluate,
        results: ResultsLog,
        checkpoints: CheckpointStore,
        clock_start: float,
        num_rounds: int,
        pipelined: bool,
        checkpoint_written: Callable[[ServerState], None],
        sinks: Sequence[RowSink] = (),
        events: EventLog | None = None,
    ) -> None:
        self.evaluate, self.results, self.checkpoints, self.sinks = evaluate, results, checkpoints, sinks
        self.events = events or EventLog()
        # the round core's: clients keep what this checkpoint names; called on the loop's thread only (wait)
        self.checkpoint_written = checkpoint_written
        self.clock_start, self.num_rounds = clock_start, num_rounds
        self.pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluate", initializer=yield_cpu)
            if pipelined
            else None
        )
        self.pending: Future | None = None
        self.checkpoint_seconds: float | None = None  # the previous round's, reported in the next row
        self.outcomes = RoundOutcomes()  # the evaluated accuracies, in round order (the loop adds the failed rounds)

    def submit(self, finished: FinishedRound) -> None:
        """Finish `finished` once the previous round is finished (`wait`): on the background thread when pipelined,
        else at once, its checkpointed state then handed to the round core.

        Args:
            finished: the round just aggregated.

        Raises:
            Exception: what finishing the previous round raised; unpipelined, what finishing this one raised.
        """
        self.wait()
        if self.pool is None:
            self.checkpoint_written(self.finish(finished))
        else:
            self.pending = self.pool.submit(self.finish, finished)

    def wait(self) -> None:
        """Block until the previous round is finished, then hand its checkpointed state to the round core on the
        calling (the loop's) thread.

        Raises:
            Exception: what finishing the previous round raised.
        """
        pending, self.pending = self.pending, None
        if pending is not None:
            self.checkpoint_written(pending.result())

    def collect(self) -> None:
        """Hand the previous round's checkpointed state to the round core if that round is already finished, without
        waiting: the next round's instructions then name the newest checkpoint on disk.

        Raises:
            Exception: what finishing the previous round raised.
        """
        if self.pending is not None and self.pending.done():
            self.wait()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self.pool is not None:
                self.pool.shutdown(wait=True)

    def finish(self, finished: FinishedRound) -> ServerState:
        """Evaluate `finished`, write its row, then its checkpoint.

        Args:
            finished: the round to finish.

        Returns:
            The state the checkpoint holds, for the loop to hand to the round core (`wait`): this thread writes
            nothing of the core's.
        """
        with finished.phases("evaluate"):
            metrics = self.evaluate(finished.arrays, finished.server_round)
        self.outcomes.evaluated(finished.server_round, metrics.get("accuracy"))
        if metrics.get("accuracy") is not None:
            self.events.emit(EVALUATED, finished.server_round, metrics=evaluated_numbers(metrics))
        ended = time.monotonic()
        record = {
            "round": finished.server_round,
            **metrics,
            **finished.row,
            "round_seconds": ended - finished.started,
            "wall_seconds": ended - self.clock_start,
        }
        # Where the round went (server side; the checkpoint is written after the row, so the row carries the
        # previous round's) and the clients' medians (setup, update = decode..encode, state-load/-save).
        record["phase_seconds"] = {**finished.phases.seconds, "previous_checkpoint": self.checkpoint_seconds}
        record.update(finished.client_phases)
        self.results.write(record)
        for sink in self.sinks:  # e.g. run config `tracking` (server/tracking.py)
            sink(record)
        checkpoint_started = time.perf_counter()
        self.checkpoints.save(
            Checkpoint(
                finished.server_round,
                {name: finished.arrays[name].numpy() for name in finished.arrays},
                finished.state,
                record["wall_seconds"],
            )
        )
        self.checkpoint_seconds = time.perf_counter() - checkpoint_started
        log(INFO, progress_line(record, self.num_rounds))
        self.events.emit(CHECKPOINTED, finished.server_round, rounds=self.num_rounds)
        return finished.state


def evaluated_numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The evaluation's numbers (accuracy, nll, ece, the ensemble's, ...), without its reliability bins.

    Args:
        metrics: a round's evaluation (`Evaluate`).

    Returns:
        Its finite int and float values, as floats; booleans, None and everything else left out.
    """
    numbers = {key: value for key, value in metrics.items() if isinstance(value, int | float)}
    return {key: float(value) for key, value in numbers.items() if not isinstance(value, bool) and math.isfinite(value)}


def run_rounds(
    grid: Grid,
    core: RoundCore,
    initial_arrays: ArrayRecord,
    settings: LoopSettings,
    evaluate: Evaluate,
    results_path: str,
    checkpoints: CheckpointStore,
    sinks: Sequence[RowSink] = (),
    events: EventLog | None = None,
) -> ArrayRecord:
    """Rounds 1..num_rounds, or, when the federation has a checkpoint, the rounds after it. Each round:
    configure, exchange, aggregate, then (RoundFinisher, overlapping the next round's training) evaluate, log,
    checkpoint. A crash before the checkpoint means the round runs again on resume; clients then start it from
    their state before it (client/state.py). Forget requests (server/forget/) are settled between rounds, under the
    federation's server lock, which the run holds throughout. `events`: where each step is reported as data
    (tasks/events.py); None: nowhere.

    Args:
        grid: the ServerApp's grid.
        core: the round core, strategy and client bookkeeping (its state is loaded from the checkpoint, if any).
        initial_arrays: the global arrays round 1 starts from, without a checkpoint.
        settings: the loop's settings.
        evaluate: evaluates the global arrays after a round.
        results_path: the results file, one row per round ("": none).
        checkpoints: the federation's checkpoint store; its folder holds the server lock.
        sinks: each gets every results row as it is written.
        events: where each step is reported.

    Returns:
        The global arrays after the last round (the checkpoint's, for a federation that already finished).

    Raises:
        RunFailed: max-failed-rounds rounds in a row accepted no reply, or the run ended badly
            (`run_outcome_problem`).
        TimeoutError: too few clients connected within wait-for-clients-timeout.
        CheckpointError: the checkpoint to resume from is damaged or was made with other settings.
        ConfigError: a new federation's results file is not empty and results-exists is refuse.
    """
    with server_lock(checkpoints.directory):
        return _run_rounds(
            grid, core, initial_arrays, settings, evaluate, results_path, checkpoints, sinks, events or EventLog()
        )


def _run_rounds(
    grid: Grid,
    core: RoundCore,
    initial_arrays: ArrayRecord,
    settings: LoopSettings,
    evaluate: Evaluate,
    results_path: str,
    checkpoints: CheckpointStore,
    sinks: Sequence[RowSink],
    events: EventLog,
) -> ArrayRecord:
    shorten_pull_backoff()  # replies are pulled while their SuperNodes still upload them (flowerseam/object_pulls.py)
    bound_reply_pulls(grid, settings.max_payload_mb)  # an oversize reply is refused while it is pulled
    check_only_own_messages(
        grid
    )  # under Flower's simulation engine: its instruction polls (flowerseam/simulation_polls.py)
    arrays, first_round, elapsed = initial_arrays, 1, 0.0
    forgetting = Forgetting(checkpoints, client_link(grid, settings), forgotten_event(events))
    checkpoint = checkpoints.load()
    if checkpoint is not None:
        arrays = ArrayRecord({name: Array(value) for name, value in checkpoint.arrays.items()})
        core.load_state_dict(checkpoint.strategy_state)
        first_round, elapsed = checkpoint.server_round + 1, checkpoint.wall_seconds
        # requests made while it was stopped; a forget's refinement rounds raise num-server-rounds
        arrays = forgetting.settle_records(core, arrays, checkpoint.server_round, elapsed)
        settings = replace(settings, num_rounds=forgetting.rounds_to_run(core, settings.num_rounds))
        log(
            INFO,
            "resuming after round %d from %s",
            checkpoint.server_round,
            checkpoints.round_path(checkpoint.server_round),
        )
        if first_round > settings.num_rounds:
            log(
                INFO,
                "the federation already finished its %d rounds; nothing to do (a new `federation` name starts over)",
                settings.num_rounds,
            )
            return arrays
        checkpoints.drop_rounds_after(checkpoint.server_round)  # resume-from-round: they run again, like their rows
    results = ResultsLog(
        results_path,
        keep_through_round=first_round - 1,
        if_exists=settings.results_exists,
        start_record=checkpoints.directory / RESULTS_START,
    )
    wait_for_clients(grid, settings.wait_for_clients, settings.wait_for_clients_timeout, settings.poll_interval)
    finisher = RoundFinisher(
        evaluate,
        results,
        checkpoints,
        time.monotonic() - elapsed,
        settings.num_rounds,
        settings.pipeline_evaluation,
        core.checkpoint_written,
        sinks,
        events,
    )
    outcomes = finisher.outcomes
    stragglers = Stragglers(settings.straggler_wait, core.examples_of)
    try:
        for server_round in range(first_round, settings.num_rounds + 1):
            finished, outcome = train_round(grid, core, arrays, settings, server_round, finisher, stragglers, events)
            report = outcome.report
            arrays = finished.arrays
            finisher.submit(finished)
            # between rounds: once this one is checkpointed, before the next starts
            if forgetting.has_work(outcome.leave_requests):
                finisher.wait()
                arrays = forgetting.settle_records(
                    core, arrays, server_round, time.monotonic() - finisher.clock_start, outcome.leave_requests
                )
            outcomes.round_trained(server_round, finished.row["clients"])
            if outcomes.failed_rounds >= settings.max_failed_rounds:
                finisher.wait()  # the failed rounds are on record before the run stops
                raise RunFailed(
                    f"{outcomes.failed_rounds} rounds in a row (max-failed-rounds) accepted no client reply "
                    f"({outcomes.failed_span()}); the run stopped after round {server_round} of "
                    f"{settings.num_rounds}; last round: {failure_reasons(report)}"
                )
        finisher.wait()  # the last round's evaluation is in `outcomes`
        if problem := run_outcome_problem(outcomes, settings.num_rounds - first_round + 1):
            last = f"; last round: {failure_reasons(report)}" if outcomes.failed_rounds else ""
            raise RunFailed(f"{problem}{last}")
    finally:
        finisher.close()
    return arrays


def train_round(
    grid: Grid,
    core: RoundCore,
    arrays: ArrayRecord,
    settings: LoopSettings,
    server_round: int,
    finisher: RoundFinisher,
    stragglers: Stragglers,
    events: EventLog,
) -> tuple[FinishedRound, RoundOutcome]:
    """Configure, exchange and aggregate one round; the previous round is finished (evaluated, logged,
    checkpointed) meanwhile, and before this one aggregates. Returns the finished round and the aggregate's outcome
    (its report, and the leave requests that forgetting decides once the round is committed).

    Args:
        grid: the ServerApp's grid.
        core: the round core.
        arrays: the global arrays the round starts from.
        settings: the loop's settings.
        server_round: the round.
        finisher: finishes the previous round meanwhile.
        stragglers: the straggler policy.
        events: where the round's steps are reported.

    Returns:
        The finished round (its arrays: the aggregate's, or `arrays` when no update was usable; its row without
        metrics; the state to checkpoint) and the aggregate's outcome.

    Raises:
        TimeoutError: fewer than min-clients connected within wait-for-clients-timeout.
        PayloadError: an instruction is over max-payload-mb.
        Exception: what finishing the previous round raised.
    """
    round_started = time.monotonic()
    events.emit(ROUND_STARTED, server_round, rounds=settings.num_rounds)
    phases = PhaseTimer()
    with phases("wait_clients"):
        wait_for_clients(grid, settings.min_clients, settings.wait_for_clients_timeout, settings.poll_interval)
    finisher.collect()  # a previous round already checkpointed: its accepted rounds go in this round's headers
    with phases("configure"):
        plan = core.configure(server_round, arrays, grid)
    for message in plan.messages:  # too big for the clients' limit: every one of them would refuse it
        check_payload_size(message.content, settings.max_payload_mb, sender=f"round {server_round} instruction")
    arrivals: dict[int, float] = {}
    replies, silent, errors = exchange(
        grid,
        plan.messages,
        settings.round_timeout,
        settings.poll_interval,
        phases.seconds,
        stragglers,
        arrivals,
    )
    events.emit(REPLIES, server_round, sent=len(plan.messages), replies=len(replies), silent=len(silent))
    with phases("previous_round"):  # the part of the previous round's evaluation the exchange did not hide
        finisher.wait()
    with phases("aggregate"):
        outcome = core.aggregate(plan, replies, errors, silent)
    if outcome.arrays is None:
        log(WARNING, "round %d: no usable client update; the global model is unchanged", server_round)
    report = outcome.report
    for label, reason in report.rejected.items():
        events.emit(REFUSED, server_round, client=label, reason=reason)
    events.emit(COMMITTED, server_round, clients=len(report.accepted), clients_sent=report.sent)
    row = {
        "clients": len(report.accepted),
        "clients_sent": report.sent,
        "clients_rejected": len(report.rejected),
        "rejected": dict(report.rejected),  # who was left out, and why
        "fresh_starts": list(report.fresh_starts),  # accepted clients that had lost their state and started afresh
        "quarantined": sorted(report.quarantined),  # nodes that sit out the next round (server/isolation.py)
        "warnings": list(report.warnings),  # what the strategy warned of (e.g. BayesADMM's collapsing precision)
        **client_metrics_row(report.client_metrics),  # the clients' held-out metrics (client-eval-fraction)
        # seconds from the push to each answer, by client id (node id where the node's client is not known)
        "reply_seconds": {
            core.identities.client_of(node) or f"node {node}": round(seconds, 3) for node, seconds in arrivals.items()
        },
        # the strategy's round metrics (round_metrics: train-loss, compute-seconds, and its own, e.g. K)
        "train_loss": None,
        "client_compute_seconds": None,
        "known_clients": None,
        **{ROW_KEYS.get(key, key.replace("-", "_")): value for key, value in (outcome.metrics or {}).items()},
    }
    # the slowest client's phases too: its `update` bounds the round
    client = {
        "client_phase_seconds": client_phases(replies, statistics.median),
        "client_phase_max": client_phases(replies, max),
    }
    finished = FinishedRound(
        server_round,
        outcome.arrays if outcome.arrays is not None else arrays,
        round_started,
        row,
        phases,
        client,
        core.state_dict(),
    )
    return finished, outcome


def forgotten_event(events: EventLog) -> Callable[[Mapping[str, Any]], None]:
    """What reports each forget audit record (server/forget/) that forgot a client, as a `forgotten` event.

    Args:
        events: where the events go.

    Returns:
        The audit log's `on_append`: a `forgotten` event for a "forgotten" record, nothing for another.
    """

    def report(record: Mapping[str, Any]) -> None:
        if record.get("event") == "forgotten":
            refine = record.get("refine_through_round")
            events.emit(
                FORGOTTEN,
                record["round"],
                client=str(record["client"]),
                request=str(record["request"]),
                refine_through_round=refine if type(refine) is int else None,
            )

    return report


def progress_line(record: dict[str, Any], num_rounds: int) -> str:
    """The round's log line, for people (the tools read the event stream, tasks/events.py). A round the server did
    not evaluate (run config `eval-every`) shows `-` for its metrics; one evaluated on part of the test set
    (`eval-fraction`) says on how much.

    Args:
        record: the round's results row.
        num_rounds: the run's rounds.

    Returns:
        One line: round, accuracy, NLL, ECE, clients accepted of those sent, seconds; then the ensemble's accuracy
        and NLL where evaluated, and the test examples under eval-fraction.
    """
    metrics = (
        "acc - | nll - | ece -"
        if record["accuracy"] is None
        else (f"acc {record['accuracy']:.4f} | nll {record['nll']:.4f} | ece {record['ece']:.4f}")
    )
    line = (
        f"round {record['round']:>3}/{num_rounds} | {metrics} | clients {record['clients']}/{record['clients_sent']} "
        f"| {record['round_seconds']:.1f} s"
    )
    if "accuracy_ensemble" in record:
        line += f" | ensemble acc {record['accuracy_ensemble']:.4f} nll {record['nll_ensemble']:.4f}"
    if 0 < record.get("eval_fraction", 1.0) < 1:
        line += f" | on {record['eval_examples']} test examples (eval-fraction)"
    return line
