"""The checks made before anything starts, and the one-line reports the command-line tools read back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torchvision.datasets

from fedbayes.deploy.launcher import _line_count, _read_rows
from fedbayes.server.loop import ResultsLog
from fedbayes.server.preflight import check_model_and_strategy
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.preflight import (
    CLIENT_MEMORY,
    TORCHVISION_FILES,
    check_dataset_files,
    check_output_paths,
    check_split_file,
    unwritable,
)
from fedbayes.tasks.runlog import error_reason, failure_reason, run_failed_line
from tests.support import settings
from tests.support.crafted import in_child


def torchvision_files(dataset: str) -> tuple[str, set[str]]:
    """The folder under the root and the files in it that torchvision itself checks for."""
    cls = getattr(
        torchvision.datasets,
        {"fmnist": "FashionMNIST", "mnist": "MNIST", "cifar10": "CIFAR10", "cifar100": "CIFAR100"}[dataset],
    )
    if hasattr(cls, "resources"):  # MNIST-style: the un-gzipped files in <root>/<class>/raw
        return f"{cls.__name__}/raw", {os.path.splitext(os.path.basename(url))[0] for url, _ in cls.resources}
    return cls.base_folder, {name for name, _ in cls.train_list + cls.test_list} | {cls.meta["filename"]}


@pytest.mark.parametrize("dataset", sorted(TORCHVISION_FILES))
def test_the_files_checked_are_the_ones_torchvision_reads(dataset):
    folder, names = TORCHVISION_FILES[dataset]
    assert (folder, set(names)) == torchvision_files(dataset)


def test_a_complete_torchvision_folder_passes_and_a_missing_file_is_named(tmp_path):
    folder, names = TORCHVISION_FILES["cifar10"]
    for name in names:
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / name).write_bytes(b"")
    check_dataset_files(settings(dataset="cifar10", data_root=str(tmp_path)))
    (tmp_path / folder / "test_batch").unlink()
    with pytest.raises(ConfigError, match=r"^run config 'data-root': .* \(missing cifar-10-batches-py/test_batch\)"):
        check_dataset_files(settings(dataset="cifar10", data_root=str(tmp_path)))
    check_dataset_files(settings(dataset="cifar10", data_root=str(tmp_path), download=True))  # torchvision fetches it


def test_a_failure_is_reported_on_one_line_with_its_type():
    line = run_failed_line(ValueError("first line\n  second line"))
    assert line == "fedbayes run failed: ValueError: first line second line"
    assert failure_reason(f"ERROR :      {line}") == "ValueError: first line second line"
    assert failure_reason("INFO :      round 1/3") is None
    assert error_reason(RuntimeError()) == "RuntimeError"  # a run_ended event's reason (tasks/events.py)


def test_an_empty_federation_means_new_and_a_name_must_be_safe():
    assert settings(federation="").federation == ""
    with pytest.raises(ConfigError, match="'federation' must be \"\" \\(a new federation\\) or match"):
        settings(federation="../x")


# ---- output paths, results files, payload and memory bounds (issue 27) ------------------------------------------
UNWRITABLE = Path("/sys/fedbayes-probe")  # sysfs refuses a new file even to root


def test_a_writable_path_is_found_by_a_probe_that_leaves_nothing_behind(tmp_path):
    (tmp_path / "rows.jsonl").write_text("mine\n")
    assert unwritable(tmp_path / "rows.jsonl", directory=False) is None
    assert unwritable(tmp_path / "new" / "deeper" / "rows.jsonl", directory=False) is None
    assert unwritable(tmp_path / "state", directory=True) is None
    assert unwritable(tmp_path, directory=True) is None
    assert [path.name for path in tmp_path.iterdir()] == ["rows.jsonl"] and (
        tmp_path / "rows.jsonl"
    ).read_text() == "mine\n"


def test_an_unwritable_path_says_why(tmp_path):
    (tmp_path / "file").write_text("")
    assert unwritable(tmp_path, directory=False) == f"{tmp_path} is a directory, not a file"
    assert unwritable(tmp_path / "file", directory=True) == f"{tmp_path / 'file'} is not a directory"
    assert (
        unwritable(tmp_path / "file" / "x", directory=True)
        == f"{tmp_path / 'file' / 'x'} cannot be made: {tmp_path / 'file'} is not a directory"
    )
    assert unwritable(UNWRITABLE / "state", directory=True).startswith(
        f"{UNWRITABLE / 'state'} is not writable by this user: /sys: "
    )


@pytest.mark.parametrize(
    ("key", "path", "message"),
    [
        ("server-state-dir", "{tmp}/file", "run config 'server-state-dir': {tmp}/file is not a directory"),
        (
            "server-state-dir",
            str(UNWRITABLE),
            f"run config 'server-state-dir': {UNWRITABLE} is not writable by this user",
        ),
        ("results-path", "{tmp}", "run config 'results-path': {tmp} is a directory, not a file"),
        (
            "results-path",
            str(UNWRITABLE / "r.jsonl"),
            f"run config 'results-path': {UNWRITABLE / 'r.jsonl'} is not writable",
        ),
    ],
)
def test_output_paths_the_server_cannot_write_are_refused_by_key(tmp_path, key, path, message):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError) as refusal:
        check_output_paths(settings(**{key: path.format(tmp=tmp_path)}), new_federation=True)
    assert str(refusal.value).startswith(message.format(tmp=tmp_path))


def test_a_new_federation_refuses_a_results_file_that_holds_rows_unless_told_to_append_or_replace(tmp_path):
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 1}\n')
    with pytest.raises(ConfigError) as refusal:
        check_output_paths(settings(results_path=str(results)), new_federation=True)
    assert str(refusal.value).startswith(
        f"run config 'results-path': {results} is not empty and results-exists is 'refuse' (the file was left as it is)"
    )
    for told in ("append", "replace"):
        check_output_paths(settings(results_path=str(results), results_exists=told), new_federation=True)
    check_output_paths(settings(results_path=str(results), federation="fed"), new_federation=False)  # a resume
    with pytest.raises(ConfigError, match="is not empty"):  # a run config naming no federation starts a new one
        check_output_paths(settings(results_path=str(results), federation=""), new_federation=False)
    results.write_text("")
    check_output_paths(settings(results_path=str(results)), new_federation=True)  # nothing in it to lose
    assert results.read_text() == ""


def test_a_split_file_that_cannot_be_read_is_refused_by_key(tmp_path):
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(ConfigError, match=f"^run config 'split-file': cannot read {path} "):
            check_split_file(str(path))
    (tmp_path / "split.json").write_text("[[0]]")
    check_split_file(str(tmp_path / "split.json"))
    check_split_file("")  # none: every client draws the split


@pytest.mark.parametrize(
    ("strategy", "values"),
    [
        ("fedavg", 178_110),  # the weights, P (784-200-100-10 MLP)
        ("bayesadmm", 4 * 178_110),  # local mean and precision, dual mean and precision
        ("dsvgd", 20 * 178_110),  # the particles, N x P
    ],
)
def test_max_payload_mb_below_one_reply_is_refused_with_the_replys_size(strategy, values):
    fits = values * 4 / 2**20
    check_model_and_strategy(settings(strategy=strategy, max_payload_mb=fits))
    with pytest.raises(ConfigError) as refusal:
        check_model_and_strategy(settings(strategy=strategy, max_payload_mb=0.99 * fits))
    message = str(refusal.value)
    assert message.startswith(
        f"run config 'max-payload-mb' ({0.99 * fits:g}) is below one reply of {values:,} float32 values"
    ), message
    assert "an estimate from the parameter count, a lower bound" in message and f"'strategy' ({strategy})" in message


def test_particles_beyond_this_machines_memory_are_refused_before_any_is_allocated():
    with pytest.raises(ConfigError) as refusal:
        check_model_and_strategy(settings(strategy="dsvgd", particles=10**8))
    message = str(refusal.value)
    assert message.startswith("this run needs at least") and "more than this machine's" in message
    assert "run config 'strategy' (dsvgd), 'model' (mlp), 'hidden' (200,100), 'particles' (100000000)" in message


def test_clients_beyond_this_machines_memory_are_refused_naming_the_option():
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    clients = memory // CLIENT_MEMORY + 1
    check_model_and_strategy(settings(), clients=None)  # the ServerApp starts no client
    with pytest.raises(ConfigError, match=f"{clients} clients \\(fedbayes local: --clients\\) take 90 MiB each"):
        check_model_and_strategy(settings(), clients=clients)


# ---- the results file at the ServerApp's start (server/loop.py ResultsLog) ---------------------------------------
def rows_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_a_new_federation_leaves_a_results_file_holding_rows_as_it_is(tmp_path):
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 1, "mine": true}\n')
    with pytest.raises(ConfigError, match="run config 'results-path': .* is not empty and results-exists is 'refuse'"):
        ResultsLog(str(results))
    assert results.read_text() == '{"round": 1, "mine": true}\n'
    ResultsLog(str(tmp_path / "empty.jsonl")).write({"round": 1})  # no file: nothing to refuse
    assert rows_of(tmp_path / "empty.jsonl") == ['{"round": 1}']


def test_results_exists_append_keeps_every_line_and_replace_starts_over(tmp_path):
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 1, "earlier": true}\nmy note without a newline')
    ResultsLog(str(results), if_exists="append").write({"round": 1})
    assert rows_of(results) == ['{"round": 1, "earlier": true}', "my note without a newline", '{"round": 1}']
    ResultsLog(str(results), if_exists="replace").write({"round": 1})
    assert rows_of(results) == ['{"round": 1}']


def test_a_resume_drops_only_its_own_rows_after_the_checkpoint(tmp_path):
    """Appended to an earlier run's rows, a resumed federation drops the rows it runs again, at the file's end, and
    keeps the earlier run's, whatever their round."""
    results = tmp_path / "mine.jsonl"
    earlier = ['{"round": 1, "earlier": true}', '{"round": 5, "earlier": true}']
    results.write_text("\n".join(earlier) + "\n")
    appended = ResultsLog(str(results), if_exists="append")
    for server_round in (1, 2, 3):
        appended.write({"round": server_round})
    with results.open("a") as cut_short:
        cut_short.write('{"round": 4, "accur')
    ResultsLog(str(results), keep_through_round=2).write({"round": 3, "again": True})
    assert rows_of(results) == [*earlier, '{"round": 1}', '{"round": 2}', '{"round": 3, "again": true}']


