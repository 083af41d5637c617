"""Small builders shared by the tests."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Metadata, RecordDict
from flwr.app.message.message import make_message

from fedbayes.deploy.launcher import LocalFederation
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import ENVELOPE_KEY, Payload, decode, encode, new_header, tensor_group_fields

REPO = Path(__file__).resolve().parents[1]
LAYOUT = {"fc.weight": (3, 4), "fc.bias": (3,)}


def weights(value: float = 0.5) -> dict[str, np.ndarray]:
    return {name: np.full(shape, value, dtype=np.float32) for name, shape in LAYOUT.items()}


def fedavg_reply(client_id: str = "client-0", server_round: int = 1, num_examples: int = 10, value: float = 0.5):
    message = pb.FedAvgReply(
        header=new_header("fed", server_round, client_id), num_examples=num_examples, train_loss=0.3
    )
    return encode(message, {"weights": weights(value)})


def declared_payload(content: RecordDict, message_type: type) -> Payload:
    """`content` decoded with the layouts its own manifests declare (a test's view of what crossed the wire)."""
    message = message_type.FromString(content.config_records[ENVELOPE_KEY]["message"])
    layouts = {group: {spec.name: tuple(spec.shape) for spec in getattr(message, group).tensors}
               for group in tensor_group_fields(message_type)}
    return decode(content, message_type, layouts, sender="test")


def reply_message(content: RecordDict | None, node_id: int, error=None):
    """A reply as the ServerApp receives it from node `node_id` (no Flower run needed)."""
    metadata = Metadata(
        run_id=1,
        message_id=f"reply-{node_id}",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id=f"instruction-{node_id}",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type="train",
    )
    if error is not None:
        return make_message(metadata=metadata, error=error)
    return make_message(metadata=metadata, content=content)


@dataclass
class LoopbackRun:
    rows: list[dict[str, Any]]
    server_log: str
    flwr_home: Path  # to check that no process of the federation outlived it


def run_loopback(
    workdir: Path, config: dict[str, Any], rounds: int, clients: int = 2, executor: str = "shared",
    node_env: dict[int, dict[str, str]] | None = None,
    on_row: Callable[[LocalFederation, dict[str, Any]], None] | None = None,
) -> LoopbackRun:
    """A SuperLink and `clients` SuperNodes on loopback, `config` submitted and followed for `rounds` rounds
    (`on_row(federation, row)` after each, e.g. to restart a client), then everything stopped."""
    with LocalFederation(workdir, executor) as federation:
        for index in range(clients):
            federation.start_supernode(index, clients, extra_env=(node_env or {}).get(index))
        rows = federation.follow(Path(config["results-path"]), federation.submit(config), rounds,
                                 on_row=lambda row: on_row and on_row(federation, row))
        server_log = (federation.log_dir / "flwr-run.log").read_text()
    return LoopbackRun(rows, server_log, federation.flwr_home)


def restart_client_1_after_round_1(store) -> Callable[[LocalFederation, dict[str, Any]], None]:
    """An `on_row` for run_loopback: once round 1's row is out, stop client-1's SuperNode and start it again. The
    row is written when round 1's evaluation is done, which runs while round 2 trains: by then client-1 (its
    state in `store`) may have trained and saved round 2 too."""
    def restart(federation: LocalFederation, row: dict[str, Any]) -> None:
        if row["round"] == 1:
            assert store.latest().round in (1, 2)
            federation.stop_supernode(1)
            federation.start_supernode(1, 2)

    return restart


def stall_env(rounds: str, marker: Path, release: Path | None = None) -> dict[str, str]:
    """Environment for a client whose ClientApp stops in `rounds` (tests/fault_injection_stall)."""
    env = {"PYTHONPATH": f"{REPO / 'tests' / 'fault_injection_stall'}{os.pathsep}{REPO}",
           "FEDBAYES_STALL_ROUNDS": rounds, "FEDBAYES_STALL_MARKER": str(marker)}
    return env | ({"FEDBAYES_STALL_RELEASE": str(release)} if release else {})


def wait_for_file(path: Path, failure: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, failure
        time.sleep(0.1)
