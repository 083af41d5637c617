"""`fedbayes run`'s pieces that need no SuperLink: what it reads of `flwr run`'s arguments, the environment it
gives `flwr`, and the Flower names it patches."""

from __future__ import annotations

import flwr.cli.local_superlink
import pytest

from fedbayes.deploy.flwr_run import (
    LOCAL_SUPERLINK_PORTS,
    MARKER_VARIABLE,
    RAY_FUTURE_WARNING,
    flwr_run_arguments,
    submission_env,
)
from fedbayes.deploy.patient_flwr import PATIENCE


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
