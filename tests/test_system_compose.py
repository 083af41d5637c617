"""Compose system test: `docker compose up` the top-level docker-compose.yml (TLS + node auth, 1 server,
3 clients), run BayesADMM for 3 rounds through the operator container, check the reported metrics,
tear everything down.

The setup is the test's own and idempotent, so it runs on a fresh CI machine with no registry: install
and start a Docker engine with Compose v2 (deploy/docker/host-setup.sh), a Debian base image made with
mmdebstrap (make-base-image.sh), a host-side wheelhouse (make-wheelhouse.sh, CPU torch) and the image
build. Everything it downloads is cached (/var/cache/fedbayes, Docker's layer cache), so a second run
skips straight to the federation.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from deploy.cli import main as fedbayes
from deploy.pki import init_pki, make_supernode_key
from deploy.processes import free_ports
from tasks.datasets import DEBIAN_FMNIST_DIR

pytestmark = [pytest.mark.integration, pytest.mark.compose]

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "fedbayes-base:bookworm"
IMAGE = "fedbayes:system-test"
CPU_TORCH = "torch==2.13.0"  # the CPU wheel: a small image, and what the CI machine has
CLIENTS = ("client-0", "client-1", "client-2")
RUN_CONFIG = (
    'strategy="bayesadmm" num-server-rounds=3 local-epochs=1 lr=5e-5 input-scale=255.0 ensemble-samples=4 '
    'wait-for-clients=3 min-clients=3 round-timeout=300.0 federation="compose-test" '
    'results-path="/output/results.jsonl"'
)


def run(command: list[str], timeout: float, env: dict[str, str] | None = None, what: str = "") -> str:
    """Run a setup or compose step; fail the test with its output (never skip) if it fails."""
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"[{time.monotonic() - started:6.1f} s] {what or ' '.join(command)}")
    if result.returncode != 0:
        pytest.fail(f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result.stdout


@pytest.fixture(scope="module")
def image() -> str:
    if os.geteuid() != 0:
        pytest.fail("the compose system test installs and starts a Docker engine and needs root (CI runs as root)")
    if not (DEBIAN_FMNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.fail(f"Fashion-MNIST is missing from {DEBIAN_FMNIST_DIR}: apt-get install dataset-fashion-mnist")
    run(["deploy/docker/host-setup.sh"], 900, what="Docker engine + Compose v2")
    run(["deploy/docker/make-base-image.sh", BASE_IMAGE], 900, what="base image (mmdebstrap + docker import)")
    run(["deploy/docker/make-wheelhouse.sh", CPU_TORCH], 900, what="host-side wheelhouse")
    env = {**os.environ, "FEDBAYES_IMAGE": IMAGE, "FEDBAYES_BASE_IMAGE": BASE_IMAGE, "FEDBAYES_TORCH": CPU_TORCH,
           "FEDBAYES_CERTS": "/nonexistent"}  # building reads no certificates
    run(["docker", "build", "-q", "-f", "deploy/docker/Dockerfile", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
         "--build-arg", f"TORCH={CPU_TORCH}", "-t", IMAGE, "."], 900, env, what="docker build")
    return IMAGE


def test_compose_federation_bayesadmm(image, tmp_path):
    certs, data, output = tmp_path / "certs", tmp_path / "data", tmp_path / "output"
    init_pki(certs)
    for client in CLIENTS:
        make_supernode_key(certs / "supernodes", client)
    assert fedbayes(["export-partitions", "--clients", "3", "--fraction", "0.05", "--out", str(data)]) == 0
    output.mkdir()
    fleet_port, control_port = free_ports(2)
    env = {**os.environ, "FEDBAYES_IMAGE": image, "FEDBAYES_CERTS": str(certs), "FEDBAYES_DATA": str(data),
           "FEDBAYES_OUTPUT": str(output), "FEDBAYES_FLEET_PORT": str(fleet_port),
           "FEDBAYES_CONTROL_PORT": str(control_port)}
    compose = ["docker", "compose", "-p", f"fedbayes-test-{uuid.uuid4().hex[:8]}",
               "-f", "docker-compose.yml", "-f", "deploy/compose.cpu.yml"]
    try:
        run([*compose, "up", "-d"], 300, env, what="docker compose up -d")
        run([*compose, "run", "--rm", "operator", "flwr", "run", "/app", "fedbayes", "--stream", "-c", RUN_CONFIG],
            600, env, what="flwr run (3 rounds of BayesADMM, 3 clients)")
        rows = [json.loads(line) for line in (output / "results.jsonl").read_text().splitlines()]
    except BaseException:
        logs = subprocess.run([*compose, "logs", "--no-color", "--tail", "60"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
        print(logs.stdout[-20000:])
        raise
    finally:
        run([*compose, "down", "-v", "--remove-orphans", "--timeout", "10"], 300, env, what="docker compose down -v")
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert all(row["clients"] == row["clients_sent"] == 3 and row["clients_rejected"] == 0 for row in rows), rows
    assert [row["known_clients"] for row in rows] == [3, 3, 3]
    assert rows[-1]["accuracy"] > 0.25 and rows[-1]["accuracy_ensemble"] > 0.25, rows[-1]  # chance is 0.1
    assert (output / "server-state" / "compose-test" / "checkpoint.safetensors").is_file()
