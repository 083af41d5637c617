"""Server checkpoints: round trip, refusal of another run's settings, results kept on resume; every kind of damage
refused naming the file and the field; a non-finite or misshapen state never written; the last keep-checkpoints
kept; resume-from-round."""

import json
import os

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from fedbayes.server.checkpoint import CHECKPOINT_FILE, CheckpointError, CheckpointStore, checksum
from fedbayes.server.loop import ResultsLog
from tests.support import DEFAULTS, checkpoint, fedavg_reply, model_arrays, weights
from tests.support import run_loop as run


def store(tmp_path, **options):
    return CheckpointStore(tmp_path, "fed", DEFAULTS, initial_arrays=model_arrays(), **options)


def rewrite(path, tensors=None, metadata=None, keep_checksum=False):
    """Edit a checkpoint file as a tool (or a bug) might: change tensors or metadata entries, then (unless
    `keep_checksum`) seal it with a fresh checksum, so that only the field checks can catch the edit."""
    with safe_open(path, framework="np") as checkpoint_file:
        saved = {name: checkpoint_file.get_tensor(name) for name in checkpoint_file.keys()}
        saved_metadata = checkpoint_file.metadata()
    saved = {name: value for name, value in {**saved, **(tensors or {})}.items() if value is not None}
    saved_metadata = {key: value for key, value in {**saved_metadata, **(metadata or {})}.items() if value is not None}
    if not keep_checksum:
        saved_metadata["checksum"] = checksum(saved, saved_metadata)
    save_file(saved, path, metadata=saved_metadata)


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


def test_a_key_added_since_the_checkpoint_resumes_at_its_default_only(tmp_path):
    """A federation checkpointed before an upgrade added a key (`site-damping`, 0 = the code's old behaviour) resumes
    with the key at its default, and is refused with the key set otherwise; a key the checkpoint has that this code
    no longer declares is still another setting."""
    before_the_key = {key: value for key, value in DEFAULTS.items() if key != "site-damping"}
    CheckpointStore(tmp_path, "fed", before_the_key).save(checkpoint())
    upgraded = CheckpointStore(tmp_path, "fed", DEFAULTS, defaults=DEFAULTS)
    assert upgraded.load().server_round == 3
    changed = {**DEFAULTS, "site-damping": 1.0}
    with pytest.raises(CheckpointError, match=r"site-damping: None -> 1\.0"):
        CheckpointStore(tmp_path, "fed", changed, defaults=DEFAULTS).load()
    with pytest.raises(CheckpointError, match=r"site-damping: None -> 0\.0"):
        CheckpointStore(tmp_path, "fed", DEFAULTS).load()  # no defaults given: every key counts
    CheckpointStore(tmp_path, "removed", {**DEFAULTS, "old-key": 1}).save(checkpoint())
    with pytest.raises(CheckpointError, match=r"old-key: 1 -> None"):
        CheckpointStore(tmp_path, "removed", DEFAULTS, defaults=DEFAULTS).load()


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
        {"round": 1, "accuracy": 0.1},
        {"round": 2, "accuracy": 0.2},
        {"round": 3, "accuracy": 0.33},
    ]
    ResultsLog(str(path), if_exists="replace")  # a fresh run told to replace the file starts it empty
    assert path.read_text() == ""


