"""The smallest client install (deploy/install-client.sh: `pip install .`, not editable) from a fresh venv joins a TLS +
node-auth federation and trains, and runs a whole `fedbayes local` federation outside the checkout: no development
extras, no torchvision, no Ray, nothing imported from this source tree. The wheels come from the host-side wheelhouse
the compose test uses too (make-wheelhouse.sh, CPU torch; cached), so the install is offline and the same on CI as here.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import LocalFederation
from fedbayes.deploy.pki import init_pki, make_supernode_key
from tests.support import ROOT

pytestmark = pytest.mark.integration

REPO = ROOT
CPU_TORCH = "torch==2.13.0"
RUN = {
    "strategy": "bayesadmm",
    "num-server-rounds": 2,
    "fraction": 0.02,
    "local-epochs": 1,
    "lr": 5e-5,
    "input-scale": 255.0,
    "ensemble-samples": 0,
    "wait-for-clients": 1,
    "wait-for-clients-timeout": 300.0,
    "round-timeout": 300.0,
    "federation": "small-install",
}


def installed_venv(venv: Path) -> float:
    """deploy/install-client.sh into `venv` from the wheelhouse; the seconds it took."""
    subprocess.run(
        ["deploy/docker/make-wheelhouse.sh", CPU_TORCH], cwd=REPO, check=True, capture_output=True, timeout=900
    )
    env = {**without_source_tree(), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(REPO / "deploy/docker/wheels")}
    started = time.monotonic()
    result = subprocess.run(
        ["deploy/install-client.sh", str(venv), CPU_TORCH],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    print(result.stdout.strip())
    return time.monotonic() - started


def without_source_tree() -> dict[str, str]:
    """This process's environment minus PYTHONPATH: the venv must import its own copy of fedbayes."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def test_the_small_install_joins_and_trains(tmp_path):
    venv = tmp_path / "client-venv"
    install_seconds = installed_venv(venv)
    probe = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "import importlib.util as u, fedbayes, fedbayes.client.app; "
            "print(fedbayes.__file__); "
            "print(*(m for m in ('torchvision', 'ray', 'pytest', 'matplotlib', 'grpc_tools') if u.find_spec(m)))",
        ],
        cwd=venv,
        env=without_source_tree(),
        capture_output=True,
        text=True,
        check=True,
    )
    location, present = probe.stdout.splitlines()
    assert location.startswith(str(venv)), location  # the installed package, not this checkout
    assert present == "", f"the small install carries {present}"
    torchvision_data = subprocess.run(
        [
            str(venv / "bin/python"),
            "-c",
            "from fedbayes.tasks.datasets import load_dataset; load_dataset('mnist', True, '/data')",
        ],
        cwd=venv,
        env=without_source_tree(),
        capture_output=True,
        text=True,
    )
    assert "needs torchvision, which this install lacks" in torchvision_data.stderr, torchvision_data.stderr
    size_mb = int(
        subprocess.run(["du", "-sm", str(venv)], capture_output=True, text=True, check=True).stdout.split()[0]
    )

    tls = init_pki(tmp_path / "pki")
    key = make_supernode_key(tmp_path / "pki" / "supernodes", "hospital-s")
    assert (
        fedbayes(
            ["export-partitions", "--clients", "2", "--fraction", str(RUN["fraction"]), "--out", str(tmp_path / "data")]
        )
        == 0
    )
    results = tmp_path / "fed" / "results.jsonl"
    with LocalFederation(tmp_path / "fed", tls=tls, node_auth=True) as federation:
        federation.register(key.public)
        submit = federation.submit({**RUN, "results-path": str(results)})
        started = time.monotonic()
        client = federation.processes.start(
            "small-install-client",
            [
                str(venv / "bin/fedbayes"),
                "client",
                "--superlink",
                federation.fleet_address,
                "--ca",
                str(tls.ca_cert),
                "--key",
                str(key.private),
                "--client-id",
                "hospital-s",
                "--data",
                str(tmp_path / "data" / "client-0.npz"),
                "--state-dir",
                str(tmp_path / "client-state"),
            ],
            cwd=venv,
            extra_env={"PYTHONPATH": ""},
        )
        first_round_seconds = []

        def note_first_round(row):
            if row["round"] == 1:
                first_round_seconds.append(time.monotonic() - started)

        rows = federation.follow(results, submit, 2, on_row=note_first_round)
        assert client.popen.poll() is None, client.log_tail()
    print(
        f"small install: {size_mb} MB, installed in {install_seconds:.0f} s from the wheelhouse; "
        f"client start -> first round trained {first_round_seconds[0]:.1f} s"
    )
    assert [(row["round"], row["clients"]) for row in rows] == [(1, 1), (2, 1)], rows
    assert size_mb < 1600, f"{size_mb} MB"  # torch (CPU) is 750 MB of it; the full dev venv is ~6 GB

    # The same non-editable install runs a whole federation from a directory that is not a checkout: the Flower
    # app is written from the installed package (deploy/flower_app.py).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    local = subprocess.run(
        [
            str(venv / "bin/fedbayes"),
            "local",
            "--strategy",
            "fedavg",
            "--clients",
            "2",
            "--rounds",
            "1",
            "--fraction",
            "0.02",
            "--workdir",
            str(elsewhere / "run"),
            "--set",
            "ensemble-samples=0",
        ],
        cwd=elsewhere,
        env=without_source_tree(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    (row,) = [json.loads(line) for line in (elsewhere / "run" / "results.jsonl").read_text().splitlines()]
    assert row["round"] == 1 and row["clients"] == 2 and row["accuracy"] > 0.3, row
