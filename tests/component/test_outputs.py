"""No command overwrites what it did not write in this call (tasks/storage.py check_new_files, check_output_folder):
each command with an output path, run in process onto a canary (a file or folder of the user's), is refused before it
does any work, naming the path and --force, with the canary's bytes and mtime unchanged; with --force it replaces
what it writes and nothing else."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fedbayes.deploy.cli import main
from fedbayes.posterior import load
from fedbayes.tasks.report import REPORT_FILES
from fedbayes.tasks.storage import OutputExists, check_new_files, check_output_folder
from tests.component.test_export import Trained
from tests.support import write_npz

CANARY = b"the user's own file\n"


def canary(path):
    """A file of the user's at `path`; what must stay of it (bytes, mtime)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(CANARY)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # long ago: a rewrite in this test would move it
    return path.read_bytes(), path.stat().st_mtime_ns


def kept(path, before) -> bool:
    return (path.read_bytes(), path.stat().st_mtime_ns) == before


def refused(capsys, argv, *expected: str) -> str:
    """`fedbayes argv` exits 1 with one error line that says each of `expected`; that line."""
    assert main(argv) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("fedbayes: error: "), error
    for text in expected:
        assert text in error, error
    return error


@pytest.fixture
def dataset(tmp_path):
    """npz:DIR of 40 training and 12 test examples, 2 classes."""
    folder = tmp_path / "dataset"
    rng = np.random.default_rng(0)
    write_npz(folder / "train.npz", x=rng.normal(size=(40, 1, 1, 4)).astype(np.float32), y=np.arange(40) % 2)
    write_npz(folder / "test.npz", x=rng.normal(size=(12, 1, 1, 4)).astype(np.float32), y=np.arange(12) % 2)
    return f"npz:{folder}"


def results_file(path):
    rows = [{"round": number, "accuracy": 0.5 + number / 10, "nll": 1.0 / number, "ece": 0.1} for number in (1, 2, 3)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---- the helper -------------------------------------------------------------------------------------------------


def test_a_file_is_refused_unless_forced_and_a_folder_or_a_path_under_a_file_always(tmp_path):
    before = canary(tmp_path / "out.npz")
    with pytest.raises(OutputExists, match=f"{tmp_path / 'out.npz'} exists already: not overwritten .* --force"):
        check_new_files([tmp_path / "out.npz", tmp_path / "new.npz"], force=False)
    check_new_files([tmp_path / "out.npz"], force=True)
    (tmp_path / "folder").mkdir()
    with pytest.raises(OutputExists, match="is a folder: this command writes a file there, and never replaces"):
        check_new_files([tmp_path / "folder"], force=True)
    with pytest.raises(OutputExists, match=f"cannot be written: {tmp_path / 'out.npz'} is a file, not a folder"):
        check_new_files([tmp_path / "out.npz" / "deeper" / "x"], force=True)
    assert kept(tmp_path / "out.npz", before)


def test_a_folder_must_be_new_or_empty_unless_forced_and_then_only_its_names_are_written(tmp_path):
    check_output_folder(tmp_path / "new", ["a", "b"], force=False)
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty", ["a", "b"], force=False)
    canary(tmp_path / "full" / "notes.txt")
    with pytest.raises(OutputExists, match=r"full is not empty \(it holds notes.txt\): .* --force writes a, b there"):
        check_output_folder(tmp_path / "full", ["a", "b"], force=False)
    check_output_folder(tmp_path / "full", ["a", "b"], force=True)
    (tmp_path / "full" / "b").mkdir()
    with pytest.raises(OutputExists, match="b is a folder"):
        check_output_folder(tmp_path / "full", ["a", "b"], force=True)
    with pytest.raises(OutputExists, match="notes.txt is a file, not a folder: this command writes a, b into"):
        check_output_folder(tmp_path / "full" / "notes.txt", ["a", "b"], force=True)


# ---- fedbayes export, predict --out ------------------------------------------------------------------------------


def test_export_and_predict_refuse_a_file_of_the_users_unless_forced(tmp_path, capsys):
    trained = Trained(tmp_path, "bayesadmm")
    out, preds = tmp_path / "q.safetensors", tmp_path / "preds"
    export = ["export", str(trained.state_dir), "--federation", "fed", "--out", str(out)]
    predict = ["predict", str(out), str(trained.data / "test.npz"), "--out", str(preds)]
    before = canary(out)
    refused(capsys, export, f"{out} exists already", "--force replaces it")
    assert kept(out, before)
    assert main([*export, "--force"]) == 0
    assert load(out).header.round == 2
    before = canary(preds)
    refused(capsys, predict, f"{preds} exists already")
    assert kept(preds, before)
    assert main([*predict, "--force"]) == 0
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("preds")) == ["preds"]  # as named
    assert np.load(preds)["probs"].shape == (60, 2)
    assert (tmp_path / "preds").stat().st_mode & 0o777 == 0o644


