"""Run config `tracking` (server/tracking.py) on the real round loop (in process, scripted grid): TensorBoard event
files read back with TensorBoard's own reader; a tracking server that is down at the start stops the run before round
1; one that fails or hangs later neither stops nor slows the run, and says so each time; a missing extra or a bad value
is refused before the run. The real MLflow server:
tests/integration/test_tracking.py."""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path

import pytest

from fedbayes.deploy.processes import free_ports
from fedbayes.server import tracking
from fedbayes.server.tracking import row_metrics
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.preflight import check_tracking
from fedbayes.tasks.report import PLOTS, read_rows
from fedbayes.tasks.runlog import TRACKING
from tests.support.tracked import ROUNDS, tracked_federation, tracking_warnings


def test_tensorboard_event_files_hold_the_run_config_metrics_and_figures(tmp_path, caplog):
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, TENSORS, EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    with caplog.at_level(logging.INFO):
        run_config, _ = tracked_federation(tmp_path, f"tensorboard:{tmp_path / 'tb'}")
    assert tracking_warnings(caplog) == []
    directory = tmp_path / "tb" / run_config["federation"]
    assert f"{TRACKING}sending to TensorBoard event files in {directory} (to view: tensorboard --logdir " in caplog.text
    events = EventAccumulator(str(directory), size_guidance={SCALARS: 0, IMAGES: 0, TENSORS: 0})
    events.Reload()
    rows = read_rows(Path(run_config["results-path"]))
    for key in ("accuracy", "ece_ensemble", "clients", "phase_seconds/evaluate"):
        assert [(event.step, event.value) for event in events.Scalars(key)] == [
            (row["round"], pytest.approx(row_metrics(row)[key], rel=1e-6)) for row in rows
        ], key
    assert sorted(events.Tags()["images"]) == sorted(f"report/{Path(plot.file).stem}" for plot in PLOTS)
    assert all(image.width >= 900 for image in events.Images("report/metrics"))
    hparams = HParamsPluginData.FromString(events.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    assert hparams.session_start_info.hparams["model"].string_value == "logreg"
    assert hparams.session_start_info.hparams["num-server-rounds"].number_value == ROUNDS
    assert (directory / "report" / "index.html").is_file() and (directory / tracking.POSTERIOR_FILE).is_file()


def test_a_tracking_server_that_is_down_at_the_start_stops_the_run_before_round_1(tmp_path):
    """Nothing listens on the port: the tracked run cannot start, and neither does the federation's, naming the URI."""
    (dead_port,) = free_ports(1)
    tracking_value = f"mlflow:http://127.0.0.1:{dead_port}"
    with pytest.raises(tracking.TrackingUnavailable) as failure:
        tracked_federation(tmp_path, tracking_value)
    message = str(failure.value)
    assert message.startswith(f"tracking ({tracking_value}) cannot start this run's tracking (MlflowException"), message
    assert message.endswith(
        "the run was not started: make the tracking server reachable (or the directory writable), "
        'or set tracking="" to run untracked'
    )
    assert not (tmp_path / "r.jsonl").exists()  # no round ran
    with pytest.raises(
        ConfigError,
        match=rf"^run config 'tracking': no MLflow tracking server answers at "
        rf"http://127.0.0.1:{dead_port} \(.*Connection refused\); start it first",
    ):
        check_tracking(tracking_value)  # `fedbayes local` asks before it starts any process


class FlakyBackend:
    """A tracking backend whose server fails the rows of the rounds in `fails`, and blocks in a row's logging while
    `held` is clear."""

    destination = "a test backend"

    def __init__(self, fails=(), held=None) -> None:
        self.fails, self.held, self.steps, self.ended = set(fails), held, [], None

    def start(self, params) -> None:
        pass

    def log_metrics(self, step, metrics) -> None:
        if self.held is not None:
            self.held.wait()
        if step in self.fails:
            raise ConnectionError(f"server gone while round {step} was logged")
        self.steps.append(step)

    def log_report(self, directory) -> None:
        pass

    def log_file(self, path) -> None:
        pass

    def end(self, completed) -> None:
        self.ended = completed


def test_each_row_a_tracking_server_fails_to_take_is_a_warning_and_the_next_one_is_tried(tmp_path, monkeypatch, caplog):
    """The server fails rounds 2 and 3 and is back for round 4: a warning each time, round 4 logged, the run's end
    too; the run itself never notices."""
    backend = FlakyBackend(fails={2, 3})
    monkeypatch.setattr(tracking, "open_backend", lambda value, name: backend)
    with caplog.at_level(logging.INFO):
        tracked_federation(tmp_path, f"tensorboard:{tmp_path / 'tb'}")
    assert len(read_rows(tmp_path / "r.jsonl")) == ROUNDS and backend.steps == [1, 4] and backend.ended is True
    assert tracking_warnings(caplog) == [
        f"{TRACKING}tensorboard:{tmp_path / 'tb'} failed to log round {number}'s row (ConnectionError: server gone "
        f"while round {number} was logged); it is in results-path, and the next round's is tried again"
        for number in (2, 3)
    ]
    sending = [record.getMessage() for record in caplog.records if "sending to" in record.getMessage()]
    assert sending == [f"{TRACKING}sending to a test backend"]  # once, at the start


def test_a_tracking_server_that_stops_answering_costs_the_run_at_most_the_close_timeout(tmp_path, monkeypatch, caplog):
    """A server that takes round 1's row and never answers: rounds go on at their pace while rows pile up in the
    bounded queue (a warning for each row it drops), and the run's end waits CLOSE_TIMEOUT at most."""
    held = threading.Event()
    monkeypatch.setattr(tracking, "open_backend", lambda value, name: FlakyBackend(held=held))
    monkeypatch.setattr(tracking, "QUEUE_ROWS", 1)
    monkeypatch.setattr(tracking, "CLOSE_TIMEOUT", 2.0)
    _, untracked = tracked_federation(tmp_path / "untracked", "")
    try:
        _, tracked = tracked_federation(tmp_path / "silent", f"tensorboard:{tmp_path / 'tb'}")
    finally:
        held.set()
    assert tracked < untracked + tracking.CLOSE_TIMEOUT + 3.0, (tracked, untracked)
    assert len(read_rows(tmp_path / "silent" / "r.jsonl")) == ROUNDS
    warnings = tracking_warnings(caplog)
    assert [warning.split(" row is not")[0].split("; ")[-1] for warning in warnings[:-1]] == [
        f"round {number}'s" for number in (3, 4)
    ], warnings  # round 1 is taken, round 2 waits in the queue
    assert warnings[-1].endswith(
        f"did not take this run's end within {tracking.CLOSE_TIMEOUT:.0f} s; the run ends without it"
    )


def test_a_missing_extra_or_a_bad_value_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "mlflow" else object())
    with pytest.raises(
        ConfigError,
        match=r"^run config 'tracking' is 'mlflow:http://x', but mlflow is not installed "
        r"for this Python: pip install 'fedbayes\[mlflow\]'$",
    ):
        check_tracking("mlflow:http://x")
    check_tracking("tensorboard:" + str(tmp_path))  # installed here, and writable
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="^run config 'tracking': .*file is not a directory"):
        check_tracking(f"tensorboard:{tmp_path / 'file'}")
    for value in ("mlflow", "wandb:x", "tensorboard:"):
        with pytest.raises(ConfigError, match=r"run config 'tracking' .*must be \"\" \(off\), mlflow:URI or"):
            run_settings({**default_run_config(), "federation": "fed", "tracking": value})


def test_a_rows_numbers_become_metrics():
    row = {
        "round": 3,
        "accuracy": 0.5,
        "train_loss": None,
        "quarantined": ["node 1", "node 2"],
        "clients": 2,
        "phase_seconds": {"push": 0.25, "previous_checkpoint": None},
        "reliability": {"count": [1, 2]},
    }
    assert row_metrics(row) == {"accuracy": 0.5, "quarantined": 2.0, "clients": 2.0, "phase_seconds/push": 0.25}
