"""Run config `tracking` (server/tracking.py) on the real round loop (in process, scripted grid): a real MLflow
tracking server started here gets the run config, every round's metrics, the report's figures and the posterior,
read back with MlflowClient; TensorBoard event files read back with TensorBoard's own reader; a tracking server that
is down at the start stops the run before round 1 (tests/component/test_tracking.py)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from fedbayes.deploy.processes import free_ports
from fedbayes.server import tracking
from fedbayes.server.tracking import row_metrics
from fedbayes.tasks.report import PLOTS, read_rows
from fedbayes.tasks.runlog import TRACKING
from tests.support.tracked import ROUNDS, tracked_federation, tracking_warnings


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on a free loopback port: SQLite runs, artifacts uploaded through it."""
    directory = tmp_path_factory.mktemp("mlflow")
    (port,) = free_ports(1)
    log_path = directory / "server.log"
    with log_path.open("w") as log_file:
        server = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{directory}/runs.sqlite",
                "--artifacts-destination",
                str(directory / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # its workers stop with its group
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(uri, server, log_path)
        yield uri
    finally:
        stop_process_group(server)


def stop_process_group(process: subprocess.Popen, timeout: float = 60.0) -> None:
    """SIGTERM the group `process` leads (the MLflow server, its uvicorn and job workers), SIGKILL what is left."""
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.poll()  # reaps the leader once it exits
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)


def wait_until_healthy(uri: str, server: subprocess.Popen, log_path: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with code {server.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server not healthy within {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def test_mlflow_gets_the_run_config_every_rounds_metrics_the_figures_and_the_posterior(mlflow_server, tmp_path, caplog):
    from mlflow.tracking import MlflowClient

    from fedbayes.posterior import load

    with caplog.at_level(logging.INFO):
        run_config, _ = tracked_federation(tmp_path, f"mlflow:{mlflow_server}")
    assert tracking_warnings(caplog) == []
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    (run,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{tracking.FEDERATION_TAG}` = '{run_config['federation']}'"
    )
    assert run.info.status == "FINISHED" and run.info.run_name == run_config["federation"]
    page = f"{mlflow_server}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}"
    assert (
        f"{TRACKING}sending to MLflow at {mlflow_server}, experiment 'fedbayes', run '{run_config['federation']}' "
        f"({run.info.run_id}; {page})"
    ) in caplog.text  # where the run is, once, before round 1
    assert run.data.params == {key: str(value) for key, value in run_config.items()}

    rows = read_rows(Path(run_config["results-path"]))
    for key in (
        "accuracy",
        "nll_ensemble",
        "clients",
        "clients_rejected",
        "quarantined",
        "phase_seconds/aggregate",
        "round_seconds",
    ):
        history = sorted((metric.step, metric.value) for metric in client.get_metric_history(run.info.run_id, key))
        assert history == [(row["round"], pytest.approx(row_metrics(row)[key])) for row in rows], key

    report = sorted(artifact.path for artifact in client.list_artifacts(run.info.run_id, "report"))
    assert report == sorted(f"report/{name}" for name in ["index.html", *(plot.file for plot in PLOTS)])
    posterior = client.download_artifacts(run.info.run_id, tracking.POSTERIOR_FILE, str(tmp_path))
    exported = load(posterior)
    assert exported.header.round == ROUNDS and exported.header.federation == run_config["federation"]
    assert (exported.mean["1.bias"] == np.float32(0.01 * ROUNDS)).all()  # the last round's global model