def test_the_newest_is_linked_under_the_stable_name(tmp_path):
    checkpoints = store(tmp_path)
    checkpoints.save(checkpoint(1))
    checkpoints.save(checkpoint(2))
    assert checkpoints.path == tmp_path / "fed" / CHECKPOINT_FILE
    assert os.readlink(checkpoints.path) == "checkpoint-2.safetensors"
    with safe_open(checkpoints.path, framework="np") as newest:  # tools read it like any checkpoint file
        assert newest.metadata()["round"] == "2"
    assert sorted(path.name for path in (tmp_path / "fed").iterdir()) == [
        "checkpoint-1.safetensors",
        "checkpoint-2.safetensors",
        CHECKPOINT_FILE,
    ]


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"metadata": {"round": "-5"}}, "'round' is '-5', not a round number"),
        ({"metadata": {"round": "-5"}, "keep_checksum": True}, "'round' is '-5'"),  # named, not a bare mismatch
        ({"metadata": {"round": "2"}}, "'round' is 2, but the file is named for round 3"),
        ({"metadata": {"round": None}}, "'round' is missing"),
        ({"metadata": {"wall_seconds": "nan"}}, "'wall_seconds' is 'nan', not a finite number of seconds >= 0"),
        ({"metadata": {"wall_seconds": "-1.0"}}, "'wall_seconds' is '-1.0'"),
        ({"metadata": {"run_config": '{"lr": 0.1'}}, "'run_config' is not valid JSON"),
        ({"metadata": {"strategy": "[]"}}, "'strategy' is not a JSON object but list"),
        ({"metadata": {"strategy": '{"dual_rounds": 2}'}}, "'strategy' is not an object of strings"),
        ({"metadata": {"checksum": None}, "keep_checksum": True}, "'checksum' is missing"),
        (
            {"tensors": {"global/1.weight": np.array([[0, np.nan, 0], [0, 0, 0]], np.float32)}},
            r"'global/1.weight' holds non-finite values \(1 NaN, 0 infinite of 6\)",
        ),
        ({"tensors": {"strategy/duals/a/mean": np.array([0, np.inf])}}, "'strategy/duals/a/mean' holds non-finite"),
        (
            {"tensors": {"global/1.weight": np.zeros((3, 2), np.float32)}},
            r"'global/1.weight' has shape \(3, 2\), the "
            r"model's is \(2, 3\)",
        ),
        ({"tensors": {"global/1.bias": np.ones(2)}}, "'global/1.bias' has dtype float64, the model's is float32"),
        ({"tensors": {"global/1.bias": None}}, "'global/1.bias' is missing"),
        ({"tensors": {"global/2.weight": np.ones(2, np.float32)}}, "'global/2.weight' is not an array of the model"),
        (
            {"metadata": {"run_config": json.dumps({**DEFAULTS, "lr": 0.5})}, "keep_checksum": True},
            "'checksum' does not match the file's contents",
        ),
    ],
)
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_field(tmp_path, edit, field):
    checkpoints = store(tmp_path)
    checkpoints.save(checkpoint(3))
    rewrite(checkpoints.round_path(3), **edit)
    with pytest.raises(CheckpointError, match=field) as refused:
        checkpoints.load()
    assert f"server checkpoint {checkpoints.round_path(3)} is damaged" in str(refused.value)


def test_a_flipped_byte_is_caught_by_the_checksum(tmp_path):
    checkpoints = store(tmp_path)
    checkpoints.save(checkpoint(3))
    data = bytearray(checkpoints.round_path(3).read_bytes())
    data[-4] ^= 1  # a low mantissa bit of the last tensor's last value: still a finite number
    checkpoints.round_path(3).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{checkpoints.round_path(3)} is damaged: 'checksum' does not match"):
        checkpoints.load()


def test_a_truncated_checkpoint_is_unreadable(tmp_path):
    checkpoints = store(tmp_path)
    checkpoints.save(checkpoint(3))
    data = checkpoints.round_path(3).read_bytes()
    checkpoints.round_path(3).write_bytes(data[: len(data) - 10])
    with pytest.raises(CheckpointError, match=f"server checkpoint {checkpoints.round_path(3)} is unreadable"):
        checkpoints.load()


def test_a_checkpoint_of_another_format_is_refused(tmp_path):
    """A federation checkpointed by an earlier version has only checkpoint.safetensors: refused, not replaced."""
    legacy = tmp_path / "fed" / CHECKPOINT_FILE
    legacy.parent.mkdir()
    save_file({"global/1.bias": np.ones(2, np.float32)}, legacy, metadata={"format": "3", "round": "2"})
    with pytest.raises(CheckpointError, match=f"{legacy} has format '3', this version reads '4'"):
        store(tmp_path).load()


@pytest.mark.parametrize(
    ("arrays", "strategy_tensors", "refusal"),
    [
        (
            {**model_arrays(), "1.bias": np.array([1, np.inf], np.float32)},
            None,
            r"'global/1.bias' holds non-finite values \(0 NaN, 1 infinite of 2\)",
        ),
        (None, {"duals/a/mean": np.array([np.nan, 1.0])}, "'strategy/duals/a/mean' holds non-finite values"),
        ({**model_arrays(), "1.weight": np.zeros((3, 2), np.float32)}, None, r"'1.weight' has shape \(3, 2\)"),
        ({"1.weight": model_arrays()["1.weight"]}, None, "'1.bias' is missing"),
        ({**model_arrays(), "extra": np.zeros(1, np.float32)}, None, "'extra' is not an array of the model"),
    ],
)
def test_save_refuses_a_bad_state_and_writes_nothing(tmp_path, arrays, strategy_tensors, refusal):
    checkpoints = store(tmp_path)
    checkpoints.save(checkpoint(1))
    before = {path.name: path.read_bytes() for path in (tmp_path / "fed").iterdir()}
    with pytest.raises(CheckpointError, match=f"refusing to write the checkpoint of round 2 .*{refusal}"):
        checkpoints.save(checkpoint(2, arrays, strategy_tensors))
    assert {path.name: path.read_bytes() for path in (tmp_path / "fed").iterdir()} == before  # no temp file either
    assert os.readlink(checkpoints.path) == "checkpoint-1.safetensors"


