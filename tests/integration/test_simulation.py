"""The README's simulation command (Flower's Ray engine, 20 virtual clients) through `fedbayes run`: every
run that names no federation is a new one, the command it prints resumes it, a refused resume fails the command
with the reason on one line, and nothing it started is left running."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fedbayes.deploy.processes import command_line
from tests.support import ROOT
from tests.support.processes import cli_env, fedbayes, processes_with_env, read_until, wait_for_file

pytestmark = pytest.mark.integration


def readme_command(section: str) -> str:
    """The shell commands of the first ```sh block after README heading `section`."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index(f"\n{section}\n") :]
    return re.search(r"```sh\n(.*?)```", after, re.DOTALL).group(1)


def simulation_command(runs: Path) -> str:
    """The README's simulation command, with its runs/ folder in `runs` (the venv is already ours)."""
    command = readme_command("### Simulation (Ray, many virtual clients)")
    command = command.replace(". .venv/bin/activate\n", "").replace("$PWD/runs", str(runs))
    assert command.count("fedbayes run ") == 1 and str(runs) in command, command
    return command.strip()


def run_shell(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=simulation_env(tmp_path), capture_output=True, text=True, timeout=600
    )


def simulation_env(tmp_path: Path) -> dict[str, str]:
    return cli_env(FEDBAYES_SERVER_STATE_DIR=str(tmp_path / "server-state"))


def processes_of(flwr_home: Path) -> list[str]:
    """The command lines of live processes that run with this Flower home."""
    return [" ".join(command_line(pid)) for pid in processes_with_env("FLWR_HOME", str(flwr_home))]


def rounds_in(results: Path) -> list[int]:
    return [json.loads(line)["round"] for line in results.read_text().splitlines()]


RESUME_HINT = re.compile(r"^fedbayes: federation (\S+); to resume it after an interruption: (.+)$", re.MULTILINE)


@pytest.mark.timeout(1200)  # four simulations in a row; on a loaded 2-core machine each can take minutes
def test_a_run_resumes_with_the_command_it_printed_and_the_readme_command_with_other_settings_starts_anew(tmp_path):
    """The README command is a new federation that prints the command resuming it. Killed after round 1, that
    command with other settings is refused (the reason on one line), as printed it resumes. The README command with
    other settings then trains a new federation (issue 19: it used to fail on the first one's checkpoint, or do
    nothing, and exit 0)."""
    runs = tmp_path / "runs"
    command = simulation_command(runs).replace("num-server-rounds=5", "num-server-rounds=3")
    # exec: the signal below goes to `fedbayes run` itself, as a Ctrl-C or `kill` would
    interrupted = subprocess.Popen(
        ["bash", "-c", command.replace("fedbayes run ", "exec fedbayes run ")],
        cwd=ROOT,
        env=simulation_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = "".join(read_until(interrupted, lambda line: "round   1/3 |" in line))
    (federation, resume_command), *_ = RESUME_HINT.findall(output)
    assert f'new federation "{federation}"' in output and resume_command.endswith(f"-c 'federation=\"{federation}\"'")
    # Round 1's row comes before its checkpoint; stopped between them the federation would start over (no
    # checkpoint to refuse or resume from), so stop it once round 1's checkpoint is on disk.
    wait_for_file(tmp_path / "server-state" / federation / "checkpoint-1.safetensors", "round 1 was never checkpointed")
    interrupted.send_signal(signal.SIGTERM)
    assert interrupted.wait(timeout=120) == 143
    assert processes_of(runs / "sim-home") == [], "the simulation SuperLink and Ray must be stopped"

    home_export = command[: command.index("\n") + 1]  # the README's `export FLWR_HOME=...` line
    refused = run_shell(f"{home_export}{resume_command} -c 'model=\"logreg\"'", tmp_path)
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("fedbayes run failed: CheckpointError: federation checkpoint")
        and "(model: 'mlp' -> 'logreg')" in last
    ), refused.stderr[-3000:]
    assert processes_of(runs / "sim-home") == []

    resumed = run_shell(f"{home_export}{resume_command}", tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert re.search(r"resuming after round [12] ", resumed.stdout), resumed.stdout[-3000:]
    assert rounds_in(runs / "sim.jsonl") == [1, 2, 3]
    assert processes_of(runs / "sim-home") == []

    other = run_shell(
        f"{command.replace('num-server-rounds=3', 'num-server-rounds=2')} -c 'model=\"logreg\" fraction-train=0.1'",
        tmp_path,
    )
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    (new_federation, _), *_ = RESUME_HINT.findall(other.stdout)
    assert new_federation != federation and f'new federation "{new_federation}"' in other.stdout
    rows = [json.loads(line) for line in (runs / "sim.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2] and all(row["clients_sent"] == 2 for row in rows), rows
    assert sorted(path.name for path in (tmp_path / "server-state").iterdir()) == sorted((federation, new_federation))
    assert processes_of(runs / "sim-home") == []
    for run in (refused, resumed, other):
        assert "\x1b[" not in run.stdout, "output that is no terminal has no colour codes"
        assert "FutureWarning" not in run.stdout + run.stderr


def test_a_submission_flower_refuses_fails_the_command(tmp_path):
    """`flwr run` itself refusing (here: an unknown connection) is a failure with a reason too."""
    result = fedbayes(["run", ".", "no-such-connection"], env=cli_env(FLWR_HOME=str(tmp_path / "flwr-home")))
    assert result.returncode == 1
    assert result.last_error_line.startswith("fedbayes run failed: flwr run exited with code"), result.stderr


@pytest.mark.parametrize(
    ("args", "status", "output"), [(["--version"], 0, "Flower version: 1.39"), (["ls", "nope"], 1, "'nope' not found")]
)
def test_flwr_through_patient_flwr_keeps_its_exit_status_and_every_line_it_wrote_to_a_pipe(
    tmp_path, args, status, output
):
    """patient_flwr ends the process without the interpreter's teardown: the status and buffered output survive it."""
    result = subprocess.run(
        [sys.executable, "-m", "fedbayes.deploy.patient_flwr", *args],
        env=cli_env(FLWR_HOME=str(tmp_path / "flwr-home")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == status and output in " ".join((result.stdout + result.stderr).split()), result
