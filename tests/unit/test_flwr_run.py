"""`fedbayes run`'s pieces that need no SuperLink: what it reads of `flwr run`'s arguments, the environment it
gives `flwr`, the Flower names it patches, and how it follows a log stream that ended early (stand-ins for `flwr`)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import flwr.cli.build
import flwr.cli.local_superlink
import pytest
from flwr.cli.utils import collect_files

from fedbayes.deploy import flwr_run
from fedbayes.deploy.flower_app import write_app
from fedbayes.deploy.flwr_run import (
    LOCAL_SUPERLINK_PORTS,
    MARKER_VARIABLE,
    RAY_FUTURE_WARNING,
    flwr_run_arguments,
    ray_cluster_problem,
    split_ray_address,
    submission_env,
)
from fedbayes.flowerseam.flwr_cli import PATIENCE, bundle_quickly, collect_app_files


@pytest.mark.parametrize(
    ("argv", "connection"),
    [
        ([".", "local", "--stream", "--federation-config", "num-supernodes=20", "-c", "fraction=0.1"], "local"),
        (["-c", 'federation="x"', "/app", "fedbayes", "--stream", "-c", "lr=0.1"], "fedbayes"),
        (["--run-config", "lr=0.1", "."], None),
        ([], None),
    ],
)
def test_the_connection_is_read_wherever_the_options_are(argv, connection):
    assert flwr_run_arguments(argv).superlink == connection


@pytest.mark.parametrize(
    ("argv", "address", "rest"),
    [
        (
            [".", "local", "--ray-address", "10.0.0.1:6379", "-c", "lr=0.1"],
            "10.0.0.1:6379",
            [".", "local", "-c", "lr=0.1"],
        ),
        (["--ray-address=ray://head", ".", "local"], "ray://head", [".", "local"]),
        ([".", "local", "--stream"], None, [".", "local", "--stream"]),
    ],
)
def test_the_ray_address_is_taken_out_of_flwr_runs_arguments(argv, address, rest):
    assert split_ray_address(argv) == (address, rest)


def test_a_ray_address_option_without_its_address_is_refused():
    with pytest.raises(ValueError, match="needs an address"):
        split_ray_address([".", "local", "--ray-address"])


def test_a_listening_ray_port_passes_and_a_closed_one_or_a_malformed_address_is_named():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert ray_cluster_problem(f"127.0.0.1:{port}") is None
        assert ray_cluster_problem(f"ray://127.0.0.1:{port}") is None
    closed = ray_cluster_problem(f"127.0.0.1:{port}", timeout=2.0)
    assert closed is not None and closed.startswith(f"cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert "expected HOST:PORT" in ray_cluster_problem("head-without-port")
    assert ray_cluster_problem("auto") is None  # Ray looks for this machine's cluster and fails clearly without one


def test_an_unreachable_ray_cluster_fails_the_command_at_once(capsys):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        port = listening.getsockname()[1]  # bound, never listening: connections are refused
        assert flwr_run.main([".", "local", "--ray-address", f"127.0.0.1:{port}"]) == 1
    assert capsys.readouterr().err.startswith(f"fedbayes run failed: cannot reach the Ray cluster at 127.0.0.1:{port}")


def test_flwr_gets_free_simulation_ports_unless_given_and_a_quiet_ray(monkeypatch):
    monkeypatch.setenv("FLWR_LOCAL_CONTROL_API_PORT", "41000")
    monkeypatch.setenv("PYTHONWARNINGS", "error::DeprecationWarning")
    env = submission_env("m1")
    assert env[MARKER_VARIABLE] == "m1" and env["FLWR_LOCAL_CONTROL_API_PORT"] == "41000"
    assert {variable for variable in LOCAL_SUPERLINK_PORTS if env[variable].isdigit()} == set(LOCAL_SUPERLINK_PORTS)
    assert env["PYTHONWARNINGS"] == f"error::DeprecationWarning,{RAY_FUTURE_WARNING}"


def test_the_timeouts_patched_are_flowers():
    for name, seconds in PATIENCE.items():
        assert getattr(flwr.cli.local_superlink, name) < seconds, name


def project_with_a_virtualenv(root: Path) -> Path:
    """An app directory as a checkout has it: its venv, bytecode caches, Flower's folder, a nested folder merely
    named .venv (which FABs keep), a symlink, and a .gitignore that tries to bring a venv file back."""
    write_app(root)
    for relative in (
        "task.py",
        "pkg/model.py",
        "pkg/__pycache__/model.cpython-311.pyc",
        "pkg/__pycache__/stray.py",
        ".venv/lib/python3.11/site-packages/flwr/app.py",
        ".venv/pyvenv.cfg",
        ".flwr/config.toml",
        "docs/.venv/notes.md",
        "notes.md",
    ):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f"# {relative}\n")
    (root / ".gitignore").write_text("*.pyc\n!.venv/lib/python3.11/site-packages/flwr/app.py\n")
    os.symlink(root / "task.py", root / "pkg" / "linked.py")
    return root


def test_the_listing_skips_what_no_fab_holds_and_the_fab_is_flowers(tmp_path):
    root = project_with_a_virtualenv(tmp_path / "app")
    listed = collect_app_files(root)
    assert not any(path.startswith((".venv/", ".flwr/")) or "__pycache__/" in path for path in listed), listed
    assert {"task.py", "pkg/model.py", "docs/.venv/notes.md", "pyproject.toml"} <= set(listed)
    assert "pkg/linked.py" not in listed and set(listed) < set(collect_files(root))
    flowers = flwr.cli.build.build_fab_from_files(collect_files(root))[0]
    assert flwr.cli.build.build_fab_from_files(listed)[0] == flowers


def test_flwr_bundles_with_the_quick_listing(tmp_path, monkeypatch):
    root = project_with_a_virtualenv(tmp_path / "app")
    flowers = flwr.cli.build.build_fab_from_disk(root)
    monkeypatch.setattr(flwr.cli.build, "collect_files", flwr.cli.build.collect_files)  # put back afterwards
    bundle_quickly()
    assert flwr.cli.build.collect_files is collect_app_files
    assert flwr.cli.build.build_fab_from_disk(root) == flowers


def fake_flwr(*lines: str) -> list[str]:
    """A stand-in for `flwr run|log --stream` that prints `lines` and exits 0."""
    return [sys.executable, "-c", f"print({chr(10).join(lines)!r})"]


RUN_OUTPUT = (
    "Using SuperLink: fedbayes (superlink:9093)",
    "Successfully started run 7",
    "INFO :      Starting logstream for run_id `7`",
    "INFO :      round 1 of the run",
)


def test_a_log_stream_that_ends_while_the_run_goes_is_followed_again_past_what_it_showed(monkeypatch, capsys):
    """Flower's CLI ends its log stream, exit 0, when the SuperLink fails a look at the run's state mid-stream (its
    SQLite database locked under load) while the run goes on; `fedbayes run` follows the log again, showing each line
    once, until the run finishes, and judges the run by its final status."""
    monkeypatch.setattr(flwr_run, "REATTACH_PAUSE", 0.0)
    first = flwr_run.stream(fake_flwr(*RUN_OUTPUT), os.environ, ["fedbayes", "run"])
    assert (first.returncode, first.run_id, first.log_lines) == (0, 7, 1)
    statuses = iter(["running", "running", "finished:completed"])
    replays = [
        (*RUN_OUTPUT[::2], RUN_OUTPUT[3]),  # `flwr log`: its preamble, then the log from the start
        (*RUN_OUTPUT[::2], RUN_OUTPUT[3], "INFO :      round 2 of the run", "fedbayes: a line of the end"),
    ]
    followed = []

    def follow_again(shown):
        followed.append(shown.log_lines)
        return flwr_run.stream(fake_flwr(*replays[len(followed) - 1]), os.environ, ["fedbayes", "run"], shown=shown)

    assert flwr_run.failure(first, lambda run_id: flwr_run.RunStatus(next(statuses), ""), follow_again) is None
    assert followed == [1, 1]
    output = capsys.readouterr()
    assert output.out.splitlines() == [
        *RUN_OUTPUT,
        "INFO :      round 2 of the run",
        "fedbayes: a line of the end",
    ]
    assert output.err.count("the SuperLink's log stream ended while run 7 is running; following it again") == 2


def test_a_run_that_fails_after_its_stream_ended_early_fails_and_one_that_never_ends_is_given_up(monkeypatch):
    monkeypatch.setattr(flwr_run, "REATTACH_PAUSE", 0.0)
    first = flwr_run.stream(fake_flwr(*RUN_OUTPUT), os.environ, ["fedbayes", "run"])

    def again(shown):
        return flwr_run.stream(fake_flwr(*RUN_OUTPUT), os.environ, ["fedbayes", "run"], shown=shown)

    statuses = iter(["running", "finished:failed"])
    failed = flwr_run.failure(first, lambda run_id: flwr_run.RunStatus(next(statuses), "ServerApp raised"), again)
    assert failed == "run 7 is finished:failed (ServerApp raised)"
    asked = []

    def forever_running(run_id):
        asked.append(run_id)
        return flwr_run.RunStatus("running", "")

    assert flwr_run.failure(first, forever_running, again) == "run 7 is running ()"
    assert len(asked) == flwr_run.REATTACH_LIMIT + 1
