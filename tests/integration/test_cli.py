"""`fedbayes local` refuses what would fail later before it starts any process, naming the run-config key,
and never empties a directory it is given."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedbayes.deploy.pki import init_pki, make_supernode_key
from tests.support import ROOT
from tests.support.processes import LOCAL, fedbayes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "cifar10"], "run config 'data-root' is empty, and dataset 'cifar10' has no default location"),
        (
            ["--dataset", "cifar100", "--data-root", "{empty}"],
            "run config 'data-root': dataset 'cifar100' is not under {empty} (missing cifar-100-python/train",
        ),
        (["--set", "hidden=abc"], "run config 'hidden': hidden must be comma-separated positive integers"),
        (["--set", "local-epoch=3"], "unknown run-config key 'local-epoch' (did you mean 'local-epochs'?)"),
        (["--set", "pool=64"], "run config 'pool' (64) does not fit the 28x28 images of 'fmnist'"),
        (["--set", "min-clients=3"], "run config 'min-clients' is 3, more than the federation's 2 clients"),
        (["--set", "wait-for-clients=3"], "run config 'wait-for-clients' is 3, more than the federation's 2 clients"),
        (["--set", "device=gpu"], "run config 'device' must be one of auto, cpu, cuda"),
        (["--set", "lr=inf"], "run config 'lr' must be finite"),
        (["--strategy", "bayesadmm-full"], "strategy 'bayesadmm-full' needs model=logreg"),
        (["--set", "seed=-1"], "run config 'seed' must be in [0, 2^32)"),
        (["--set", "wait-for-clients-timeout=-1"], "run config 'wait-for-clients-timeout' must be >= 0"),
        (["--set", "max-payload-mb=1e-9"], "run config 'max-payload-mb' (1e-09) is below one reply of 178,110 float32"),
        (
            ["--set", "split-file=no-such-split.json"],  # relative: made absolute, as the processes run in the workdir
            "run config 'split-file': cannot read {root}/no-such-split.json (No such file or directory)",
        ),
        (["--set", "server-state-dir=/sys/fedbayes"], "run config 'server-state-dir': /sys/fedbayes is not writable"),
        (["--results", "{empty}"], "run config 'results-path': {empty} is a directory, not a file"),
        (["--workdir", "/sys/fedbayes-run"], "--workdir: /sys/fedbayes-run is not writable by this user: /sys: "),
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
    assert result.last_error_line.startswith(f"fedbayes: error: {message.format(empty=empty, root=ROOT)}")
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


def test_a_results_file_the_user_made_is_refused_and_kept(tmp_path):
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 1, "mine": true}\n')
    result = fedbayes([*LOCAL, "--workdir", str(tmp_path / "run"), "--results", str(results)])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith(
        f"fedbayes: error: run config 'results-path': {results} is not empty "
        "and results-exists is 'refuse' (the file was left as it is)"
    )
    assert "--set results-exists=append" in result.last_error_line
    assert results.read_text() == '{"round": 1, "mine": true}\n'
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (
            ["--strategy", "dsvgd", "--set", "particles=100000000"],
            "run config 'strategy' (dsvgd), 'model' (mlp), 'hidden' (200,100), 'particles' (100000000): the server "
            "holds 3 copies",
        ),
        (
            ["--set", "hidden=100000,100000"],  # 40 GB of weights: laid out on the meta device, never built
            "'model' (mlp), 'hidden' (100000,100000): the server holds 3 copies of one reply of 10,079,600,010",
        ),
        (["--clients", "1000000"], "1000000 clients (fedbayes local: --clients) take 90 MiB each"),
    ],
)
def test_a_run_larger_than_this_machines_memory_is_refused_naming_what_takes_it(tmp_path, args, names):
    result = fedbayes([*LOCAL, "--workdir", str(tmp_path / "run"), *args])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.last_error_line.startswith("fedbayes: error: this run needs at least")
    assert names in result.last_error_line
    assert not (tmp_path / "run").exists()


@pytest.fixture
def client_files(tmp_path):
    """A CA certificate, a SuperNode key, a data file and a plain file, for `fedbayes client`."""
    init_pki(tmp_path / "pki")
    make_supernode_key(tmp_path / "keys", "c1")
    np.savez(tmp_path / "data.npz", x=np.zeros((4, 1, 28, 28), np.uint8), y=np.arange(4))
    (tmp_path / "file").write_text("not a certificate, key or .npz")
    return tmp_path
