"""Run config `tracking`: the ServerApp's run, live, in MLflow or TensorBoard.

`tracking` is "" (off), `mlflow:URI` (an MLflow tracking server, e.g. mlflow:http://127.0.0.1:5000; extra
fedbayes[mlflow]) or `tensorboard:DIR` (event files in DIR/<federation>; extra fedbayes[tensorboard]). Logged:
- the run config, as params (TensorBoard: HParams);
- every round's row as it is written (server/loop.py RoundFinisher), step = round: the global and ensemble metrics,
  clients accepted, sent and rejected, nodes quarantined, the strategy's round metrics, and the phase seconds as
  `phase_seconds/<phase>`, `client_phase_seconds/<phase>`, `client_phase_max/<phase>` (row_metrics);
- at the end, the `fedbayes report` figures of those rows (tasks/report.py) and, when the run completed, the
  posterior of its last round as `fedbayes export` writes it (fedbayes.posterior), as artifacts (TensorBoard: the
  figures as images, and both as files in DIR/<federation>/).
Each start of the ServerApp is a run of its own, named after the federation (MLflow: tagged `fedbayes.federation`);
a resumed federation's starts at the round after its checkpoint.

The tracked run is started before round 1, in the ServerApp's main thread: a tracking server that cannot be reached
then (or a TensorBoard directory that cannot be written) stops the run before it starts, naming the URI
(TrackingUnavailable; `fedbayes local` asks the server before it starts any process, tasks/preflight.py). Once
started, the tracker logs where it sends, once: `fedbayes tracking: sending to ...` (tasks/runlog.py), which `fedbayes
run` streams; the same notice is a `tracking` event (tasks/events.py), which `fedbayes local` prints beside its
table. From then on a tracking server that is down or slow never stops or slows the federation: rows go through a
bounded queue to one background thread, which does all the talking. Each row it fails to log, and each row a full
queue drops, is a `fedbayes tracking:` warning, and the next row is tried again (the rows are in results-path all the
same). At the end the ServerApp waits at most CLOSE_TIMEOUT seconds
for the figures and the posterior to be logged.
"""

from __future__ import annotations

import math
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flwr.common import log

from fedbayes.tasks.config import TrackingSettings, parse_tracking
from fedbayes.tasks.runlog import tracking_line

if TYPE_CHECKING:
    from fedbayes.server.loop import RowSink

