"""`fedbayes local` refuses what would fail later before it starts any process, naming the run-config key,
and never empties a directory it is given."""

from __future__ import annotations

import pytest
import torch

from fedbayes.deploy.cli import _without_workdir
from tests.clihelpers import fedbayes

LOCAL = ["local", "--strategy", "fedavg", "--clients", "2", "--rounds", "1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "cifar10"], "run config 'data-root' is empty, and dataset 'cifar10' has no default location"),
        (["--dataset", "cifar100", "--data-root", "{empty}"],
         "run config 'data-root': dataset 'cifar100' is not under {empty} (missing cifar-100-python/train"),
        (["--set", "hidden=abc"], "run config 'hidden': hidden must be comma-separated positive integers"),
        (["--set", "pool=64"], "run config 'pool' (64) does not fit the 28x28 images of 'fmnist'"),
        (["--set", "min-clients=3"], "run config 'min-clients' is 3, more than the federation's 2 clients"),
        (["--set", "wait-for-clients=3"], "run config 'wait-for-clients' is 3, more than the federation's 2 clients"),
        (["--set", "device=gpu"], "run config 'device' must be one of auto, cpu, cuda"),
        (["--set", "lr=inf"], "run config 'lr' must be finite"),
        (["--strategy", "bayesadmm-full"], "strategy 'bayesadmm-full' needs model=logreg"),
    ],
)
def test_a_run_this_machine_cannot_do_is_refused_before_any_process_starts(tmp_path, args, message):
    empty = tmp_path / "data"
    empty.mkdir()
    workdir = tmp_path / "run"
    args = [arg.format(empty=empty) for arg in args]
    result = fedbayes([*LOCAL, "--workdir", str(workdir), *args])
    print(f"refused in {result.seconds:.1f} s: {' '.join(args)}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith(f"fedbayes: error: {message.format(empty=empty)}")
    assert not workdir.exists(), "the launcher makes its workdir only when it starts the federation's processes"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has the GPU the refusal is about")
def test_device_cuda_without_a_gpu_is_refused_not_run_on_the_cpu(tmp_path):
    result = fedbayes([*LOCAL, "--workdir", str(tmp_path / "run"), "--set", "device=cuda"])
    print(f"refused in {result.seconds:.1f} s: --set device=cuda")
    assert result.returncode == 1
    assert "run config 'device' is 'cuda', but torch sees no CUDA GPU" in result.last_error_line
    assert not (tmp_path / "run").exists()


def test_a_workdir_holding_a_federation_is_kept_as_it_is(tmp_path):
    workdir = tmp_path / "fed"
    checkpoint = workdir / "server-state" / "fed" / "checkpoint.safetensors"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"the only copy")
    (workdir / "flwr-home").mkdir()
    result = fedbayes([*LOCAL, "--workdir", str(workdir)])
    assert result.returncode == 1
    assert "already holds federation 'fed'; add --resume to continue it" in result.last_error_line
    assert checkpoint.read_bytes() == b"the only copy"
    assert sorted(path.name for path in workdir.iterdir()) == ["flwr-home", "server-state"]


def test_a_directory_of_other_files_is_no_workdir(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    refusals = (([], "exists and is not an empty directory"), (["--resume"], "holds no federation to resume"))
    for extra, message in refusals:
        result = fedbayes([*LOCAL, "--workdir", str(tmp_path), *extra])
        assert result.returncode == 1 and message in result.last_error_line, result.stderr
        assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"] and notes.read_text() == "mine"


def test_resume_needs_a_federation_to_resume(tmp_path):
    result = fedbayes([*LOCAL, "--workdir", str(tmp_path / "nothing-here"), "--resume"])
    assert result.returncode == 1 and "holds no federation to resume" in result.last_error_line
    assert not (tmp_path / "nothing-here").exists()


def test_the_resume_command_is_the_command_with_its_workdir():
    argv = ["local", "--strategy", "fedavg", "--workdir", "old", "--rounds", "3", "--workdir=older", "--resume"]
    assert _without_workdir(argv) == ["local", "--strategy", "fedavg", "--rounds", "3"]
