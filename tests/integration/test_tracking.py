"""Run config `tracking` (server/tracking.py) on the real round loop (in process, scripted grid): a real MLflow
tracking server started here gets the run config, every round's metrics, the report's figures and the posterior,
read back with MlflowClient; TensorBoard event files read back with TensorBoard's own reader; a tracking server that
is down or hangs neither stops nor slows the run, and says so once."""

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
from flwr.app import Array, ArrayRecord

from fedbayes.deploy.processes import free_ports
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, new_header
from fedbayes.server import tracking
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.loop import LoopSettings, run_rounds
from fedbayes.server.tracking import posterior_export, row_metrics, tracked_run
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.strategies.fedavg.server import FedAvg
from fedbayes.tasks.report import PLOTS, read_rows
from tests.support import FakeGrid, improving_metrics, round_core, scripted

LOGREG = {"1.weight": (10, 784), "1.bias": (10,)}  # model=logreg on Fashion-MNIST: the export rebuilds it
ROUNDS = 4


def logreg_reply(server_round: int, node: int, federation: str):
    weights = {name: np.full(shape, 0.01 * server_round, np.float32) for name, shape in LOGREG.items()}
    envelope = pb.Reply(header=new_header(federation, server_round, f"client-{node}"), num_examples=10, train_loss=0.3)
    return encode(envelope, pb.FedAvgReply(), {"weights": weights})


def tracked_federation(tmp_path: Path, tracking_value: str, rounds: int = ROUNDS) -> tuple[dict, float]:
    """A FedAvg federation of two scripted clients through run_rounds, tracked as the ServerApp tracks it
    (server/app.py); its run config and the seconds it took."""
    federation = tmp_path.name.replace("[", "-").replace("]", "")
    run_config = {
        **default_run_config(),
        "federation": federation,
        "model": "logreg",
        "tracking": tracking_value,
        "num-server-rounds": rounds,
        "results-path": str(tmp_path / "r.jsonl"),
        "server-state-dir": str(tmp_path / "state"),
    }
    settings = run_settings(run_config)
    core = round_core(FedAvg(settings, LOGREG))
    initial = ArrayRecord({name: Array(np.zeros(shape, np.float32)) for name, shape in LOGREG.items()})
    loop = LoopSettings(
        num_rounds=rounds, round_timeout=5.0, poll_interval=0.01, wait_for_clients=2, wait_for_clients_timeout=5
    )
    store = CheckpointStore(settings.server_state_dir, federation, run_config)
    started = time.monotonic()
    with tracked_run(
        settings.tracking, federation, run_config, posterior_export(settings.server_state_dir, federation, run_config)
    ) as sinks:
        run_rounds(
            FakeGrid([1, 2], scripted(lambda r, node: logreg_reply(r, node, federation))),
            core,
            initial,
            loop,
            improving_metrics,
            settings.results_path,
            store,
            sinks,
        )
    return run_config, time.monotonic() - started


def tracking_warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and record.getMessage().startswith("tracking")
    ]


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

    run_config, _ = tracked_federation(tmp_path, f"mlflow:{mlflow_server}")
    assert tracking_warnings(caplog) == []
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    (run,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`{tracking.FEDERATION_TAG}` = '{run_config['federation']}'"
    )
    assert run.info.status == "FINISHED" and run.info.run_name == run_config["federation"]
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
