"""A BayesADMM federation of 3 in-process clients run by the real round loop behind a scripted grid, whose
checkpoints `fedbayes forget` rebuilds the server from: what the forget-a-client operation tests run
(tests/component/test_forget_ops.py, tests/integration/test_forget_ops.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
from flwr.app import Error
from flwr.common.constant import ErrorCode

from fedbayes.client.app import answer_without_training
from fedbayes.posterior.export import RunLocation
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode_header, encode, reply_header
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.forget import AUDIT_LOG, AuditLog, ForgetRequest, forget_command, rebuild
from fedbayes.server.loop import run_rounds
from fedbayes.server.round_core import RoundCore
from fedbayes.tasks.config import LoopSettings
from tests.support import DEFAULTS, FakeGrid, InProcessFederation, no_metrics, round_of

LEAVING = "leaving"


class ClientsGrid(FakeGrid):
    """The loop's grid with the in-process clients behind it: each message is answered as client/app.py's ClientApp
    answers it (a client's part of its forget without training, else its node's client half; what the ClientApp
    raises comes back as a client error), or as `behaviour[node]` says: LEAVING (as `fedbayes client --leave --forget`
    answers), or a client id to claim in a LeaveAndForget (a spoof). `during_round(round, grid)` runs at every pull,
    while that round is in flight; `instructions[round, node]` is the header each node was sent."""

    def __init__(self, federation: InProcessFederation, behaviour=None, during_round=None):
        super().__init__(federation.runtimes, self.reply)
        self.federation, self.behaviour, self.during_round = federation, behaviour or {}, during_round
        self.instructions: dict[tuple[int, int], pb.Header] = {}

    def push_messages(self, messages):
        messages = list(messages)
        for message in messages:
            header = decode_header(message.content, "server")
            self.instructions[header.server_round, message.metadata.dst_node_id] = header
        return super().push_messages(messages)

    def reply(self, message):
        if self.during_round:
            self.during_round(round_of(message), self)
        try:
            return self.client_answer(message)
        except Exception as error:  # Flower sends what a ClientApp raises back as an error
            return Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(error).__name__}: {error}")

    def client_answer(self, message):
        runtime = self.federation.runtimes[message.metadata.dst_node_id]
        behaviour = self.behaviour.get(message.metadata.dst_node_id)
        if behaviour == LEAVING:
            return answer_without_training(
                message.content, replace(runtime.node, leave_and_forget=True), runtime.settings
            )
        if behaviour is not None:  # a LeaveAndForget claiming another client's id
            header = decode_header(message.content, "server")
            return encode(pb.LeaveAndForget(header=reply_header(header, behaviour)), None, {})
        return answer_without_training(message.content, runtime.node, runtime.settings) or self.federation.answer(
            message
        )


class Federation:
    """A BayesADMM federation of 3 in-process clients (nodes 1-3, ids client-1..3) run by the real round loop, with
    its checkpoints under <tmp>/server-state/fed."""

    def __init__(self, tmp_path: Path, strategy: str = "bayesadmm", sizes=(12, 16, 20), **overrides):
        data = tmp_path / "data"
        data.mkdir(exist_ok=True)
        rng = np.random.default_rng(7)
        x = rng.normal(size=(40, 1, 1, 5)).astype(np.float32)
        np.savez(data / "test.npz", x=x, y=(x.reshape(40, 5) @ rng.normal(size=5) > 0).astype(np.int64))
        self.overrides = {"strategy": strategy, "dataset": f"npz:{data}", "local-epochs": 1, "seed": 3, **overrides}
        self.run_config = {**DEFAULTS, "model": "logreg", **self.overrides}
        self.tmp_path, self.sizes = tmp_path, sizes
        self.state_dir = tmp_path / "server-state"
        self.directory = self.state_dir / "fed"
        self.location = RunLocation(self.state_dir, "fed", {})
        self.clients = InProcessFederation(tmp_path, self.overrides, sizes=list(sizes))

    def run(self, rounds: int, grid: ClientsGrid | None = None):
        """run_rounds through `rounds` (resuming after the newest checkpoint); a fresh server half each time, as a
        restarted ServerApp has. Returns (its round core, arrays, results rows)."""
        core = RoundCore(self.clients.settings, type(self.clients.server)(self.clients.settings, self.clients.layout))
        loop = LoopSettings(
            num_rounds=rounds,
            round_timeout=5.0,
            poll_interval=0.01,
            wait_for_clients=len(self.sizes),
            wait_for_clients_timeout=5.0,
            results_exists="append",
        )
        initial = {name: self.clients.arrays[name].numpy() for name in self.clients.arrays}
        store = CheckpointStore(self.state_dir, "fed", self.run_config, initial_arrays=initial)
        arrays = run_rounds(
            grid or ClientsGrid(self.clients),
            core,
            self.clients.arrays,
            loop,
            no_metrics,
            str(self.tmp_path / "results.jsonl"),
            store,
        )
        return core, arrays, self.rows()

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in (self.tmp_path / "results.jsonl").read_text().splitlines()]

    def forget(self, client: str, refine_rounds: int = 0, readmit: bool = False, wait: float = 5.0) -> dict:
        request = ForgetRequest.by_operator("fed", client, refine_rounds, readmit)
        return forget_command(self.location, request, wait, say=lambda line: None)

    def audit(self) -> list[dict]:
        return AuditLog(self.directory / AUDIT_LOG).records()

    def newest(self):
        return rebuild(self.location)

    def snapshot(self) -> dict[str, str]:
        """Every checkpoint file's hash, by name."""
        return {
            path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(self.directory.glob("checkpoint-*.safetensors"))
        }
