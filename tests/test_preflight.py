"""The checks made before anything starts, and the one-line reports the command-line tools read back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torchvision.datasets

from fedbayes.tasks.config import ConfigError, RunSettings, pyproject_run_config
from fedbayes.tasks.preflight import TORCHVISION_FILES, check_dataset_files
from fedbayes.tasks.runlog import failure_reason, new_federation, new_federation_line, run_failed_line

DEFAULTS = pyproject_run_config(Path(__file__).resolve().parents[1] / "pyproject.toml")


def settings(**overrides) -> RunSettings:
    return RunSettings.from_run_config({**DEFAULTS, **{key.replace("_", "-"): v for key, v in overrides.items()}})


def torchvision_files(dataset: str) -> tuple[str, set[str]]:
    """The folder under the root and the files in it that torchvision itself checks for."""
    cls = getattr(torchvision.datasets, {"fmnist": "FashionMNIST", "mnist": "MNIST", "cifar10": "CIFAR10",
                                         "cifar100": "CIFAR100"}[dataset])
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


def test_a_new_federation_is_announced_by_name():
    assert new_federation(f"INFO :      {new_federation_line('20260101-120000-ab12')}") == "20260101-120000-ab12"
    assert new_federation("INFO :      fedbayes: federation x, strategy fedavg") is None


def test_an_empty_federation_means_new_and_a_name_must_be_safe():
    assert settings(federation="").federation == ""
    with pytest.raises(ConfigError, match="'federation' must be \"\" \\(a new federation\\) or match"):
        settings(federation="../x")
