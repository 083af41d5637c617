"""A SuperLink that falls behind with more than a thousand nodes' calls waiting answers them late instead of dropping
some (deploy/superlink.py `queueing_pending_calls`). Flower 1.39's own SuperLink, stopped for a moment (SIGSTOP, as
a process starved of CPU) while 1,500 registered nodes each ask for their instruction, cancels some of those calls on
its way back (gRPC sheds waiting calls past 1,000), and Flower's SuperNode exits on a CANCELLED call;
`fedbayes superlink` answers every one. The nodes speak the Fleet API as Flower's SuperNode does (a signed call,
Flower's version headers), over 16 connections."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import time

import flwr
import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.constant import PUBLIC_KEY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from flwr.proto.fleet_pb2 import ActivateNodeRequest, PullMessagesRequest, RegisterNodeFleetRequest
from flwr.proto.fleet_pb2_grpc import FleetStub
from flwr.proto.node_pb2 import Node
from flwr.supercore.date import now
from flwr.supercore.primitives.asymmetric import public_key_to_bytes, sign_message
from flwr.supercore.runtime_version_compatibility import RuntimeVersionMetadata

from fedbayes.deploy.processes import ManagedProcess, ProcessGroup, console_script, free_ports, process_env
from fedbayes.deploy.superlink import PENDING_CALLS
from fedbayes.flowerseam.superlink import queueing_pending_calls

pytestmark = pytest.mark.integration

NODES, CONNECTIONS = 1500, 16
STOPPED_SECONDS = 3.0
SERVING = ("Starting Fleet API", "Uvicorn running")  # Flower 1.39's SuperLink's log lines once it serves


class FleetNode:
    """A registered, activated node that signs its calls as Flower's SuperNode does."""

    version = RuntimeVersionMetadata.from_local_component("SuperNode")

    def __init__(self, stub: FleetStub) -> None:
        self.stub = stub
        self.key = ec.generate_private_key(ec.SECP256R1())  # the curve is the node's choice; P-256 signs fastest
        self.public_key = public_key_to_bytes(self.key.public_key())
        self.node_id = 0

    def metadata(self) -> tuple:
        timestamp = now().isoformat()
        signature = sign_message(self.key, timestamp.encode("ascii"))
        signed = [(PUBLIC_KEY_HEADER, self.public_key), (TIMESTAMP_HEADER, timestamp), (SIGNATURE_HEADER, signature)]
        return tuple(self.version.append_to_grpc_metadata(signed))

    async def join(self) -> None:
        request = RegisterNodeFleetRequest(public_key=self.public_key)
        self.node_id = (await self.stub.RegisterNode(request, metadata=self.metadata())).node_id
        activate = ActivateNodeRequest(public_key=self.public_key, heartbeat_interval=60)
        await self.stub.ActivateNode(activate, metadata=self.metadata())

    async def pull(self) -> str:
        """'OK', or the status the SuperLink ended the call with."""
        request = PullMessagesRequest(node=Node(node_id=self.node_id))
        try:
            await self.stub.PullMessages(request, metadata=self.metadata())
        except grpc.aio.AioRpcError as error:
            return error.code().name
        return "OK"


async def pulls_while_stopped(address: str, superlink_pid: int) -> collections.Counter[str]:
    """Every node's PullMessages sent while the SuperLink is stopped; how each ended."""
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(CONNECTIONS)
    ]
    try:
        nodes = [FleetNode(FleetStub(channels[index % CONNECTIONS])) for index in range(NODES)]
        for start in range(0, NODES, 100):
            await asyncio.gather(*(node.join() for node in nodes[start : start + 100]))
        os.kill(superlink_pid, signal.SIGSTOP)
        try:
            pulls = [asyncio.ensure_future(node.pull()) for node in nodes]
            await asyncio.sleep(STOPPED_SECONDS)
        finally:
            os.kill(superlink_pid, signal.SIGCONT)
        return collections.Counter(await asyncio.gather(*pulls))
    finally:
        for channel in channels:
            await channel.close()


def wait_until_serving(superlink: ManagedProcess) -> None:
    """Until the SuperLink's log says its Fleet API and its HTTP API serve."""
    assert superlink.log_path is not None
    deadline = time.monotonic() + 120
    while not all(line in superlink.log_path.read_text(errors="replace") for line in SERVING):
        assert superlink.popen.poll() is None and time.monotonic() < deadline, superlink.log_tail()
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("command", "drops"),
    [(["fedbayes", "superlink"], False), (["flower-superlink"], True)],
    ids=["fedbayes-superlink", "flowers-own"],
)
def test_a_superlink_that_falls_behind_answers_every_waiting_call(tmp_path, command, drops):
    control_port, fleet_port = free_ports(2)
    arguments = ["--insecure", "--isolation", "process", "--host", "127.0.0.1", "--port", str(control_port)]
    arguments += ["--fleet-api-address", f"127.0.0.1:{fleet_port}"]
    with ProcessGroup(tmp_path / "logs", process_env(tmp_path / "flwr-home")) as group:
        superlink = group.start("superlink", [console_script(command[0]), *command[1:], *arguments], cwd=tmp_path)
        wait_until_serving(superlink)
        ended = asyncio.run(pulls_while_stopped(f"127.0.0.1:{fleet_port}", superlink.popen.pid))
    assert sum(ended.values()) == NODES
    if drops:
        assert ended["CANCELLED"] > 0, f"Flower's own SuperLink answered every call: {ended}"
    else:
        assert ended == {"OK": NODES}


def test_another_flower_is_refused_not_patched(monkeypatch):
    monkeypatch.setattr(grpc, "server", grpc.server)
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    flowers = grpc.server
    with pytest.raises(SystemExit, match="patches Flower 1.39.0's gRPC servers, but Flower 1.40.0 is installed"):
        queueing_pending_calls(*PENDING_CALLS)
    assert grpc.server is flowers
