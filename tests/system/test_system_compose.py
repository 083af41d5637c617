"""Compose system test: `docker compose up` the top-level docker-compose.yml (TLS + node auth, 1 server,
3 clients), then, as deploy/CLIENT.md tells a client operator, a fourth client in a container of the same
image on a network of its own that reaches the SuperLink only through the host's published Fleet port
under the certificate's public name. BayesADMM for 3 rounds with all four under the client registry, then
`docker compose down` + `up` with the volumes kept (key registration must be idempotent) and one more
round, then everything torn down.

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

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.pki import init_pki, make_supernode_key
from fedbayes.deploy.processes import free_ports
from fedbayes.tasks.datasets import DEBIAN_FMNIST_DIR
from tests.support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.compose]

REPO = ROOT
BASE_IMAGE = "fedbayes-base:bookworm"
IMAGE = "fedbayes:system-test"
CPU_TORCH = "torch==2.13.0"  # the CPU wheel: a small image, and what the CI machine has
CLIENTS = ("client-0", "client-1", "client-2")
REMOTE = "hospital-d"  # the client on "another machine": its own container, network and key
PUBLIC_NAME = "fl.example.org"  # the SuperLink's name in its certificate; the remote client resolves it via --add-host
# constant: three rounds of a cosine schedule leave the last round a quarter of lr, too little for the floor on accuracy
RUN_CONFIG = (
    'strategy="bayesadmm" local-epochs=1 lr=5e-5 lr-schedule="constant" input-scale=255.0 ensemble-samples=4 '
    "wait-for-clients=4 min-clients=4 wait-for-clients-timeout=300.0 round-timeout=300.0 "
    'client-registry="/registry/clients.json" '
    'results-path="/output/{name}.jsonl" federation="{name}" num-server-rounds={rounds}'
)


def run(command: list[str], timeout: float, env: dict[str, str] | None = None, what: str = "") -> str:
    """Run a setup or compose step; fail the test with its output (never skip) if it fails."""
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"[{time.monotonic() - started:6.1f} s] {what or ' '.join(command)}")
    if result.returncode != 0:
        pytest.fail(
            f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
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
    run(
        [
            "docker",
            "build",
            "-q",
            "-f",
            "deploy/docker/Dockerfile",
            "--build-arg",
            f"BASE_IMAGE={BASE_IMAGE}",
            "--build-arg",
            f"TORCH={CPU_TORCH}",
            "-t",
            IMAGE,
            ".",
        ],
        900,
        what="docker build",
    )
    return IMAGE


class Federation:
    """The compose project under test plus the remote client's container, network and state volume."""

    def __init__(self, image: str, tmp_path: Path) -> None:
        self.certs, self.data, self.output = tmp_path / "certs", tmp_path / "data", tmp_path / "output"
        self.tag = f"fedbayes-test-{uuid.uuid4().hex[:8]}"
        self.fleet_port, control_port = free_ports(2)
        self.env = {
            **os.environ,
            "FEDBAYES_IMAGE": image,
            "FEDBAYES_CERTS": str(self.certs),
            "FEDBAYES_DATA": str(self.data),
            "FEDBAYES_OUTPUT": str(self.output),
            "FEDBAYES_FLEET_PORT": str(self.fleet_port),
            "FEDBAYES_CONTROL_PORT": str(control_port),
        }
        self.compose = ["docker", "compose", "-p", self.tag, "-f", "docker-compose.yml", "-f", "deploy/compose.cpu.yml"]
        self.image = image

    def prepare(self) -> None:
        init_pki(self.certs, names=[PUBLIC_NAME])
        for client in (*CLIENTS, REMOTE):
            make_supernode_key(self.certs / "supernodes", client)
        assert fedbayes(["export-partitions", "--clients", "4", "--fraction", "0.05", "--out", str(self.data)]) == 0
        self.output.mkdir()

    def submit(self, name: str, rounds: int) -> subprocess.Popen:
        """`fedbayes run` (`flwr run --stream` that exits non-zero unless the run completed) through the operator
        container, as the READMEs document it; its output in <output>/<name>.log."""
        config = RUN_CONFIG.format(name=name, rounds=rounds)
        with (self.output / f"{name}.log").open("wb") as log:
            return subprocess.Popen(
                [*self.compose, "run", "--rm", "operator", "fedbayes", "run", "/app", "fedbayes", "-c", config],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def register_remote_client(self) -> None:
        """What the operator does with the .pub file a client sends (deploy/README.md)."""
        run(
            [
                *self.compose,
                "run",
                "--rm",
                "-v",
                f"{self.certs}/supernodes/{REMOTE}.pub:/keys/{REMOTE}.pub:ro",
                "register-supernodes",
                "fedbayes",
                "pki",
                "register",
                "--superlink",
                "superlink:9093",
                "--ca",
                "/run/secrets/ca_cert",
                "--registry",
                "/registry/clients.json",
                "--client-id",
                REMOTE,
                f"/keys/{REMOTE}.pub",
            ],
            180,
            self.env,
            what=f"register {REMOTE}'s key",
        )

    def start_remote_client(self) -> None:
        """deploy/CLIENT.md's container command, on a Docker network of its own (another network namespace,
        not the compose network): it reaches the SuperLink through the host's published Fleet port."""
        run(["docker", "network", "create", self.tag], 60, what="the remote client's network")
        run(
            [
                "docker",
                "run",
                "-d",
                "--init",
                "--name",
                f"{self.tag}-{REMOTE}",
                "--network",
                self.tag,
                "--add-host",
                f"{PUBLIC_NAME}:host-gateway",
                "-v",
                f"{self.certs}/ca.crt:/certs/ca.crt:ro",
                "-v",
                f"{self.certs}/supernodes/{REMOTE}:/certs/key:ro",
                "-v",
                f"{self.data}/client-3.npz:/data/client.npz:ro",
                "-v",
                f"{self.tag}-{REMOTE}:/state",
                self.image,
                "fedbayes",
                "client",
                "--superlink",
                f"{PUBLIC_NAME}:{self.fleet_port}",
                "--ca",
                "/certs/ca.crt",
                "--key",
                "/certs/key",
                "--client-id",
                REMOTE,
                "--data",
                "/data/client.npz",
                "--state-dir",
                "/state",
            ],
            60,
            what=f"docker run {REMOTE}",
        )

    def registry(self) -> dict[str, int]:
        return json.loads(
            run(
                [*self.compose, "run", "--rm", "register-supernodes", "cat", "/registry/clients.json"],
                120,
                self.env,
                what="read the client registry",
            )
        )

    def node_ids(self) -> set[int]:
        listing = run(
            [*self.compose, "run", "--rm", "operator", "flwr", "supernode", "list", "fedbayes", "--format", "json"],
            120,
            self.env,
            what="flwr supernode list",
        )
        return {int(node["node-id"]) for node in json.loads(listing[listing.index("{") :])["nodes"]}

    def logs(self) -> str:
        compose = subprocess.run(
            [*self.compose, "logs", "--no-color", "--tail", "60"],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        remote = subprocess.run(
            ["docker", "logs", "--tail", "60", f"{self.tag}-{REMOTE}"], capture_output=True, text=True, timeout=60
        )
        return compose.stdout[-20000:] + f"\n---- {REMOTE} ----\n" + remote.stdout + remote.stderr

    def tear_down(self) -> None:
        for command in (
            ["docker", "rm", "-f", f"{self.tag}-{REMOTE}"],
            ["docker", "network", "rm", self.tag],
            ["docker", "volume", "rm", f"{self.tag}-{REMOTE}"],
        ):
            subprocess.run(command, capture_output=True, timeout=120)
        run(
            [*self.compose, "down", "-v", "--remove-orphans", "--timeout", "10"],
            300,
            self.env,
            what="docker compose down -v",
        )


def follow(
    federation: Federation, submit: subprocess.Popen, name: str, timeout: float = 600
) -> tuple[list[dict], float]:
    """Rows of a run once its CLI exits, and when (time.monotonic) its first row appeared."""
    started = time.monotonic()
    results, first_row_at, deadline = federation.output / f"{name}.jsonl", None, started + timeout
    while submit.poll() is None:
        assert time.monotonic() < deadline, f"run {name} still going after {timeout:.0f} s"
        if first_row_at is None and results.exists() and results.read_text().strip():
            first_row_at = time.monotonic()
        time.sleep(0.5)
    print(f"[{time.monotonic() - started:6.1f} s] run {name}")
    assert submit.returncode == 0, (federation.output / f"{name}.log").read_text()[-4000:]
    return [json.loads(line) for line in results.read_text().splitlines()], first_row_at or time.monotonic()


def test_compose_federation_with_a_remote_client_container(image, tmp_path):
    federation = Federation(image, tmp_path)
    federation.prepare()
    try:
        run([*federation.compose, "up", "-d"], 300, federation.env, what="docker compose up -d")
        federation.register_remote_client()
        submit = federation.submit("compose-test", rounds=3)  # waits for 4 clients: the remote one joins the run
        started = time.monotonic()
        federation.start_remote_client()
        rows, first_row_at = follow(federation, submit, "compose-test")
        print(f"docker run {REMOTE} -> first round trained: {first_row_at - started:.1f} s")
        registry, node_ids = federation.registry(), federation.node_ids()

        # Volumes kept: the SuperLink's database and the registry survive, every key is registered again.
        run([*federation.compose, "down", "--timeout", "10"], 300, federation.env, what="docker compose down")
        run([*federation.compose, "up", "-d"], 300, federation.env, what="docker compose up -d (volumes kept)")
        again, _ = follow(federation, federation.submit("compose-test-again", rounds=1), "compose-test-again")
        registry_again = federation.registry()
    except BaseException:
        print(federation.logs())
        raise
    finally:
        federation.tear_down()
    assert [row["round"] for row in rows] == [1, 2, 3]
    assert all(row["clients"] == row["clients_sent"] == 4 and row["clients_rejected"] == 0 for row in rows), rows
    assert [row["known_clients"] for row in rows] == [4, 4, 4]
    assert rows[-1]["accuracy"] > 0.25 and rows[-1]["accuracy_ensemble"] > 0.25, rows[-1]  # chance is 0.1
    assert (federation.output / "server-state" / "compose-test" / "checkpoint.safetensors").is_file()
    assert sorted(registry) == sorted((*CLIENTS, REMOTE)) and set(registry.values()) == node_ids, (registry, node_ids)
    assert registry_again == registry  # the same node ids after down + up
    assert [(row["round"], row["clients"]) for row in again] == [(1, 4)], again
