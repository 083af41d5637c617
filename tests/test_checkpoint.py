"""Server checkpoints: round trip, refusal of another run's settings, results kept on resume."""

import json

import numpy as np
import pytest

from fedbayes.server.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from fedbayes.server.loop import ResultsLog
from fedbayes.strategies.base import ServerState
from tests.test_config import DEFAULTS


def checkpoint(server_round=3):
    return Checkpoint(
        server_round,
        {"1.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "1.bias": np.ones(2, np.float32)},
        ServerState({"duals/a/mean": np.linspace(0, 1, 5)}, {"dual_rounds": json.dumps({"a": 2})}),
        wall_seconds=12.5,
    )


def test_round_trip(tmp_path):
    CheckpointStore(tmp_path, "fed", DEFAULTS).save(checkpoint())
    loaded = CheckpointStore(tmp_path, "fed", DEFAULTS).load()
    assert loaded.server_round == 3 and loaded.wall_seconds == 12.5
    assert loaded.arrays.keys() == {"1.weight", "1.bias"}
    np.testing.assert_array_equal(loaded.arrays["1.weight"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert loaded.strategy_state.tensors["duals/a/mean"].dtype == np.float64  # float64 state stays float64
    assert loaded.strategy_state.metadata == {"dual_rounds": json.dumps({"a": 2})}
    assert CheckpointStore(tmp_path, "other", DEFAULTS).load() is None


def test_resume_with_other_settings_is_refused_naming_the_keys(tmp_path):
    CheckpointStore(tmp_path, "fed", DEFAULTS).save(checkpoint())
    changed = {**DEFAULTS, "lr": 0.5, "strategy": "fedprox"}
    with pytest.raises(CheckpointError, match=r"lr: 0\.001 -> 0\.5, strategy: 'fedavg' -> 'fedprox'"):
        CheckpointStore(tmp_path, "fed", changed).load()
    # How long to run and where to log may change.
    longer = {**DEFAULTS, "num-server-rounds": 100, "results-path": "/elsewhere.jsonl", "round-timeout": 5.0}
    assert CheckpointStore(tmp_path, "fed", longer).load().server_round == 3


def test_unreadable_checkpoint_is_an_error(tmp_path):
    store = CheckpointStore(tmp_path, "fed", DEFAULTS)
    store.save(checkpoint())
    store.path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="unreadable"):
        store.load()


def test_results_of_checkpointed_rounds_are_kept_on_resume(tmp_path):
    path = tmp_path / "results.jsonl"
    rows = "".join(json.dumps({"round": r, "accuracy": r / 10}) + "\n" for r in (1, 2, 3))
    path.write_text(rows + '{"round": 4, "accur')  # round 4 was being written when the server died
    ResultsLog(str(path), keep_through_round=2).write({"round": 3, "accuracy": 0.33})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"round": 1, "accuracy": 0.1}, {"round": 2, "accuracy": 0.2}, {"round": 3, "accuracy": 0.33}]
    ResultsLog(str(path))  # a fresh run starts an empty file
    assert path.read_text() == ""
