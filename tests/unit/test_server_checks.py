"""`fedbayes server`'s checks (deploy/server.py), each against what a server machine can get wrong: a certificate for
another name, from another CA, with another key or out of date; a broken client registry; a port in use; SuperLink
arguments it sets itself; and the commands it prints next, which must be commands the `fedbayes` parser takes."""

from __future__ import annotations

import argparse
import datetime
import shlex
import shutil
import socket

import pytest

from fedbayes.deploy import cli
from fedbayes.deploy.pki import init_pki
from fedbayes.deploy.server import (
    CheckFailed,
    ServerLayout,
    check_certificates,
    check_ports,
    check_registry,
    next_steps,
    pass_through,
    report_checks,
    server_checks,
)
from tests.support import ROOT


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    init_pki(directory, names=["fl.example.org"], ips=["203.0.113.7"])
    return directory


def server_args(tmp_path, certs, *extra: str) -> argparse.Namespace:
    argv = ["server", "--certs", str(certs), "--name", "fl.example.org", "--state-dir", str(tmp_path / "state"), *extra]
    args = cli.build_parser().parse_args(argv)
    args.argv = argv
    return args


def test_a_certificate_made_for_the_name_passes(certs):
    line = check_certificates(certs, "fl.example.org")
    assert "valid for fl.example.org and 127.0.0.1" in line
    assert "valid for 203.0.113.7" in check_certificates(certs, "203.0.113.7")


def test_a_name_the_certificate_does_not_list_is_refused_with_the_command_that_fixes_it(certs):
    with pytest.raises(CheckFailed, match="not for fl.other.org") as refused:
        check_certificates(certs, "fl.other.org")
    assert f"fedbayes pki init --out {certs} --force --name fl.other.org" in str(refused.value)
    with pytest.raises(CheckFailed, match="--ip 198.51.100.1"):
        check_certificates(certs, "198.51.100.1")


def test_a_certificate_of_another_ca_is_refused(certs, tmp_path):
    other = tmp_path / "other"
    init_pki(other, names=["fl.example.org"])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(other / "ca.crt", mixed / "ca.crt")
    for name in ("server.pem", "server.key"):
        shutil.copy(certs / name, mixed / name)
    with pytest.raises(CheckFailed, match="is not signed by"):
        check_certificates(mixed, "fl.example.org")


def test_a_key_that_is_not_the_certificates_is_refused(certs, tmp_path):
    other = tmp_path / "other"
    init_pki(other, names=["fl.example.org"])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("ca.crt", "server.pem"):
        shutil.copy(certs / name, mixed / name)
    shutil.copy(other / "server.key", mixed / "server.key")
    with pytest.raises(CheckFailed, match="is not the key of"):
        check_certificates(mixed, "fl.example.org")


def test_a_certificate_out_of_date_is_refused_naming_the_clock(certs):
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=400)
    with pytest.raises(CheckFailed, match="this machine's clock says"):
        check_certificates(certs, "fl.example.org", now=later)


def test_missing_certificates_name_the_command_that_makes_them(tmp_path):
    with pytest.raises(CheckFailed, match=f"fedbayes pki init --out {tmp_path}"):
        check_certificates(tmp_path, "fl.example.org")


def test_the_registry_is_read_and_a_broken_one_is_refused(tmp_path):
    registry = tmp_path / "clients.json"
    assert "no client registered yet" in check_registry(registry)
    registry.write_text('{"hospital-a": 17, "hospital-b": 18}')
    assert "2 client(s) registered (hospital-a, hospital-b)" in check_registry(registry)
    registry.write_text("{not json")
    with pytest.raises(CheckFailed, match="is not valid JSON"):
        check_registry(registry)


def test_a_port_in_use_is_refused_naming_it():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CheckFailed, match=f"the Fleet API cannot listen on 127.0.0.1:{port}"):
            check_ports(f"127.0.0.1:{port}", 1)
        with pytest.raises(CheckFailed, match=f"the Control API cannot listen on 127.0.0.1:{port}"):
            check_ports("127.0.0.1:1", port)
    with pytest.raises(CheckFailed, match="both name port"):
        check_ports("0.0.0.0:9092", 9092)
    with pytest.raises(CheckFailed, match="must be host:port"):
        check_ports("9092", 9093)


def test_superlink_arguments_go_after_a_double_dash_and_never_override_its_own():
    assert pass_through(["--log-file", "x.log"], ["server", "--", "--log-file", "x.log"]) == ["--log-file", "x.log"]
    with pytest.raises(ValueError, match="go after `--`"):
        pass_through(["stray"], ["server", "stray"])
    with pytest.raises(ValueError, match="--database, --fleet-api-address=0.0.0.0:1 after `--`"):
        pass_through(["--database", "x.db", "--fleet-api-address=0.0.0.0:1"], ["server", "--", "--database"])


def test_check_reports_every_check_and_fails_if_one_does(tmp_path, certs, capsys):
    args = server_args(tmp_path, certs, "--name", "fl.other.org", "--dataset", "npz:/nonexistent")
    layout = ServerLayout.from_arguments(args)
    assert report_checks(server_checks(args, layout), args.name) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:5]] == ["certificate", "registry", "state", "ports", "dataset"]
    assert lines[0].startswith("certificate  FAILED:") and lines[4].startswith("dataset      FAILED:")
    assert "FAILED" not in lines[1] + lines[2]
    assert lines[-1] == "2 of 5 checks failed; nothing was started"


def test_the_commands_it_prints_next_parse_and_name_this_servers_files(tmp_path, certs):
    args = server_args(tmp_path, certs)
    layout = ServerLayout.from_arguments(args)
    printed = next_steps(args, layout)
    commands = [shlex.split(line) for line in printed.splitlines() if line.startswith("       fedbayes ")]
    assert [command[1] for command in commands] == ["pki", "pki", "app", "run", "export", "client"]
    for command in commands:
        if command[1] != "run":  # `fedbayes run` hands its arguments to Flower's `flwr run`
            cli.build_parser().parse_args(command[1:])
    run = commands[3]
    assert run[2:4] == [str(layout.app), "fedbayes"]
    assert f'client-registry="{layout.registry}"' in run[-1] and 'federation="first"' in run[-1]
    assert commands[0][commands[0].index("--registry") + 1] == str(layout.registry)
    assert commands[4][2] == str(layout.checkpoints) and "fl.example.org:9092" in commands[5]


@pytest.mark.parametrize("unit", ["fedbayes-server.service", "fedbayes-client.service"])
def test_the_systemd_units_run_a_command_that_parses_and_stop_it_alone(unit):
    """KillMode=mixed: SIGTERM to the command alone, which stops its processes in order (a SuperNode signed off
    first); systemd's default would signal every process of the unit at once."""
    text = (ROOT / "deploy" / "systemd" / unit).read_text()
    settings = dict(
        line.split("=", 1) for line in text.replace("\\\n", " ").splitlines() if "=" in line and line[:1].isalpha()
    )
    command = shlex.split(settings["ExecStart"])
    assert command[0].endswith("/fedbayes") and command[1] == unit.split("-")[1].removesuffix(".service")
    cli.build_parser().parse_args(command[1:])
    assert settings["KillMode"] == "mixed" and settings["Restart"] == "on-failure"