def test_a_federation_started_again_before_its_first_checkpoint_drops_only_its_own_rows(tmp_path):
    """Stopped between round 1's row and its checkpoint, a federation starts again as new: it must neither refuse
    its own row as an earlier run's nor drop the earlier run's rows it was appended to."""
    results, start = tmp_path / "mine.jsonl", tmp_path / "server-state" / "fed" / "results-start.json"
    earlier = ['{"round": 1, "earlier": true}', '{"round": 5, "earlier": true}']
    results.write_text("\n".join(earlier) + "\n")
    ResultsLog(str(results), if_exists="append", start_record=start).write({"round": 1})
    with results.open("a") as cut_short:
        cut_short.write('{"round": 2, "accur')
    ResultsLog(str(results), start_record=start).write({"round": 1, "again": True})  # "refuse" does not apply
    assert rows_of(results) == [*earlier, '{"round": 1, "again": true}']
    other = tmp_path / "other.jsonl"  # the record holds for the file it was made for only
    other.write_text('{"round": 1}\n')
    with pytest.raises(ConfigError, match="is not empty"):
        ResultsLog(str(other), start_record=start)
    assert other.read_text() == '{"round": 1}\n'


def test_rows_appended_after_a_users_lines_are_the_only_ones_fedbayes_local_reads_as_the_runs(tmp_path):
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 7}\nnot json, and no newline')
    earlier_lines = _line_count(results)  # what `fedbayes local` counts before it starts the federation
    ResultsLog(str(results), if_exists="append").write({"round": 1})
    assert _read_rows(results, earlier_lines) == [{"round": 1}]


