"""What `fedbayes local` says of a run, over real processes: a Bayesian strategy's table has the ensemble's columns,
tracking says once where it sends, a tracking server that is down is an error before anything starts, and a run
whose clients only send NaN ends non-zero naming the rounds, each row saying who was left out and why."""

from __future__ import annotations

import pytest

from fedbayes.deploy.launcher import FLWR_HOME, table_header
from fedbayes.deploy.processes import free_ports
from fedbayes.tasks.events import EVENTS_FILE
from tests.support.processes import cli_env, fault_env, fedbayes, is_table_row

pytestmark = pytest.mark.integration
TINY = ["--clients", "2", "--fraction", "0.02", "--set", "model=logreg"]  # logistic regression on 2% of FMNIST


def table_rows(stdout: str, number: int) -> list[str]:
    return [line for line in stdout.splitlines() if is_table_row(number)(line)]


def test_a_dead_mlflow_server_is_an_error_before_any_process_starts(tmp_path):
    (dead_port,) = free_ports(1)
    uri = f"http://127.0.0.1:{dead_port}"
    workdir = tmp_path / "run"
    result = fedbayes(
        ["local", "--strategy", "fedavg", "--rounds", "1", *TINY, "--set", f"tracking=mlflow:{uri}"]
        + ["--workdir", str(workdir)]
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith(
        f"fedbayes: error: run config 'tracking': no MLflow tracking server answers at {uri} ("
    ), result.stderr
    assert f"wait until {uri}/health answers" in result.last_error_line
    # nothing was started: no Flower home, and no ServerApp wrote an event
    assert not (workdir / FLWR_HOME).exists() and not (workdir / "server-state" / "run" / EVENTS_FILE).exists()


def test_a_bayesian_strategys_table_shows_the_ensemble_and_tracking_says_once_where_it_sends(tmp_path):
    workdir, logdir = tmp_path / "run", tmp_path / "tb"
    result = fedbayes(
        ["local", "--strategy", "bayesadmm", "--rounds", "1", *TINY, "--set", "ensemble-samples=4"]
        + ["--set", "input-scale=255.0", "--set", f"tracking=tensorboard:{logdir}", "--workdir", str(workdir)]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = table_header(ensemble=True)
    assert lines.count(header) == 1, result.stdout
    (row,) = table_rows(result.stdout, 1)
    assert lines.index(row) > lines.index(header)
    accuracy, ensemble_accuracy = float(row.split()[1]), float(row.split()[4])
    assert 0 <= accuracy <= 1 and 0 <= ensemble_accuracy <= 1, row
    sending = [line for line in lines if line.startswith("tracking: ")]
    assert sending == [
        f"tracking: sending to TensorBoard event files in {logdir / workdir.name} (to view: tensorboard --logdir "
        f"{logdir})"
    ], result.stdout
    assert any((logdir / workdir.name).glob("events.out.tfevents.*"))


def test_clients_that_only_send_nan_end_the_run_non_zero_naming_the_rounds_and_each_row_says_why(tmp_path):
    """Every reply is NaN: no round accepts one, the run fails when it ends (2 rounds, under max-failed-rounds)."""
    result = fedbayes(
        ["local", "--strategy", "fedavg", "--rounds", "2", *TINY, "--workdir", str(tmp_path / "run")],
        env=cli_env(**fault_env("nan")),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith(
        "fedbayes run failed: RunFailed: none of the 2 rounds accepted a client reply (rounds 1-2); last round: "
    ), result.stderr
    for number in (1, 2):
        (row,) = table_rows(result.stdout, number)
        assert " 0/2 " in row and "(2 left out: client-0: rejected reply: field 'weights/" in row, row
        assert "contains NaN or Inf; client-1: rejected reply: " in row, row
