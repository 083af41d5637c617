"""`fedbayes local` refuses what would fail later before it starts any process, naming the run-config key,
and never empties a directory it is given."""

from __future__ import annotations

import numpy as np
import pytest

from fedbayes.deploy import processes
from fedbayes.deploy.cli import main
from fedbayes.deploy.pki import init_pki, make_supernode_key
from tests.support.processes import LOCAL

CLIENT = ["client", "--superlink", "127.0.0.1:1", "--ca", "{ca}", "--key", "{key}"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*LOCAL, "--seed", "-1"], "argument --seed: must be in [0, 2^32), got '-1'"),
        ([*LOCAL, "--seed", str(2**32)], f"argument --seed: must be in [0, 2^32), got '{2**32}'"),
        (
            ["local", "--strategy", "fedavg", "--rounds", "1", "--clients", "0"],
            "argument --clients: must be >= 1, got '0'",
        ),
        (
            ["local", "--strategy", "fedavg", "--clients", "2", "--rounds", "nan"],
            "argument --rounds: must be an integer, got 'nan'",
        ),
        ([*LOCAL, "--fraction", "inf"], "argument --fraction: must be finite, got 'inf'"),
        ([*LOCAL, "--fraction", "1.5"], "argument --fraction: must be in (0, 1], got '1.5'"),
        ([*LOCAL, "--parallel-tasks", "-1"], "argument --parallel-tasks: must be >= 0, got '-1'"),
        (["partitions", "--clients", "2", "--seed", "-5"], "argument --seed: must be in [0, 2^32), got '-5'"),
        (["export-partitions", "--out", "{tmp}/out", "--clients", "-1"], "argument --clients: must be >= 1, got '-1'"),
        ([*CLIENT, "--activation-timeout", "nan"], "argument --activation-timeout: must be finite, got 'nan'"),
        ([*CLIENT, "--activation-timeout", "inf"], "argument --activation-timeout: must be finite, got 'inf'"),
        ([*CLIENT, "--activation-timeout", "-1"], "argument --activation-timeout: must be >= 0, got '-1'"),
    ],
)
def test_a_numeric_option_out_of_range_is_refused_naming_it(tmp_path, capsys, args, message):
    argv = [arg.format(tmp=tmp_path, ca=tmp_path / "ca.crt", key=tmp_path / "key") for arg in args]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--workdir", str(tmp_path / "run")] if argv[0] == "local" else argv)
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {message}")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def client_files(tmp_path):
    """A CA certificate, a SuperNode key, a data file and a plain file, for `fedbayes client`."""
    init_pki(tmp_path / "pki")
    make_supernode_key(tmp_path / "keys", "c1")
    np.savez(tmp_path / "data.npz", x=np.zeros((4, 1, 28, 28), np.uint8), y=np.arange(4))
    (tmp_path / "file").write_text("not a certificate, key or .npz")
    return tmp_path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--ca": "{tmp}/missing.crt"}, "--ca {tmp}/missing.crt is not a readable PEM certificate file (No such file"),
        ({"--ca": "{tmp}/file"}, "--ca {tmp}/file is not a readable PEM certificate file ([X509"),
        ({"--key": "{tmp}/keys"}, "--key {tmp}/keys cannot be read (Is a directory)"),
        ({"--key": "{tmp}/file"}, "--key {tmp}/file is not an unencrypted OpenSSH private key"),
        ({"--superlink": "127.0.0.1:70000"}, "--superlink '127.0.0.1:70000': port 70000 is not in 1..65535"),
        ({"--client-id": "klinik-ü"}, "--client-id 'klinik-ü' must be 1 to 128 characters of [A-Za-z0-9._-]"),
        ({"--client-id": "c" * 129}, f"--client-id '{'c' * 129}' must be 1 to 128 characters"),
        ({"--data": "{tmp}/file"}, "--data: {tmp}/file: not a readable .npz file"),
        (
            {"--state-dir": "{tmp}/file/state"},
            "--state-dir: {tmp}/file/state cannot be made: {tmp}/file is not a directory",
        ),
        ({"--log-dir": "{tmp}/file"}, "--log-dir: {tmp}/file is not a directory"),
    ],
)
def test_fedbayes_client_names_the_option_it_refuses_before_asking_the_superlink(
    client_files, capsys, monkeypatch, change, message
):
    """Checked on this machine first: the SuperLink (127.0.0.1:1, where nothing listens) is never dialled."""
    monkeypatch.setattr(processes, "stop_processes_on_signals", lambda: None)  # this test's process keeps its own
    options = {
        "--superlink": "127.0.0.1:1",
        "--ca": "{tmp}/pki/ca.crt",
        "--key": "{tmp}/keys/c1",
        "--client-id": "c1",
        "--data": "{tmp}/data.npz",
        "--state-dir": "{tmp}/state",
        "--log-dir": "{tmp}/logs",
        **change,
    }
    argv = ["client", *(part.format(tmp=client_files) for pair in options.items() for part in pair)]
    assert main(argv) == 1
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert last_line.startswith(f"fedbayes: error: {message.format(tmp=client_files)}"), last_line
    assert not (client_files / "state").exists() and not (client_files / "logs").exists()
