"""Run config `tracking` (server/tracking.py) on the real round loop (in process, scripted grid): TensorBoard event
files read back with TensorBoard's own reader; a tracking server that is down or hangs neither stops nor slows the
run, and says so once; a missing extra or a bad value is refused before the run. The real MLflow server:
tests/integration/test_tracking.py."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from fedbayes.deploy.processes import free_ports
from fedbayes.server import tracking
from fedbayes.server.tracking import row_metrics
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.preflight import check_tracking
from fedbayes.tasks.report import PLOTS, read_rows
from tests.support.tracked import ROUNDS, tracked_federation, tracking_warnings


def test_tensorboard_event_files_hold_the_run_config_metrics_and_figures(tmp_path, caplog):
    from tensorboard.backend.event_processing.event_accumulator import IMAGES, SCALARS, TENSORS, EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    run_config, _ = tracked_federation(tmp_path, f"tensorboard:{tmp_path / 'tb'}")
    assert tracking_warnings(caplog) == []
    directory = tmp_path / "tb" / run_config["federation"]
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


def test_a_tracking_server_that_is_down_neither_stops_nor_slows_the_run(tmp_path, caplog):
    """Nothing listens on the port: the run takes about the time an untracked one takes, writes every row, and the
    tracker warns once."""
    import mlflow.tracking  # noqa: F401  imported here first: the run's time is the dead server's, not the import's

    (dead_port,) = free_ports(1)
    _, untracked = tracked_federation(tmp_path / "untracked", "")
    _, tracked = tracked_federation(tmp_path / "dead", f"mlflow:http://127.0.0.1:{dead_port}")
    assert tracked < untracked + 3.0, (tracked, untracked)
    assert len(read_rows(tmp_path / "dead" / "r.jsonl")) == ROUNDS
    (warning,) = tracking_warnings(caplog)
    assert f"tracking (mlflow:http://127.0.0.1:{dead_port}) failed (MlflowException" in warning
    assert "this run is not tracked from its start (its rows are in results-path)" in warning


def test_a_tracking_server_that_never_answers_costs_the_run_at_most_the_close_timeout(tmp_path, caplog, monkeypatch):
    """A server that accepts connections and never answers: rounds go on at their pace while rows pile up in the
    bounded queue (one warning when it is full, no more after it), and the run's end waits CLOSE_TIMEOUT at most."""
    import mlflow.tracking  # noqa: F401  as above

    monkeypatch.setattr(tracking, "QUEUE_ROWS", 2)
    monkeypatch.setattr(tracking, "CLOSE_TIMEOUT", 2.0)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; nobody reads or answers
        _, untracked = tracked_federation(tmp_path / "untracked", "")
        _, tracked = tracked_federation(tmp_path / "silent", f"mlflow:http://127.0.0.1:{silent.getsockname()[1]}")
    assert tracked < untracked + tracking.CLOSE_TIMEOUT + 3.0, (tracked, untracked)
    assert len(read_rows(tmp_path / "silent" / "r.jsonl")) == ROUNDS
    (warning,) = tracking_warnings(caplog)
    assert (
        "falls behind: 2 rows wait for it; round 3's row and any that come while they wait are not tracked" in warning
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
