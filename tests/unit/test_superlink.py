"""`fedbayes superlink` (deploy/superlink.py): its log stream looks for the run's end every 0.1 s."""

from __future__ import annotations

from types import SimpleNamespace

import flwr
import pytest
from flwr.superlink.servicer.control import control_handlers

from fedbayes.deploy.superlink import STREAM_INTERVAL, patch_flower


class OneRunState:
    """The two reads Flower's log stream makes of the SuperLink's state: one log line, the run finished at the third
    look."""

    def __init__(self) -> None:
        self.looks = 0

    def get_task_log(self, task_id, after_timestamp):
        return ("round 1 done\n", 5.0) if self.looks == 0 else ("", after_timestamp)

    def get_run_info(self, run_ids):
        self.looks += 1
        status = control_handlers.Status.FINISHED if self.looks == 3 else control_handlers.Status.RUNNING
        return [SimpleNamespace(status=SimpleNamespace(status=status))]

    def cleanup_run(self, run_id):
        pass


def test_the_streamed_log_looks_for_the_runs_end_at_the_patched_interval(monkeypatch):
    monkeypatch.setattr(control_handlers, "LOG_STREAM_INTERVAL", control_handlers.LOG_STREAM_INTERVAL)  # restored
    waits = []
    monkeypatch.setattr(control_handlers.time, "sleep", waits.append)
    patch_flower(STREAM_INTERVAL)
    streamed = list(control_handlers._stream_logs(7, 1, 0.0, OneRunState(), None))
    assert [response.log_output for response in streamed] == ["round 1 done\n"]
    assert waits == [STREAM_INTERVAL, STREAM_INTERVAL] and STREAM_INTERVAL < 0.5  # Flower's own: 0.5 s


def test_another_flower_is_refused_not_patched(monkeypatch):
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    with pytest.raises(SystemExit, match="patches Flower 1.39.0's log stream, but Flower 1.40.0 is installed"):
        patch_flower(STREAM_INTERVAL)
