"""`fedbayes client` against a real SuperLink with TLS and node authentication (loopback): `--check`
names each problem a new client machine runs into, and the client comes back at once after Ctrl-C and
waits (instead of failing) while the SuperLink still holds its node after a crash; `--leave --forget` with no run
going on gives up after its timeout, saying why."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from flwr.client.grpc_rere_client import node_auth_client_interceptor
from flwr.common.constant import HEARTBEAT_MIN_INTERVAL, HEARTBEAT_PATIENCE
from flwr.supercore.date import now

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.client import make_sure_offline
from fedbayes.deploy.control import list_nodes
from fedbayes.deploy.fleet_probe import FleetTarget, activate, fleet_stub, load_private_key
from fedbayes.deploy.launcher import CONNECTION, LocalFederation, console_script
from fedbayes.deploy.pki import init_pki, make_supernode_key

pytestmark = pytest.mark.integration

KEYS = ("checked", "restarted", "crashed", "leaving", "released", "stranger")


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """One SuperLink for the module; every key but the stranger's registered. Yields (federation, pki dir,
    node id per key)."""
    directory = tmp_path_factory.mktemp("join")
    tls = init_pki(directory / "pki", names=["fl.example.org"])
    keys = {name: make_supernode_key(directory / "pki" / "supernodes", name) for name in KEYS}
    init_pki(directory / "other-ca")
    assert (
        fedbayes(["export-partitions", "--clients", "2", "--fraction", "0.02", "--out", str(directory / "data")]) == 0
    )
    with LocalFederation(directory / "fed", tls=tls, node_auth=True) as running:
        node_ids = {name: running.register(keys[name].public) for name in KEYS if name != "stranger"}
        previous_home = os.environ.get("FLWR_HOME")
        os.environ["FLWR_HOME"] = str(running.flwr_home)  # `status` asks the SuperLink in this process
        try:
            yield running, directory, node_ids
        finally:
            os.environ.pop("FLWR_HOME")
            if previous_home is not None:
                os.environ["FLWR_HOME"] = previous_home


def check(federation, key: str, superlink: str | None = None, ca: str = "pki") -> list[str]:
    running, directory, _ = federation
    return [
        "client",
        "--check",
        "--superlink",
        superlink or running.fleet_address,
        "--ca",
        str(directory / ca / "ca.crt"),
        "--key",
        str(directory / "pki" / "supernodes" / key),
    ]


def join(federation, key: str, *extra: str) -> list[str]:
    running, directory, _ = federation
    return [
        console_script("fedbayes"),
        "client",
        "--superlink",
        running.fleet_address,
        "--ca",
        str(directory / "pki" / "ca.crt"),
        "--key",
        str(directory / "pki" / "supernodes" / key),
        "--client-id",
        key,
        "--data",
        str(directory / "data" / "client-0.npz"),
        "--state-dir",
        str(directory / "state"),
        *extra,
    ]


def status(federation, key: str) -> str:
    """The key's node as the SuperLink sees it: registered | online | offline (Control API, as `flwr supernode
    list` asks it, but in this process: the CLI takes 3-6 s a call on a loaded 2-core machine)."""
    _, _, node_ids = federation
    return {node.node_id: node.status for node in list_nodes(CONNECTION)}[node_ids[key]]


def wait_for_status(federation, key: str, wanted: str, timeout: float) -> float:
    """Seconds until the SuperLink reports the key's node as `wanted`."""
    started = time.monotonic()
    while status(federation, key) != wanted:
        assert time.monotonic() - started < timeout, f"{key} not {wanted} after {timeout:.0f} s"
        time.sleep(0.5)
    return time.monotonic() - started


def test_check_reports_the_node_without_joining(federation, capsys):
    _, _, node_ids = federation
    assert fedbayes(check(federation, "checked")) == 0
    report = capsys.readouterr().out
    assert f"accepts this key as node {node_ids['checked']}" in report, report
    for step in ("key ", "name ", "network ", "TLS ", "node auth "):
        assert step in report
    assert status(federation, "checked") == "offline"  # activated and signed off again: never joined a run


@pytest.mark.parametrize(
    "problem, arguments, message",
    [
        ("unregistered key", {"key": "stranger"}, "refuses this key (Flower code 2004). Either it is not registered"),
        ("another federation's CA", {"ca": "other-ca"}, "is not signed by"),
        ("a name nobody resolves", {"superlink": "fl.example.org:{port}"}, "cannot resolve 'fl.example.org'"),
        ("nothing on that port", {"superlink": "127.0.0.1:1"}, "no connection to the SuperLink at 127.0.0.1:1"),
        ("the public key for the private one", {"key": "checked.pub"}, "is not an unencrypted OpenSSH private key"),
    ],
)
def test_check_names_the_problem(federation, capsys, problem, arguments, message):
    running, _, _ = federation
    superlink = arguments.get("superlink", "").format(port=running.fleet_port) or None
    command = check(federation, arguments.get("key", "checked"), superlink, arguments.get("ca", "pki"))
    assert fedbayes(command) == 1, problem
    assert message in capsys.readouterr().err, problem


def test_check_names_a_clock_the_superlink_rejects(federation, capsys, monkeypatch):
    """This machine's clock 10 minutes ahead: the SuperLink refuses its signed requests (more than 5 s ahead)."""
    monkeypatch.setattr(node_auth_client_interceptor, "now", lambda: now() + timedelta(minutes=10))
    assert fedbayes(check(federation, "checked")) == 1
    assert "the SuperLink rejects this machine's clock" in capsys.readouterr().err


def test_a_client_stopped_with_ctrl_c_comes_back_at_once(federation):
    """Ctrl-C signs the SuperNode off, so the same command started right away is accepted on its first try.
    (Before, the SuperNode got two SIGTERMs and the second, when it landed inside its exit handler, killed
    it before it signed off: a race, lost in about one of three tries here; the SuperLink then refused the
    key for ~60 s.)"""
    running, _, _ = federation
    first = running.processes.start("client-restarted-1", join(federation, "restarted"))
    wait_for_status(federation, "restarted", "online", timeout=60)
    running.processes.stop(first, signal.SIGINT)
    assert first.popen.wait(timeout=30) == 130
    assert status(federation, "restarted") == "offline"  # signed off, not left online until its heartbeat lapses
    second = running.processes.start("client-restarted-2", join(federation, "restarted"))
    wait_for_status(federation, "restarted", "online", timeout=60)
    assert "trying again" not in second.log_path.read_text()


def test_the_client_waits_while_the_superlink_still_holds_its_node(federation):
    """A client that died without signing off: its node stays online at the SuperLink until its heartbeat
    lapses. A new `fedbayes client` with that key retries instead of exiting, and joins once it has."""
    running, directory, _ = federation
    key = directory / "pki" / "supernodes" / "crashed"
    target = FleetTarget.from_address(running.fleet_address, directory / "pki" / "ca.crt", key)
    with fleet_stub(target, load_private_key(key)) as stub:  # the crashed client's last activation, never released
        activate(stub, load_private_key(key), HEARTBEAT_MIN_INTERVAL)
    held_until = time.monotonic() + HEARTBEAT_PATIENCE * HEARTBEAT_MIN_INTERVAL
    client = running.processes.start("client-crashed", join(federation, "crashed"))
    wait_for_status(federation, "crashed", "offline", timeout=60)  # the crashed session lapsed...
    assert time.monotonic() > held_until - 1
    wait_for_status(federation, "crashed", "online", timeout=60)  # ...and the waiting client took over
    assert client.popen.poll() is None
    log = client.log_path.read_text()
    assert "refuses this key" in log and "trying again" in log, log


def test_a_node_its_supernode_left_online_is_signed_off_by_the_client(federation, capsys):
    """A SuperNode stopped while its activation is in flight leaves its node online; the client deactivates it,
    and says so only when it had to."""
    running, directory, node_ids = federation
    key = directory / "pki" / "supernodes" / "released"
    target = FleetTarget.from_address(running.fleet_address, directory / "pki" / "ca.crt", key)
    with fleet_stub(target, load_private_key(key)) as stub:
        activate(stub, load_private_key(key), HEARTBEAT_MIN_INTERVAL)
    assert status(federation, "released") == "online"
    make_sure_offline(target, node_ids["released"])
    assert status(federation, "released") == "offline"
    assert f"signed node {node_ids['released']} off at the SuperLink" in capsys.readouterr().err
    make_sure_offline(target, node_ids["released"])
    assert capsys.readouterr().err == ""


def test_the_client_gives_up_after_its_activation_timeout(federation):
    running, _, _ = federation
    client = running.processes.start("client-stranger", join(federation, "stranger", "--activation-timeout", "12"))
    assert client.popen.wait(timeout=60) == 1
    log = client.log_path.read_text()
    assert "trying again" in log and "fedbayes: error: the SuperLink refuses this key" in log, log


def test_leave_and_forget_with_no_run_going_on_gives_up_after_its_timeout_saying_why(federation):
    """No run sends an instruction, so the leaving client is never asked: it says what it waits for, and after
    --leave-timeout exits 1 with the reason, signed off."""
    running, directory, _ = federation
    leaving = running.processes.start(
        "client-leaving", join(federation, "leaving", "--leave", "--forget", "--leave-timeout", "5")
    )
    assert leaving.popen.wait(timeout=180) == 1
    log = leaving.log_path.read_text()
    assert "waiting up to 5 s (--leave-timeout) for the server's next instruction" in log, log
    assert "fedbayes: error: --leave --forget gave up after 5 s (--leave-timeout): no instruction came" in log, log
    assert status(federation, "leaving") == "offline"
