"""The progress line of `fedbayes local` and `fedbayes run` (deploy/progress.py): on a terminal (a pty, rendered as a
terminal shows it) one line redrawn in place below the output; elsewhere plain lines. `fedbayes run` reads the rounds
from the ServerApp's events (tasks/events.py); `fedbayes local` from its results rows."""

from __future__ import annotations

import io
import os

from fedbayes.deploy.launcher import (
    LEFT_OUT_REASON_CHARS,
    TABLE_HEADER,
    RoundTable,
    format_row,
    show_row,
    table_header,
)
from fedbayes.deploy.progress import Progress, RoundDone, RoundEvents
from fedbayes.tasks.events import CHECKPOINTED, COMMITTED, EVALUATED, REFUSED, Event
from tests.support.terminal import ROW, open_terminal, read_all, rendered


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_on_a_terminal_the_line_is_redrawn_in_place_below_the_output():
    master, slave = open_terminal()
    clock = Clock()
    with os.fdopen(slave, "w") as terminal:
        with Progress(terminal, clock) as progress:
            progress.print(TABLE_HEADER)
            clock.now += 10
            show_row(progress, ROW, 4)
            clock.now += 10
            show_row(progress, ROW | {"round": 2, "accuracy": 0.7038, "clients": 3}, 4)
            clock.now += 5  # between rounds the ETA counts down
    output = read_all(master)
    assert "\r\x1b[K" in output
    assert rendered(output) == [
        TABLE_HEADER,
        format_row(ROW),
        format_row(ROW | {"round": 2, "accuracy": 0.7038, "clients": 3}),
        # 10 s per round (rounds 1 -> 2), 2 rounds left, 5 s since round 2 ended
        "round 2/4 | 0:25 elapsed | ETA 0:15 | accuracy 0.7038 | clients 3/3",
    ]


def test_the_live_line_fits_the_terminal():
    master, slave = open_terminal(columns=30)
    with os.fdopen(slave, "w") as terminal:
        with Progress(terminal) as progress:
            progress.round_done(RoundDone(3, 10, 0.5, 1, 2))
    line = rendered(read_all(master))[-1]
    assert len(line) == 29 and "round 3/10 | 0:00 elapsed | ETA".startswith(line)  # never wraps


def test_elsewhere_each_round_adds_a_plain_line():
    stream, clock = io.StringIO(), Clock()
    with Progress(stream, clock) as progress:
        assert progress.ticker is None  # nothing redraws
        clock.now += 12
        show_row(progress, ROW, 3)
        clock.now += 8
        show_row(progress, ROW | {"round": 2}, 3)
    assert stream.getvalue() == (
        f"{format_row(ROW)}\n"
        "progress: round 1/3 | 0:12 elapsed | ETA 0:24 | accuracy 0.6356 | clients 2/3\n"
        f"{format_row(ROW | {'round': 2})}\n"
        "progress: round 2/3 | 0:20 elapsed | ETA 0:08 | accuracy 0.6356 | clients 2/3\n"
    )


def test_a_rounds_warnings_follow_its_row():
    stream, clock = io.StringIO(), Clock()
    with Progress(stream, clock) as progress:
        show_row(progress, ROW | {"warnings": ["the clients added 0.0% to q̄'s precision"]}, 3)
    assert stream.getvalue().splitlines()[:2] == [format_row(ROW), "  warning: the clients added 0.0% to q̄'s precision"]


def test_a_round_is_done_once_checkpointed_with_its_commit_and_evaluation():
    rounds = RoundEvents()
    events = [
        Event(COMMITTED, 1, 1.0, {"clients": 2, "clients_sent": 3}),
        Event(REFUSED, 1, 1.0, {"client": "node 7", "reason": "no reply"}),
        Event(EVALUATED, 1, 2.0, {"metrics": {"accuracy": 0.6356, "nll": 1.1}}),
        Event(CHECKPOINTED, 1, 3.0, {"rounds": 50}),
        Event(COMMITTED, 2, 4.0, {"clients": 3, "clients_sent": 3}),
        Event(CHECKPOINTED, 2, 5.0, {"rounds": 50}),  # not evaluated (eval-every)
    ]
    assert [rounds.feed(event) for event in events] == [
        None,
        None,
        None,
        RoundDone(1, 50, 0.6356, 2, 3),
        None,
        RoundDone(2, 50, None, 3, 3),
    ]


# A stand-in for `flwr run --stream`: the ServerApp's log lines of a two-round run, a round every 1.5 s.


def test_the_table_has_the_ensembles_columns_where_the_rows_have_its_metrics():
    """A Bayesian strategy's rows carry `*_ensemble` metrics: the header, printed with the first row, names them, and
    each value ends where its heading does."""
    bayesian = ROW | {"accuracy_ensemble": 0.7012, "nll_ensemble": 0.9, "ece_ensemble": 0.05}
    header, line = RoundTable().lines(bayesian)
    assert header == table_header(ensemble=True) and header.startswith(TABLE_HEADER.split("  clients")[0])
    for heading, value in (("ens_acc", "0.7012"), ("ens_nll", "0.9000"), ("ens_ece", "0.0500"), ("clients", "2/3")):
        assert line.index(value) + len(value) == header.index(heading) + len(heading), (heading, header, line)
    assert RoundTable().lines(ROW) == [TABLE_HEADER, format_row(ROW)]  # a point estimate's: no ensemble columns


def test_the_header_comes_again_with_the_ensembles_columns_after_a_first_round_not_evaluated():
    table = RoundTable()
    not_evaluated = ROW | {"accuracy": None, "nll": None, "ece": None}
    assert table.lines(not_evaluated) == [TABLE_HEADER, format_row(not_evaluated)]
    evaluated = ROW | {"round": 2, "accuracy_ensemble": 0.7, "nll_ensemble": 0.9, "ece_ensemble": 0.05}
    header, line = table.lines(evaluated)
    assert header == table_header(ensemble=True) and line.split()[4:7] == ["0.7000", "0.9000", "0.0500"]
    third = ROW | {"round": 3, "accuracy": None, "nll": None, "ece": None}
    assert table.lines(third) == [format_row(third, ensemble=True)]  # no header again; `-` in every metric column
    assert format_row(third, ensemble=True).split()[1:7] == ["-"] * 6


def test_a_row_says_which_clients_the_round_left_out_and_why():
    long = "rejected reply: " + "x" * 300
    row = ROW | {
        "rejected": {
            "client 'client-2' (node 4021)": "rejected reply: field 'local_mean/1.weight': contains NaN or Inf",
            "node 17": long,
        }
    }
    line = format_row(row)
    assert line.startswith(format_row(ROW) + "  (2 left out: client-2: rejected reply: field 'local_mean/1.weight': ")
    assert line.endswith(f"; node 17: {long[: LEFT_OUT_REASON_CHARS - 3]}...)")
    assert format_row(ROW | {"rejected": {}}) == format_row(ROW)
