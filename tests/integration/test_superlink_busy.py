"""A SuperLink whose database stays locked past Flower's 5 s busy timeout (a loaded machine did it in CI) loses
nothing: `fedbayes superlink` waits longer for the lock (deploy/superlink.py). Real processes over loopback with TLS
(the SuperLink then keeps its state in a SQLite file); the test holds that file's lock for 8 s while a client holds
round 2 open and the ServerApp polls. With Flower's 5 s, the same run answered those polls and the other client's
object pulls with "database is locked": that client's round-2 instruction was dropped, and the ServerApp's log
uploader stopped, so `flwr run --stream` showed no line after round 1.

A log stream that still ends early (`fedbayes run` follows it again, deploy/flwr_run.py) is followed through Flower's
`flwr log RUN_ID --stream`, which starts the log again from its first line: followed on this real SuperLink from round
1's line on, it shows what `flwr run --stream` showed after that line (but for the ServerApp's event lines, which it
reads and does not show), and nothing twice."""

from __future__ import annotations

import sqlite3
import subprocess
import time

import pytest

from fedbayes.deploy.flwr_run import _ANSI_ESCAPE, Streamed, stream
from fedbayes.deploy.launcher import CONNECTION, LocalFederation
from fedbayes.deploy.pki import init_pki
from fedbayes.deploy.processes import console_script
from fedbayes.tasks.events import event_of_log_line
from tests.support.processes import processes_of, stall_env, wait_for_file

pytestmark = pytest.mark.integration

LOCK_SECONDS = 8.0  # Flower 1.39's SQLite busy_timeout is 5 s


def test_a_superlink_locked_past_its_busy_timeout_does_not_end_the_run(tmp_path, capsys):
    workdir, results = tmp_path / "fed", tmp_path / "results.jsonl"
    marker, release = tmp_path / "stalled", tmp_path / "release"
    config = {
        "strategy": "bayesadmm",  # a strategy with client state: the stall fault holds its load
        "num-server-rounds": 3,
        "federation": "busy",
        "fraction": 0.02,
        "local-epochs": 1,
        "model": "logreg",
        "results-path": str(results),
        "wait-for-clients": 2,
        "round-timeout": 120.0,
        "straggler-wait": 0.0,  # round 2 waits for the held client through the lock
    }
    with LocalFederation(workdir, tls=init_pki(tmp_path / "pki", ips=["127.0.0.1"])) as federation:
        federation.start_supernode(0, 2)
        federation.start_supernode(1, 2, extra_env=stall_env("2", marker, release))
        submit = federation.submit(config)

        def lock_while_round_2_waits(row):
            if row["round"] != 1:
                return
            wait_for_file(marker.with_name(f"{marker.name}-r2"), "client-1 never reached round 2")
            database = sqlite3.connect(workdir / "superlink.db", isolation_level=None, timeout=30)
            database.execute("BEGIN EXCLUSIVE")
            time.sleep(LOCK_SECONDS)
            database.execute("COMMIT")
            database.close()
            release.with_name(f"{release.name}-r2").touch()

        rows = federation.follow(results, submit, 3, on_row=lock_while_round_2_waits)
        server_log = (federation.log_dir / "flwr-run.log").read_text()
        # `fedbayes run`'s own progress lines are not the run's log
        streamed = [line for line in server_log.splitlines() if not line.startswith("progress: ")]
        log_lines = streamed[next(i for i, line in enumerate(streamed) if "Starting logstream" in line) + 1 :]
        # the run's whole log, event lines with the rest: a stream followed again skips lines of it
        follow_log = [console_script("flwr"), "log", str(federation.run_id(submit)), CONNECTION, "--stream"]
        replayed = subprocess.run(
            follow_log,
            env=federation.processes.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # as `stream` reads it
            text=True,
            timeout=120,
        ).stdout.splitlines()
        raw = [_ANSI_ESCAPE.sub("", line) for line in replayed]
        raw = raw[next(i for i, line in enumerate(raw) if "Starting logstream" in line) + 1 :]
        round_1 = next(i for i, line in enumerate(raw) if "round 1: 2 replies" in line) + 1
        capsys.readouterr()
        followed = stream(
            follow_log,
            federation.processes.env,
            ["fedbayes", "run"],
            shown=Streamed(0, federation.run_id(submit), None, round_1),
        )
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert [row["clients"] for row in rows] == [2, 2, 2], "round 2 waited for both clients through the lock"
    superlink_log = (federation.log_dir / "superlink.log").read_text()
    assert "database is locked" not in superlink_log, superlink_log[-3000:]
    for number in (1, 2, 3):  # the ServerApp's log reached `flwr run --stream` after the lock as before it
        assert server_log.count(f"round {number}: 2 replies pass the checks") == 1, server_log[-3000:]
    assert [line for line in raw if event_of_log_line(line) is None] == log_lines  # what `fedbayes run` showed
    assert followed.returncode == 0 and followed.log_lines == len(raw)
    shown_again = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("progress: ")]
    assert shown_again == [line for line in raw[round_1:] if event_of_log_line(line) is None]
    shown_text = "\n".join(shown_again)
    assert "round 1: 2 replies" not in shown_text and "round 2: 2 replies" in shown_text
    assert processes_of(federation.flwr_home) == []
