"""The progress line of `fedbayes local` and `fedbayes run` (deploy/progress.py): on a terminal (a pty, rendered as a
terminal shows it) one line redrawn in place below the output; elsewhere plain lines. `fedbayes run` reads the rounds
from the ServerApp's event lines (tasks/events.py) and shows its other lines; `fedbayes local` from its results rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from fedbayes.deploy.launcher import TABLE_HEADER
from fedbayes.server.loop import progress_line
from fedbayes.tasks.events import (
    CHECKPOINTED,
    COMMITTED,
    COMPLETED,
    EVALUATED,
    EVENTS_FILE,
    LOG_PREFIX,
    REPLIES,
    ROUND_STARTED,
    RUN_ENDED,
    RUN_STARTED,
    Event,
    read_events,
)
from tests.support import ROOT
from tests.support.processes import cli_env
from tests.support.terminal import ROW, open_terminal, read_all, rendered

# A stand-in for `flwr run --stream`: the ServerApp's log lines of a two-round run, a round every 1.5 s (the lines
# made here: importing the ServerApp's loop would cost the stand-in torch's import, 4 CPU-s): each round's events,
# with the line people read before the last.
ROUND_LINES = [f"INFO :      {progress_line(ROW | {'round': number}, 2)}" for number in (1, 2)]


def event_line(event: Event) -> str:
    return f"INFO :      {LOG_PREFIX}{event.json_line()}"


def round_lines(server_round: int, round_line: str) -> list[str]:
    return [
        event_line(Event(COMMITTED, server_round, 1.0, {"clients": 2, "clients_sent": 3})),
        event_line(Event(EVALUATED, server_round, 2.0, {"metrics": {"accuracy": 0.6356, "nll": 1.0, "ece": 0.1}})),
        round_line,
        event_line(Event(CHECKPOINTED, server_round, 3.0, {"rounds": 2})),
    ]


LOGGED = [round_lines(number, line) for number, line in zip((1, 2), ROUND_LINES, strict=True)]
FAKE_FLWR = textwrap.dedent("""
    import time
    print("Successfully started run 7", flush=True)
    for lines in {LOGGED!r}:
        time.sleep(1.5)
        print("\\n".join(lines), flush=True)
""")
STREAM = (
    "import os, sys; from fedbayes.deploy.flwr_run import stream; "
    "stream([sys.executable, '-c', {fake!r}], os.environ, ['fedbayes', 'run'])"
)


def run_stream(stdout) -> subprocess.Popen:
    """deploy/flwr_run.py `stream`, as `fedbayes run` calls it, on the fake `flwr run`'s output."""
    code = STREAM.format(fake=FAKE_FLWR.format(LOGGED=LOGGED))
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.STDOUT,
    )


def test_fedbayes_run_shows_a_live_line_on_a_terminal():
    master, slave = open_terminal()
    process = run_stream(slave)
    os.close(slave)
    output = read_all(master)
    assert process.wait(timeout=60) == 0, output
    screen = rendered(output)
    assert screen[0] == "Successfully started run 7"
    assert [line for line in screen if "round   " in line] == ROUND_LINES
    assert re.fullmatch(r"round 2/2 \| \d+:\d\d elapsed \| ETA 0:00 \| accuracy 0.6356 \| clients 2/3", screen[-1])
    # redrawn while waiting: the elapsed time ticks between the rounds, in place
    assert "0:01 elapsed | waiting for the first round" in output and "0:02 elapsed" in output
    assert len(screen) == 4


def test_fedbayes_run_prints_plain_lines_elsewhere():
    process = run_stream(subprocess.PIPE)
    output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 0, output
    assert "\r" not in output and "\x1b" not in output
    lines = output.splitlines()
    assert [line.split(" | ")[0] for line in lines if line.startswith("progress:")] == [
        "progress: round 1/2",
        "progress: round 2/2",
    ]
    assert lines[-1].endswith("| ETA 0:00 | accuracy 0.6356 | clients 2/3")


@pytest.mark.integration
def test_fedbayes_local_shows_the_table_and_a_live_line_on_a_terminal(tmp_path):
    """A real federation (2 clients, 2 rounds of logistic regression on 2% of Fashion-MNIST) on a terminal."""
    master, slave = open_terminal()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedbayes.deploy.cli",
            "local",
            "--strategy",
            "fedavg",
            "--clients",
            "2",
            "--rounds",
            "2",
            "--fraction",
            "0.02",
            "--set",
            "model=logreg",
            "--workdir",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.STDOUT,
    )
    os.close(slave)
    output = read_all(master)
    assert process.wait(timeout=600) == 0, output
    screen = rendered(output)
    header = screen.index(TABLE_HEADER)
    assert [line.split()[0] for line in screen[header + 1 : header + 3]] == ["1", "2"]  # the table's rows
    assert screen[header + 3].startswith("round 2/2 | ") and "| ETA 0:00 | accuracy 0." in screen[header + 3]
    assert screen[header + 3].endswith("| clients 2/2") and len(screen) == header + 4
    assert "\r\x1b[K" in output
    assert LOG_PREFIX not in output  # the ServerApp's event lines are read, not shown
    # the ServerApp's event stream of the run, in its server state directory
    events = [event for _, event in read_events(tmp_path / "run" / "server-state" / "run" / EVENTS_FILE)]
    assert [(event.type, event.round) for event in events if event.round is None] == [
        (RUN_STARTED, None),
        (RUN_ENDED, None),
    ]
    assert events[0].fields == {"federation": "run", "named_by_server": False, "strategy": "fedavg", "rounds": 2}
    assert events[-1].fields == {"outcome": COMPLETED, "reason": None}
    for server_round in (1, 2):
        assert [event.type for event in events if event.round == server_round] == [
            ROUND_STARTED,
            REPLIES,
            COMMITTED,
            EVALUATED,
            CHECKPOINTED,
        ]
    assert {event.fields["clients"] for event in events if event.type == COMMITTED} == {2}
