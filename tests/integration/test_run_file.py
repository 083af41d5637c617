"""`fedbayes local --config FILE` starts the federation its run file describes and leaves the workdir a run file of its
own, from which `fedbayes local --resume WORKDIR` alone continues it; a bad run file is refused, naming the file and
the key, before any process starts."""

from __future__ import annotations

import json
import signal
import tomllib
from pathlib import Path

import pytest

from tests.support.processes import (
    cli_env,
    fedbayes,
    is_table_row,
    processes_of,
    read_until,
    start_fedbayes,
    wait_for_file,
)

RUN_FILE = """\
strategy = "fedavg"
clients = 2
rounds = 2
fraction = 0.05
workdir = "{workdir}"

[run-config]
batch-size = 64
"""


def rounds_in(results: Path) -> list[int]:
    return [json.loads(line)["round"] for line in results.read_text().splitlines()]


@pytest.mark.timeout(1200)  # three starts of a federation in a row
def test_a_run_file_starts_the_federation_and_its_workdir_alone_resumes_it(tmp_path):
    workdir = tmp_path / "fed"
    config = tmp_path / "run.toml"
    config.write_text(RUN_FILE.format(workdir=workdir))
    launcher = start_fedbayes(["local", "--config", str(config)])
    started = read_until(launcher, is_table_row(1))
    assert any(
        line.rstrip().endswith(f"to resume it after an interruption: fedbayes local --resume {workdir}")
        for line in started
    ), "".join(started)
    stored = tomllib.loads((workdir / "run.toml").read_text())
    assert (stored["strategy"], stored["clients"], stored["rounds"], stored["fraction"]) == ("fedavg", 2, 2, 0.05)
    assert stored["run-config"] == {"batch-size": 64}
    # stopped once there is a round to resume after (tests/integration/test_launcher_failures.py says why)
    wait_for_file(workdir / "server-state" / "fed" / "checkpoint-1.safetensors", "round 1 was never checkpointed")
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=60) == 143
    assert processes_of(workdir) == []

    refused = fedbayes(["local", "--resume", str(workdir), "--clients", "3", "--set", "batch-size=32"])
    assert refused.returncode == 1
    assert "this command changes clients 3 (was 2); run config batch-size 32 (was 64)" in refused.last_error_line
    assert not (workdir / "logs-2").exists(), "refused before any process started"

    resumed = fedbayes(["local", "--resume", str(workdir)])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after round" in (workdir / "logs-2" / "flwr-run.log").read_text()
    assert rounds_in(workdir / "results.jsonl") == [1, 2]
    run_config = (workdir / "run-config.toml").read_text()
    assert "batch-size = 64" in run_config and "fraction = 0.05" in run_config, "the stored run config was used"

    longer = fedbayes(["local", "--resume", str(workdir), "--rounds", "3"])  # a resume may train longer, and says so
    assert longer.returncode == 0, longer.stdout + longer.stderr
    assert f"resuming as {workdir}/run.toml says, but with rounds 3 (was 2)" in longer.stdout
    assert rounds_in(workdir / "results.jsonl") == [1, 2, 3]
    assert tomllib.loads((workdir / "run.toml").read_text())["rounds"] == 3, "the next resume runs 3 rounds"
    assert processes_of(workdir) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('strategy = "fedavg"\nclient = 2\nrounds = 1\n', "unknown option 'client' (did you mean 'clients'?)"),
        (
            'strategy = "fedavg"\nclients = 2\nrounds = 1\n[run-config]\nlocal-epoch = 3\n',
            "[run-config] unknown run-config key 'local-epoch' (did you mean 'local-epochs'?)",
        ),
        ('strategy = "fedavg"\nclients = "two"\nrounds = 1\n', "'clients' must be a number, got 'two'"),
    ],
)
def test_a_bad_run_file_is_refused_naming_the_file_and_the_key_before_any_process_starts(tmp_path, text, message):
    config = tmp_path / "run.toml"
    config.write_text(text)
    result = fedbayes(["local", "--config", str(config), "--workdir", str(tmp_path / "run")])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith(f"fedbayes: error: run file {config}: {message}"), result.stderr
    assert not (tmp_path / "run").exists()


def test_fedbayes_run_takes_its_connection_from_the_run_file_and_refuses_a_misspelt_key_before_flwr(tmp_path):
    env = cli_env(FLWR_HOME=str(tmp_path / "flwr-home"))
    config = tmp_path / "run.toml"
    config.write_text('app = "."\nsuperlink = "no-such-connection"\n[run-config]\nnum-server-rounds = 1\n')
    submitted = fedbayes(["run", "--config", str(config)], env=env)
    assert submitted.returncode == 1
    assert submitted.last_error_line.startswith("fedbayes run failed: flwr run exited with code"), submitted.stderr
    assert "no-such-connection" in submitted.stdout + submitted.stderr, "the file's superlink reached flwr run"

    config.write_text('superlink = "local"\n[run-config]\nnum-server-round = 1\n')
    refused = fedbayes(["run", "--config", str(config)], env=env)
    assert refused.returncode == 1
    assert refused.last_error_line == (
        f"fedbayes: error: run file {config}: [run-config] unknown run-config key 'num-server-round' "
        "(did you mean 'num-server-rounds'?)"
    )
    assert "flwr" not in refused.stdout, "refused before flwr run started"
