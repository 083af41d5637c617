"""`fedbayes local` over real processes: every way a run fails ends it non-zero with the reason on one line,
and a federation interrupted is continued, explicitly, from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from fedbayes.deploy.processes import is_serverapp
from fedbayes.tasks.runlog import RunFailed
from tests.support.processes import (
    cli_env,
    fault_env,
    fedbayes,
    is_table_row,
    processes_with_env,
    read_until,
    run_loopback,
    start_fedbayes,
    wait_for_file,
)

pytestmark = pytest.mark.integration
LOCAL = ["local", "--strategy", "fedavg", "--clients", "2", "--fraction", "0.05"]


def processes_of(workdir: Path) -> list[int]:
    return processes_with_env("FLWR_HOME", str(workdir / "flwr-home"))


def rounds_in(results: Path) -> list[int]:
    return [json.loads(line)["round"] for line in results.read_text().splitlines()]


def test_every_client_failing_ends_the_run_non_zero_with_their_reason(tmp_path):
    """Every ClientApp raises; after `max-failed-rounds` (3) rounds without an accepted reply the ServerApp
    stops the run, and `fedbayes local` says why on its last line."""
    workdir = tmp_path / "fed"
    result = fedbayes([*LOCAL, "--rounds", "10", "--workdir", str(workdir)], env=cli_env(**fault_env("raise")))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith("fedbayes run failed: "), result.stderr
    assert "injected fault: this client cannot train" in result.last_error_line
    assert "0/2" in result.stdout  # the rounds that did run show no accepted client
    assert processes_of(workdir) == []


def test_a_killed_serverapp_ends_the_run_non_zero_at_once(tmp_path):
    workdir = tmp_path / "fed"
    launcher = start_fedbayes([*LOCAL, "--rounds", "20", "--workdir", str(workdir)])
    read_until(launcher, is_table_row(1))
    serverapps = [pid for pid in processes_of(workdir) if is_serverapp(pid)]
    assert len(serverapps) == 1, serverapps
    os.kill(serverapps[0], signal.SIGKILL)
    killed = time.monotonic()
    output = launcher.communicate(timeout=120)[0]
    print(f"`fedbayes local` ended {time.monotonic() - killed:.1f} s after the ServerApp's SIGKILL")
    assert launcher.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("fedbayes run failed: the ServerApp of run") and "died without reporting" in last, output
    assert processes_of(workdir) == []


def test_a_config_the_serverapp_refuses_fails_the_run_with_its_reason(tmp_path):
    """Submitted past the launcher's checks, a bad model spec is refused by the ServerApp's own preflight,
    and the reason comes back as one line with the exception's type."""
    workdir = tmp_path / "fed"
    config = {
        "strategy": "fedavg",
        "num-server-rounds": 1,
        "fraction": 0.05,
        "hidden": "abc",
        "results-path": str(workdir / "results.jsonl"),
        "federation": "bad",
        "wait-for-clients": 2,
    }
    with pytest.raises(RunFailed, match=r"^fedbayes run failed: ConfigError: run config 'hidden': hidden must be"):
        run_loopback(workdir, config, rounds=1)
    assert processes_of(workdir) == []


def test_a_new_federation_leaves_a_results_file_it_finds_as_it_is(tmp_path):
    """Submitted past the launcher's checks, with a federation name (so the ServerApp's preflight cannot tell a new
    federation from a resume), a new federation whose results-path holds rows is refused where it would have
    rewritten them (server/loop.py ResultsLog), and the file is kept."""
    workdir = tmp_path / "fed"
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 1, "mine": true}\n')
    config = {
        "strategy": "fedavg",
        "num-server-rounds": 1,
        "fraction": 0.05,
        "results-path": str(results),
        "federation": "new",
        "wait-for-clients": 2,
    }
    with pytest.raises(
        RunFailed,
        match=r"^fedbayes run failed: ConfigError: run config 'results-path': .* is not "
        r"empty and results-exists is 'refuse'",
    ):
        run_loopback(workdir, config, rounds=1)
    assert results.read_text() == '{"round": 1, "mine": true}\n'
    assert processes_of(workdir) == []


@pytest.mark.timeout(1200)  # two federations in a row
def test_an_interrupted_federation_is_resumed_only_when_asked(tmp_path):
    workdir = tmp_path / "fed"
    command = [*LOCAL, "--rounds", "3", "--workdir", str(workdir)]
    launcher = start_fedbayes(command)
    started = read_until(launcher, is_table_row(1))
    resume_hint = next(line for line in started if "to resume it after an interruption:" in line)
    assert resume_hint.rstrip().endswith(f"fedbayes local --resume {workdir}")  # its run file says the rest
    # Round 1's row is written before its checkpoint; stopped between the two, the resume would start over
    # (tests/component/test_preflight.py covers that), so stop it once there is a round to resume after.
    # `fedbayes local` names the federation after its workdir and keeps its server state there.
    wait_for_file(workdir / "server-state" / "fed" / "checkpoint-1.safetensors", "round 1 was never checkpointed")
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == 143
    assert processes_of(workdir) == []
    assert 1 <= len(rounds_in(workdir / "results.jsonl")) < 3

    refused = fedbayes(command)
    assert refused.returncode == 1 and "add --resume to continue it" in refused.last_error_line

    resumed = fedbayes([*command, "--resume"])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after round" in (workdir / "logs-2" / "flwr-run.log").read_text()
    assert (workdir / "logs" / "flwr-run.log").is_file(), "the interrupted start's logs are kept"
    assert rounds_in(workdir / "results.jsonl") == [1, 2, 3]
    assert processes_of(workdir) == []