def test_export_refuses_before_reading_the_run(tmp_path, capsys):
    before = canary(tmp_path / "q.safetensors")
    refused(capsys, ["export", str(tmp_path / "no-run"), "--out", str(tmp_path / "q.safetensors")], "exists already")
    assert kept(tmp_path / "q.safetensors", before)


# ---- fedbayes report --------------------------------------------------------------------------------------------


def test_report_refuses_a_folder_of_the_users_and_with_force_writes_beside_their_files(tmp_path, capsys):
    out, results = tmp_path / "out", results_file(tmp_path / "r.jsonl")
    before = canary(out / "notes.txt")
    refused(capsys, ["report", str(results), "--out", str(out)], f"{out} is not empty (it holds notes.txt)", "--force")
    assert sorted(path.name for path in out.iterdir()) == ["notes.txt"] and kept(out / "notes.txt", before)
    assert main(["report", str(results), "--out", str(out), "--force"]) == 0
    assert sorted(path.name for path in out.iterdir()) == sorted([*REPORT_FILES, "notes.txt"])
    assert kept(out / "notes.txt", before)


def test_report_refuses_an_earlier_report_and_with_force_replaces_its_files(tmp_path, capsys):
    out, results = tmp_path / "out", results_file(tmp_path / "r.jsonl")
    assert main(["report", str(results), "--out", str(out)]) == 0
    earlier = {name: canary(out / name) for name in ("index.html", "metrics.png")}
    refused(capsys, ["report", str(results), "--out", str(out)], "it holds clients.png, index.html, metrics.png")
    assert all(kept(out / name, before) for name, before in earlier.items())
    assert main(["report", str(results), "--out", str(out), "--force"]) == 0
    assert (out / "metrics.png").read_bytes().startswith(b"\x89PNG") and "<html" in (out / "index.html").read_text()


def test_report_refuses_before_reading_any_run(tmp_path, capsys):
    before = canary(tmp_path / "out" / "notes.txt")
    refused(capsys, ["report", str(tmp_path / "no-such-run"), "--out", str(tmp_path / "out")], "is not empty")
    assert kept(tmp_path / "out" / "notes.txt", before)


# ---- export-partitions, partitions --write, app ------------------------------------------------------------------