def test_the_last_keep_checkpoints_are_kept(tmp_path):
    checkpoints = store(tmp_path, keep=2)
    for server_round in range(1, 5):
        checkpoints.save(checkpoint(server_round, model_arrays(server_round)))
    assert checkpoints.kept_rounds() == [3, 4]
    assert os.readlink(checkpoints.path) == "checkpoint-4.safetensors"
    assert checkpoints.load().server_round == 4


def test_resume_from_round_loads_that_kept_round(tmp_path):
    for server_round in range(1, 4):
        store(tmp_path).save(checkpoint(server_round, model_arrays(server_round)))
    loaded = store(tmp_path, resume_from_round=2).load()
    assert loaded.server_round == 2
    np.testing.assert_array_equal(loaded.arrays["1.weight"], model_arrays(2)["1.weight"])
    with pytest.raises(
        CheckpointError,
        match=r"resume-from-round=7: .* holds no checkpoint of that round "
        r"\(kept rounds: 1, 2, 3; 0 resumes from the newest\)",
    ):
        store(tmp_path, resume_from_round=7).load()
    with pytest.raises(CheckpointError, match=r"kept rounds: none"):  # a new federation: nothing to resume from
        CheckpointStore(tmp_path, "new", DEFAULTS, resume_from_round=2).load()


def test_a_damaged_newest_offers_the_intact_kept_rounds_and_falls_back_to_none(tmp_path):
    checkpoints = store(tmp_path)
    for server_round in range(1, 4):
        checkpoints.save(checkpoint(server_round, model_arrays(server_round)))
    rewrite(checkpoints.round_path(3), metadata={"wall_seconds": "nan"})
    data = bytearray(checkpoints.round_path(2).read_bytes())
    data[-4] ^= 1
    checkpoints.round_path(2).write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as refused:
        checkpoints.load()
    assert str(refused.value) == (
        f"server checkpoint {checkpoints.round_path(3)} is damaged: 'wall_seconds' is 'nan', not a finite number of "
        "seconds >= 0; intact kept checkpoints: rounds 1; to resume from round 1: set resume-from-round=1 (the "
        "rounds after it run again)"
    )
    assert store(tmp_path, resume_from_round=1).load().server_round == 1


def test_resuming_from_an_older_round_drops_the_later_ones_before_running(tmp_path):
    """Rounds 3 and 4 run again from round 2's checkpoint: their old checkpoints are gone before round 3 runs (a
    crash now resumes from round 2, whose rows the results file holds), and the new ones replace them."""

    def reply(value):
        return lambda server_round, node: fedavg_reply(f"client-{node}", server_round, value=value)

    initial = weights(0.0)
    run(
        tmp_path,
        reply(1.0),
        rounds=4,
        checkpoints=CheckpointStore(tmp_path / "state", "fed", {}, initial_arrays=initial),
    )
    resumed = CheckpointStore(tmp_path / "state", "fed", {}, initial_arrays=initial, resume_from_round=2)
    kept_while_round_3_ran = []

    def evaluate(arrays, server_round):
        if server_round == 3:
            kept_while_round_3_ran.extend(resumed.kept_rounds())
        return {"accuracy": float(arrays["fc.bias"].numpy()[0]), "nll": 0.0, "ece": 0.0}

    run(tmp_path, reply(3.0), rounds=4, evaluate=evaluate, checkpoints=resumed)
    assert kept_while_round_3_ran == [2]
    newest = CheckpointStore(tmp_path / "state", "fed", {}, initial_arrays=initial).load()
    assert newest.server_round == 4 and float(newest.arrays["fc.bias"][0]) == 3.0
    assert resumed.kept_rounds() == [2, 3, 4]
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [(row["round"], row.get("accuracy")) for row in rows][2:] == [(3, 3.0), (4, 3.0)]