QUEUE_ROWS = 1000  # rows waiting for the tracking thread; more are dropped (with one warning)
CLOSE_TIMEOUT = 30.0  # seconds the end of a run waits for the last rows, the figures and the posterior
EXPERIMENT = "fedbayes"  # the MLflow experiment every run goes to
FEDERATION_TAG = "fedbayes.federation"
MLFLOW_BATCH_PARAMS = 100  # MLflow's limit on params per log_batch request
# MLflow's HTTP client retries a failed request 7 times, backing off for minutes; the tracker gives up at the first
# failure anyway. Set only where the user has not set them.
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
HPARAM_METRICS = ("accuracy", "nll", "ece")  # the metrics TensorBoard's HParams table shows next to the run config
POSTERIOR_FILE = "posterior.safetensors"


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A results row's numbers by metric name: top-level numbers as they are, those of a nested dict (phase_seconds)
    as `<key>/<name>`, a list (quarantined) as its length. Not numbers: None (a round without that metric), the
    reliability bins (drawn in the report's figure) and the round (the step).

    Args:
        row: a results row (server/loop.py).

    Returns:
        Its finite numbers by metric name.
    """
    metrics = {}
    for key, value in row.items():
        if key == "round":
            continue
        if isinstance(value, list):
            metrics[key] = float(len(value))
        elif isinstance(value, dict):
            metrics.update({f"{key}/{name}": float(inner) for name, inner in value.items() if _is_number(inner)})
        elif _is_number(value):
            metrics[key] = float(value)
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:500]


class TrackingUnavailable(RuntimeError):
    """Run config `tracking` could not start the tracked run: the run does not start either."""


class Backend(Protocol):
    """Where a tracker logs: opened and started by the ServerApp's main thread, then used by the tracking thread
    only. `destination`: where it sends, for the operator (after `start`)."""

    @property
    def destination(self) -> str: ...

    def start(self, params: dict[str, Any]) -> None:
        """Start the tracked run and log its params.

        Args:
            params: the run config, by key.
        """

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Log one round's metrics.

        Args:
            step: the round.
            metrics: the row's numbers by metric name (row_metrics).
        """

    def log_report(self, directory: Path) -> None:
        """Log the report's figures.

        Args:
            directory: the folder `write_report` wrote (tasks/report.py).
        """

    def log_file(self, path: Path) -> None:
        """Log one file as an artifact (the posterior).

        Args:
            path: the file.
        """

    def end(self, completed: bool) -> None:
        """End the tracked run.

        Args:
            completed: whether the run completed (else it failed).
        """


class MlflowBackend:
    """An MLflow run in experiment EXPERIMENT on the tracking server at `uri`."""

    def __init__(self, uri: str, name: str) -> None:
        for variable, value in MLFLOW_HTTP_DEFAULTS.items():
            os.environ.setdefault(variable, value)
        from mlflow.tracking import MlflowClient

        self.client, self.uri, self.name, self.run_id = MlflowClient(tracking_uri=uri), uri, name, ""
        self.experiment_id = ""

    @property
    def destination(self) -> str:
        page = (
            f"; {self.uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{self.run_id}"
            if self.uri.startswith(("http://", "https://"))
            else ""
        )
        return f"MLflow at {self.uri}, experiment {EXPERIMENT!r}, run {self.name!r} ({self.run_id}{page})"

    def start(self, params: dict[str, Any]) -> None:
        """Create the run (and EXPERIMENT where it is new) and log `params` in batches of MLFLOW_BATCH_PARAMS.

        Args:
            params: the run config, by key.
        """
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(EXPERIMENT)
        self.experiment_id = experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(EXPERIMENT)
        )
        self.run_id = self.client.create_run(
            experiment_id, run_name=self.name, tags={FEDERATION_TAG: self.name}
        ).info.run_id
        items = [Param(key, str(value)) for key, value in params.items()]
        for start in range(0, len(items), MLFLOW_BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[start : start + MLFLOW_BATCH_PARAMS])

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Log one round's metrics in one request.

        Args:
            step: the round.
            metrics: the row's numbers by metric name.
        """
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, now, step) for key, value in metrics.items()])

    def log_report(self, directory: Path) -> None:
        """Log the report's files as the run's artifacts under `report/`.

        Args:
            directory: the folder `write_report` wrote.
        """
        self.client.log_artifacts(self.run_id, str(directory), artifact_path="report")

    def log_file(self, path: Path) -> None:
        """Log one file as an artifact of the run.

        Args:
            path: the file.
        """
        self.client.log_artifact(self.run_id, str(path))

    def end(self, completed: bool) -> None:
        """Mark the run FINISHED or FAILED.

        Args:
            completed: whether the run completed.
        """
        self.client.set_terminated(self.run_id, "FINISHED" if completed else "FAILED")


class TensorBoardBackend:
    """Event files in `directory`/`name` (torch's SummaryWriter, which needs the tensorboard package)."""

    def __init__(self, directory: str, name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(directory) / name
        self.writer = SummaryWriter(log_dir=str(self.directory))
        self.session_end: Any = None  # HParams' session-end summary, written by `end` of a completed run

    @property
    def destination(self) -> str:
        return f"TensorBoard event files in {self.directory} (to view: tensorboard --logdir {self.directory.parent})"

    def start(self, params: dict[str, Any]) -> None:
        """Write the HParams summaries of `params` (with HPARAM_METRICS as the table's metrics).

        Args:
            params: the run config, by key.
        """
        from torch.utils.tensorboard.summary import hparams

        experiment, session_start, self.session_end = hparams(params, dict.fromkeys(HPARAM_METRICS, 0.0))
        self._add_summary(experiment)
        self._add_summary(session_start)
        self.writer.flush()

    def _add_summary(self, summary: Any) -> None:
        # torch's stubs infer SummaryWriter.file_writer as None: its __init__ assigns None, then creates the writer
        self.writer.file_writer.add_summary(summary)  # type: ignore[attr-defined]

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Write one scalar per metric, and flush.

        Args:
            step: the round.
            metrics: the row's numbers by metric name.
        """
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a TensorBoard watching the directory shows each round as it ends

    def log_report(self, directory: Path) -> None:
        """Copy the report into the event folder and write each of its figures as an image.

        Args:
            directory: the folder `write_report` wrote.
        """
        from matplotlib.image import imread

        shutil.copytree(directory, self.directory / "report", dirs_exist_ok=True)
        for figure in sorted(directory.glob("*.png")):
            self.writer.add_image(f"report/{figure.stem}", imread(figure)[..., :3], dataformats="HWC")
        self.writer.flush()

    def log_file(self, path: Path) -> None:
        """Copy one file into the event folder.

        Args:
            path: the file.
        """
        shutil.copy2(path, self.directory / path.name)

    def end(self, completed: bool) -> None:
        """Write HParams' session end for a completed run, and close the writer.

        Args:
            completed: whether the run completed.
        """
        if completed:  # HParams' session end says "success"; a failed run has none
            self._add_summary(self.session_end)
        self.writer.close()


def open_backend(tracking: str, name: str) -> Backend:
    """The backend run config `tracking` names, opened (not started).

    Args:
        tracking: mlflow:URI or tensorboard:DIR.
        name: the tracked run's name (the federation).

    Returns:
        An MlflowBackend or a TensorBoardBackend.
    """
    kind, target = parse_tracking(tracking)
    return MlflowBackend(target, name) if kind == "mlflow" else TensorBoardBackend(target, name)


@dataclass(frozen=True)
class _Finish:
    completed: bool


class Tracker:
    """A RowSink that logs rows on a background thread (see the module's docstring); `close` ends it.

    Args: `settings` (the run's tracking group: run config `tracking`, and the federation, the tracked run's name),
    `params` (the run config, logged as params), `export` (writes the posterior into a directory, logged at a
    completed run's end), `notice` (gets each notice, one line each).
    Raises: TrackingUnavailable, naming `tracking`, where the tracked run cannot be started (before any thread)."""

    def __init__(
        self,
        settings: TrackingSettings,
        params: dict[str, Any],
        export: Callable[[Path], Path] | None = None,
        notice: Callable[[str], None] = lambda message: None,
    ) -> None:
        tracking = settings.tracking
        self.tracking, self.name, self.params, self.export = tracking, settings.federation, params, export
        self.notice = notice  # each notice as data too (the ServerApp's event stream, tasks/events.py)
        try:
            self.backend = open_backend(tracking, self.name)
            self.backend.start(params)
        except Exception as error:  # whatever the backend raises: the run has not started
            raise TrackingUnavailable(
                f"tracking ({tracking}) cannot start this run's tracking ({_one_line(error)}); the run was not "
                'started: make the tracking server reachable (or the directory writable), or set tracking="" '
                "to run untracked"
            ) from error
        log(INFO, "%s", tracking_line(f"sending to {self.backend.destination}"))
        notice(" ".join(f"sending to {self.backend.destination}".split()))
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_ROWS)
        self.rows: list[dict[str, Any]] = []  # every row handed over, for the figures at the end
        self.thread = threading.Thread(target=self._work, name="tracking", daemon=True)
        self.thread.start()

    def __call__(self, row: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(row)
        except queue.Full:
            self._warn(
                f"falls behind: {QUEUE_ROWS} rows wait for it; round {row['round']}'s row is not tracked "
                "(it is in results-path)"
            )

    def close(self, completed: bool) -> None:
        """Hand the tracking thread the end of the run and wait for it, at most CLOSE_TIMEOUT seconds.

        Args:
            completed: whether the run completed (else it failed).
        """
        deadline = time.monotonic() + CLOSE_TIMEOUT
        while self.thread.is_alive() and time.monotonic() < deadline:
            try:
                self.queue.put(_Finish(completed), timeout=0.2)
                break
            except queue.Full:
                continue
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive():
            self._warn(f"did not take this run's end within {CLOSE_TIMEOUT:.0f} s; the run ends without it")

    def _warn(self, message: str) -> None:
        log(WARNING, "%s", tracking_line(f"{self.tracking} {message}"))
        self.notice(" ".join(f"{self.tracking} {message}".split()))

    def _work(self) -> None:
        while not isinstance(item := self.queue.get(), _Finish):
            self.rows.append(item)
            try:
                self.backend.log_metrics(item["round"], row_metrics(item))
            except Exception as error:  # whatever the backend raises: the run goes on, the next row is tried
                self._warn(
                    f"failed to log round {item['round']}'s row ({_one_line(error)}); it is in results-path, and "
                    "the next round's is tried again"
                )
        try:
            self._log_artifacts(self.backend, item.completed)
            self.backend.end(item.completed)
        except Exception as error:  # as above
            self._warn(f"failed to log the run's end ({_one_line(error)}): its figures or status may be missing")

    def _log_artifacts(self, backend: Backend, completed: bool) -> None:
        """The figures of the rows logged and, for a completed run, its posterior (a failed one may have none)."""
        from fedbayes.tasks.report import Run, write_report

        with tempfile.TemporaryDirectory(prefix="fedbayes-tracking-") as scratch:
            if self.rows:
                report = Path(scratch) / "report"
                write_report(
                    [Run(self.name, self.params.get("results-path") or "the ServerApp's rows", self.rows, self.params)],
                    report,
                )
                backend.log_report(report)
            if completed and self.export is not None:
                try:
                    posterior = self.export(Path(scratch))
                except Exception as error:  # the export's own failure; the figures are logged all the same
                    self._warn(f"did not log the posterior: exporting it failed ({_one_line(error)})")
                else:
                    backend.log_file(posterior)


def posterior_export(server_state_dir: str, federation: str, run_config: Mapping[str, Any]) -> Callable[[Path], Path]:
    """Writes the posterior of the federation's newest checkpoint into a directory (`fedbayes export`).

    Args:
        server_state_dir: the server's checkpoints, resolved (no "").
        federation: the federation whose newest checkpoint is exported.
        run_config: the run config its checkpoints were written with.

    Returns:
        A function of a directory that writes POSTERIOR_FILE into it and returns its path.
    """

    def export(directory: Path) -> Path:
        from fedbayes.posterior.export import RunLocation, export_posterior

        path = directory / POSTERIOR_FILE
        export_posterior(RunLocation(Path(server_state_dir), federation, dict(run_config)), path)
        return path

    return export


@contextmanager
def tracked_run(
    settings: TrackingSettings,
    run_config: Mapping[str, Any],
    export: Callable[[Path], Path] | None = None,
    notice: Callable[[str], None] = lambda message: None,
) -> Iterator[list[RowSink]]:
    """The row sinks run config `tracking` asks for (none when it is ""), for run_rounds; on exit the figures and
    `export`'s file are logged and the tracked run is marked completed, or failed when the block raised.

    Args:
        settings: the run's tracking group (`RunSettings.tracker`): run config `tracking`, and the federation, the
            tracked run's name.
        run_config: the run config, logged as params.
        export: writes the posterior into a directory (posterior_export), logged at a completed run's end; None:
            no posterior is logged.
        notice: gets each of the tracker's notices (where it sends, each failure), one line each.

    Yields:
        The row sinks: a Tracker, or none when tracking is off.

    Raises:
        TrackingUnavailable: the tracked run cannot be started (before the block runs).
    """
    if not settings.tracking:
        yield []
        return
    tracker = Tracker(settings, dict(run_config), export, notice)
    completed = False
    try:
        yield [tracker]
        completed = True
    finally:
        tracker.close(completed)
