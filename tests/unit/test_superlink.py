"""`fedbayes superlink` (deploy/superlink.py): its log stream looks for the run's end every 0.1 s, and its database's
requests wait a minute for the lock."""

from __future__ import annotations

from types import SimpleNamespace

import flwr
import pytest
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore import sql_mixin
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.servicer.control import control_handlers

from fedbayes.deploy.superlink import BUSY_TIMEOUT_MS, STREAM_INTERVAL
from fedbayes.flowerseam.superlink import patch_log_stream_and_database as patch_flower


@pytest.fixture(autouse=True)
def restore_flower(monkeypatch):
    """What patch_flower changes, put back after each test."""
    monkeypatch.setattr(control_handlers, "LOG_STREAM_INTERVAL", control_handlers.LOG_STREAM_INTERVAL)
    monkeypatch.setattr(sql_mixin, "SQLITE_PRAGMAS", sql_mixin.SQLITE_PRAGMAS)


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
    waits = []
    monkeypatch.setattr(control_handlers.time, "sleep", waits.append)
    patch_flower(STREAM_INTERVAL, BUSY_TIMEOUT_MS)
    streamed = list(control_handlers._stream_logs(7, 1, 0.0, OneRunState(), None))
    assert [response.log_output for response in streamed] == ["round 1 done\n"]
    assert waits == [STREAM_INTERVAL, STREAM_INTERVAL] and STREAM_INTERVAL < 0.5  # Flower's own: 0.5 s


def test_another_flower_is_refused_not_patched(monkeypatch):
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    with pytest.raises(SystemExit, match="patches Flower 1.39.0's log stream and database, but Flower 1.40.0 is"):
        patch_flower(STREAM_INTERVAL, BUSY_TIMEOUT_MS)


def test_the_superlinks_database_waits_the_patched_time_for_its_lock_and_keeps_flowers_other_pragmas(tmp_path):
    """Flower's own link state on a database file, as `--database FILE` opens it."""

    def link_state():
        return LinkStateFactory(str(tmp_path / "superlink.db"), NoOpFederationManager(), ObjectStoreFactory()).state()

    assert link_state().query("PRAGMA busy_timeout") == [{"timeout": 5000}]  # Flower's own
    patch_flower(STREAM_INTERVAL, BUSY_TIMEOUT_MS)
    state = link_state()
    assert state.query("PRAGMA busy_timeout") == [{"timeout": BUSY_TIMEOUT_MS}] and BUSY_TIMEOUT_MS >= 30_000
    assert state.query("PRAGMA journal_mode") == [{"journal_mode": "wal"}]