def test_export_partitions_refuses_a_folder_of_the_users_and_with_force_replaces_only_its_files(
    tmp_path, capsys, dataset
):
    out = tmp_path / "data"
    argv = ["export-partitions", "--dataset", dataset, "--clients", "2", "--out", str(out)]
    before, test_before = canary(out / "README"), canary(out / "test.npz")
    refused(capsys, argv, f"{out} is not empty (it holds README, test.npz)", "--force writes client-0.npz")
    assert sorted(path.name for path in out.iterdir()) == ["README", "test.npz"] and kept(out / "test.npz", test_before)
    assert main([*argv, "--force"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["README", "client-0.npz", "client-1.npz", "test.npz"]
    assert kept(out / "README", before) and len(np.load(out / "test.npz")["y"]) == 12


def test_export_partitions_with_force_refuses_a_folder_whose_other_data_files_it_would_not_replace(
    tmp_path, capsys, dataset
):
    """An earlier export of 3 clients: client-2.npz, left beside a new export of 2, would make the folder another
    federation's data."""
    out = tmp_path / "data"
    assert main(["export-partitions", "--dataset", dataset, "--clients", "3", "--out", str(out)]) == 0
    stale = canary(out / "client-2.npz")
    argv = ["export-partitions", "--dataset", dataset, "--clients", "2", "--out", str(out), "--force"]
    refused(capsys, argv, f"{out} holds client-2.npz, which an export of 2 clients does not replace")
    assert kept(out / "client-2.npz", stale)


def test_partitions_write_refuses_an_existing_file_unless_forced(tmp_path, capsys, dataset):
    split = tmp_path / "split.json"
    before = canary(split)
    argv = ["partitions", "--dataset", dataset, "--clients", "2", "--write", str(split)]
    refused(capsys, argv, f"{split} exists already", "--force replaces it")
    assert kept(split, before)
    assert main([*argv, "--force"]) == 0
    assert sorted(index for part in json.loads(split.read_text()) for index in part) == list(range(40))


def test_app_refuses_a_pyproject_of_the_users_unless_forced(tmp_path, capsys):
    pyproject = tmp_path / "project" / "pyproject.toml"
    before = canary(pyproject)
    refused(capsys, ["app", str(pyproject.parent)], f"{pyproject} exists already")
    assert kept(pyproject, before)
    assert main(["app", str(pyproject.parent), "--force"]) == 0
    assert "[tool.flwr.app.config]" in pyproject.read_text()
    assert main(["app", str(tmp_path / "other")]) == 0  # a folder with files but no pyproject.toml: nothing to replace


# ---- fedbayes pki -----------------------------------------------------------------------------------------------


def test_pki_init_refuses_a_folder_with_a_superlink_certificate_and_with_force_keeps_the_ca(tmp_path, capsys):
    certs = tmp_path / "certs"
    assert main(["pki", "init", "--out", str(certs)]) == 0
    files = {name: (certs / name).read_bytes() for name in ("ca.crt", "ca.key", "server.pem", "server.key")}
    mtimes = {name: (certs / name).stat().st_mtime_ns for name in files}
    refused(capsys, ["pki", "init", "--out", str(certs), "--name", "fl.example.org"], "server.pem", "--force")
    assert {name: ((certs / name).read_bytes(), (certs / name).stat().st_mtime_ns) for name in files} == {
        name: (files[name], mtimes[name]) for name in files
    }
    assert main(["pki", "init", "--out", str(certs), "--name", "fl.example.org", "--force"]) == 0
    assert (certs / "ca.key").read_bytes() == files["ca.key"] and (certs / "ca.crt").read_bytes() == files["ca.crt"]
    assert (certs / "server.key").read_bytes() != files["server.key"]
    assert (certs / "server.key").stat().st_mode & 0o777 == 0o600


def test_pki_init_refuses_a_ca_certificate_without_its_key(tmp_path, capsys):
    before = canary(tmp_path / "certs" / "ca.crt")
    refused(capsys, ["pki", "init", "--out", str(tmp_path / "certs")], "ca.crt exists already")
    assert kept(tmp_path / "certs" / "ca.crt", before) and not (tmp_path / "certs" / "ca.key").exists()


def test_pki_supernode_key_keeps_a_pair_and_refuses_a_lone_public_key_unless_forced(tmp_path, capsys):
    keys = tmp_path / "keys"
    assert main(["pki", "supernode-key", "--out", str(keys), "client-0"]) == 0
    pair = {name: (keys / name).read_bytes() for name in ("client-0", "client-0.pub")}
    lone = canary(keys / "client-1.pub")
    refused(capsys, ["pki", "supernode-key", "--out", str(keys), "client-0", "client-1"], "client-1.pub exists")
    assert kept(keys / "client-1.pub", lone) and not (keys / "client-1").exists()
    assert main(["pki", "supernode-key", "--out", str(keys), "client-0", "client-1", "--force"]) == 0
    assert {name: (keys / name).read_bytes() for name in pair} == pair  # the pair is kept, forced or not
    assert (keys / "client-1.pub").read_bytes().startswith(b"ecdsa-sha2-nistp384 ") and (keys / "client-1").exists()
    refused(capsys, ["pki", "supernode-key", "--out", str(keys), "../outside"], "'../outside' must match")
    assert not (tmp_path / "outside").exists()


def test_pki_connection_refuses_an_existing_flwr_config_unless_forced(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    config = tmp_path / "flwr" / "config.toml"
    before = canary(config)
    argv = ["pki", "connection", "--name", "prod", "--superlink", "127.0.0.1:9093", "--ca", str(tmp_path / "ca.crt")]
    refused(capsys, argv, f"{config} exists already")
    assert kept(config, before)
    assert main([*argv, "--force"]) == 0
    assert 'default = "prod"' in config.read_text()