@pytest.mark.parametrize(
    ("config", "clients", "named"),
    [
        ({"strategy": "fedavg", "hidden": "100000,100000"}, 2, "'model' (mlp), 'hidden' (100000,100000)"),
        ({"strategy": "dsvgd", "particles": 10**9}, 2, "'particles' (1000000000)"),
        ({"strategy": "fedavg"}, 10**9, "1000000000 clients (fedbayes local: --clients)"),
    ],
)
def test_a_run_too_large_for_this_machine_is_refused_before_its_memory_is_spent(tmp_path, config, clients, named):
    """What `fedbayes local` checks before it starts a process, in a child: refused by the memory check, the model
    laid out on the meta device, never built (100000x100000 hidden: 40 GB of weights)."""
    code = (
        "from fedbayes.server.preflight import check_model_and_strategy\n"
        "from fedbayes.strategies import default_run_config, run_settings\n"
        f"config = {config!r}\n"
        "settings = run_settings({**default_run_config(config['strategy']), **config})\n"
        f"check_model_and_strategy(settings, clients={clients})"
    )
    child = in_child(code, cwd=tmp_path)
    assert child.error is not None and child.error.startswith("ConfigError: this run needs at least"), child.error
    assert named in child.error and "more than this machine's" in child.error
    assert child.extra_mib < 256, child.extra_mib
