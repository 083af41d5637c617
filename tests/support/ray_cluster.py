"""A Ray cluster over network namespaces: `ray start --head` on one machine of a NetnsLab, `ray start --address` on
the others, each with one CPU, no dashboard and a small object store, as docs/running/simulation.md tells a user.

Each host's Ray processes carry a marker of their own in their environment (and run in the session of their
`ray start --block`), so one host can be killed alone and everything is stopped by process id at the end: `ray stop`
would stop every Ray process of the machine, other users' included (all namespaces share one process table).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from fedbayes.deploy.launcher import Host
from fedbayes.deploy.processes import stop_processes_with_env
from tests.support.processes import cli_env, processes_with_env

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_PORT = 6379
OBJECT_STORE_BYTES = 80 * 2**20  # Ray's minimum is 75 MiB
HOST_MARKER = "FEDBAYES_RAY_HOST"
STOP_TIMEOUT = 30.0

# The ClientAppActor tasks that finished, by the IP of the node that ran them, from the GCS's task events (Ray's state
# API needs the dashboard, which the cluster runs without).
TASKS_BY_NODE = """
import collections, json, sys, ray
from ray.core.generated import gcs_pb2
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
runs = collections.Counter()
for raw in ray._private.state.state._connect_and_get_accessor().get_task_events():
    event = gcs_pb2.TaskEvents.FromString(raw)
    if event.task_info.func_or_class_name == "ClientAppActor.run" and event.state_updates.node_id:
        runs[ips.get(event.state_updates.node_id.hex(), "?")] += 1
print(json.dumps({"alive": sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]), "runs": runs}))
"""


class RayCluster:
    """Ray's head on `head`, a worker node on each of `workers`; their logs in `workdir`."""

    def __init__(self, head: Host, workers: dict[str, Host], workdir: Path, cpus_per_host: int = 1) -> None:
        self.head, self.workers, self.workdir = head, workers, workdir
        self.cpus_per_host = cpus_per_host
        self.tag = uuid.uuid4().hex[:8]
        # Ray's sockets live under its temp dir, and a socket's path may not exceed 107 bytes: a short one of our own.
        self.temp_root = Path(tempfile.mkdtemp(prefix="fbray-"))

    @property
    def address(self) -> str:
        """The head's GCS address, what `ray start --address` and `fedbayes run --ray-address` take."""
        return f"{self.head.address}:{HEAD_PORT}"

    def __enter__(self) -> RayCluster:
        try:
            self._start("head", self.head, ["--head", "--port", str(HEAD_PORT), "--include-dashboard=false"])
            for name, host in self.workers.items():
                self._start(name, host, ["--address", self.address])
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, name: str, host: Host, role: list[str]) -> None:
        log = self.workdir / f"ray-{name}.log"
        command = [
            RAY,
            "start",
            *role,
            "--block",
            "--node-ip-address",
            host.address,
            "--num-cpus",
            str(self.cpus_per_host),
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--temp-dir",
            str(self.temp_root / name),  # one per host: they share this machine's file system
            "--disable-usage-stats",
        ]
        with log.open("w") as output:
            process = subprocess.Popen(
                host.command(command),
                env=cli_env(**{HOST_MARKER: self.marker(name)}),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray on {name} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def marker(self, name: str) -> str:
        """The value of HOST_MARKER in the environment of host `name`'s Ray processes."""
        return f"{self.tag}-{name}"

    def kill(self, name: str) -> list[int]:
        """SIGKILL every Ray process of worker host `name`, as a machine that lost its power; the pids it found."""
        found: set[int] = set()
        deadline = time.monotonic() + STOP_TIMEOUT
        while (left := processes_with_env(HOST_MARKER, self.marker(name))) and time.monotonic() < deadline:
            found.update(left)
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        return sorted(found)

    def tasks_by_node(self) -> dict:
        """{"alive": the IPs of the live nodes, "runs": ClientAppActor.run tasks by node IP} as the GCS has them."""
        done = subprocess.run(
            self.head.command([sys.executable, "-c", TASKS_BY_NODE, self.address]),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the GCS's task events could not be read:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def __exit__(self, *exc_info) -> None:
        for name in [*self.workers, "head"]:
            stop_processes_with_env(HOST_MARKER, self.marker(name), STOP_TIMEOUT)
        shutil.rmtree(self.temp_root, ignore_errors=True)
