"""What the tests build their worlds from, in one place: run settings, a fake Flower grid, client runtimes, an
in-process federation, replies as the server receives them, the round loop on a fake grid, data files.

Process-level helpers (loopback federations, the `fedbayes` command, fault injection) are in
tests/support/processes.py; problems with closed-form answers in tests/support/problems.py; rogue replies in
tests/support/rogue.py."""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, Metadata, RecordDict
from flwr.app.message.message import make_message

from fedbayes.bayes.metrics import classification_metrics
from fedbayes.bayes.params import get_parameters, parameter_layout
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import (
    ENVELOPE_KEY,
    ENVELOPES,
    Payload,
    decode,
    decode_header,
    encode,
    envelope_type,
    new_header,
    tensor_group_fields,
)
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.server.loop import run_rounds
from fedbayes.server.round_core import RoundCore, RoundPlan
from fedbayes.strategies import get_algorithm, run_settings
from fedbayes.strategies.base import ServerState, ServerStrategy
from fedbayes.strategies.fedavg.server import FedAvg
from fedbayes.tasks.config import LoopSettings, RunSettings
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.models import build_model

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
LAYOUT = {"fc.weight": (3, 4), "fc.bias": (3,)}  # a tiny model's parameters, for servers fed by hand

NO_GPU = "no CUDA GPU on this machine (CI has none): the cuda path is checked only where a GPU is present"


def pyproject_run_config(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, Any]:
    """The run-config keys and defaults a Flower app's pyproject.toml lists ([tool.flwr.app.config])."""
    with open(pyproject, "rb") as file:
        return tomllib.load(file)["tool"]["flwr"]["app"]["config"]


DEFAULTS = {**pyproject_run_config(), "federation": "fed"}


def settings(**overrides: Any) -> RunSettings:
    """Run settings: the checkout's defaults (federation "fed") with `overrides` by key, written `local_epochs` or,
    in a dict, "local-epochs"."""
    return run_settings({**DEFAULTS, **{key.replace("_", "-"): v for key, v in overrides.items()}})


# ---- replies and payloads ------------------------------------------------------------------------------------
def weights(value: float = 0.5) -> dict[str, np.ndarray]:
    return {name: np.full(shape, value, dtype=np.float32) for name, shape in LAYOUT.items()}


def reply_envelope(
    client_id: str = "client-0", server_round: int = 1, num_examples: int = 10, resumed_from_round: int = 0
) -> pb.Reply:
    """The envelope of a client's reply, as a client's round core fills it in."""
    return pb.Reply(
        header=new_header("fed", server_round, client_id),
        num_examples=num_examples,
        train_loss=0.3,
        resumed_from_round=resumed_from_round,
    )


def fedavg_reply(client_id: str = "client-0", server_round: int = 1, num_examples: int = 10, value: float = 0.5):
    return encode(reply_envelope(client_id, server_round, num_examples), pb.FedAvgReply(), {"weights": weights(value)})


def envelope_of(content: RecordDict) -> pb.Instruction | pb.Reply | pb.LeaveAndForget:
    """A payload's envelope as it was sent, unchecked."""
    kind = next(kind for kind in ENVELOPES if kind.DESCRIPTOR.full_name == envelope_type(content))
    return kind.FromString(content.config_records[ENVELOPE_KEY]["message"])


def declared_payload(content: RecordDict, message_type: type) -> Payload:
    """`content` decoded with the layouts its own manifests declare (a test's view of what crossed the wire)."""
    envelope = envelope_of(content)
    message = message_type()
    envelope.body.Unpack(message)
    layouts = {
        group: {spec.name: tuple(spec.shape) for spec in getattr(part, group).tensors}
        for part in (message, envelope)
        for group in tensor_group_fields(type(part))
    }
    return decode(content, type(envelope), message_type, layouts, sender="test")


def answering(instruction: Message, content: RecordDict) -> RecordDict:
    """`content`, a reply a test made, as the answer to `instruction`: its header echoes the instruction's nonce
    (Header.nonce), as a client's round core does; every record as it was."""
    envelope = envelope_of(content)
    envelope.header.nonce = decode_header(instruction.content, "server").nonce
    answer = RecordDict(dict(content.items()))
    answer[ENVELOPE_KEY] = ConfigRecord(
        {"type": envelope.DESCRIPTOR.full_name, "message": envelope.SerializeToString()}
    )
    return answer


def answers(core: RoundCore, server_round: int, replies: dict[int, RecordDict]) -> tuple[RoundPlan, list[Message]]:
    """`replies` (node -> a reply a test made) as the ServerApp receives them in round `server_round`, each the
    answer to an instruction `core` addressed to its node this round (as its `configure` does: each node gets a
    nonce of its own, which its reply echoes); with the round's plan, as `core.aggregate` takes them."""
    instruction = pb.Instruction(header=new_header(core.settings.federation, server_round))
    plan = core.instructions(instruction, pb.LocalTraining(), {}, list(replies))
    return plan, [
        reply_message(answering(message, replies[message.metadata.dst_node_id]), message.metadata.dst_node_id)
        for message in plan.messages
    ]


def reply_message(content: RecordDict | None, node_id: int, error=None, reply_to: str | None = None) -> Message:
    """A reply as the ServerApp receives it from node `node_id` (no Flower run needed)."""
    metadata = Metadata(
        run_id=1,
        message_id=f"reply-{node_id}",
        src_node_id=node_id,
        dst_node_id=0,
        reply_to_message_id=reply_to or f"instruction-{node_id}",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type="train",
    )
    if error is not None:
        return make_message(metadata=metadata, error=error)
    return make_message(metadata=metadata, content=content)


# ---- a fake grid -------------------------------------------------------------------------------------------
Answer = Callable[[Message], "RecordDict | Error | None"]


class FakeGrid:
    """Just enough of Flower's Grid for the server: the connected nodes and, for the round loop, the messages it is
    pushed and the replies it is asked for. `answer(message)` is a pushed message's reply content (or the Error its
    ClientApp answered with), asked at every pull until it gives one (None: its node is silent so far)."""

    def __init__(self, nodes: Iterable[int], answer: Answer | None = None) -> None:
        self.nodes = list(nodes)
        self.answer = answer
        self.pushed: dict[str, Message] = {}
        self.round = 0  # the newest round pushed

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            self.round = round_of(message)
            ids.append(f"r{self.round}-n{message.metadata.dst_node_id}")
            self.pushed[ids[-1]] = message
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        replies = []
        for message_id in message_ids:
            message = self.pushed[message_id]
            content = self.answer(message)
            if content is not None:
                del self.pushed[message_id]
                error = content if isinstance(content, Error) else None  # a ClientApp's error
                node = message.metadata.dst_node_id
                replies.append(reply_message(None if error else content, node, error=error, reply_to=message_id))
        return replies


def round_core(strategy: ServerStrategy) -> RoundCore:
    """`strategy` in a round core of its own, as the ServerApp runs it."""
    return RoundCore(strategy.settings, strategy)


def round_of(message: Message) -> int:
    return decode_header(message.content, "server").server_round


def scripted(reply: Callable[[int, int], RecordDict | Error | None]) -> Answer:
    """An `answer` from `reply(round, node)`: a reply it makes answers the message it is asked for (echoes its
    nonce)."""

    def answer(message: Message) -> RecordDict | Error | None:
        content = reply(round_of(message), message.metadata.dst_node_id)
        return answering(message, content) if isinstance(content, RecordDict) else content

    return answer


# ---- clients ------------------------------------------------------------------------------------------------
def synthetic_data(size: int, seed: int) -> Dataset:
    """`size` 2-class points in 5 dimensions (as 1x1x5 images) of a seeded logistic problem."""
    rng = np.random.default_rng(seed)
    inputs = rng.normal(rng.normal(0, 1, 5), 1.0, size=(size, 1, 1, 5)).astype(np.float32)
    labels = (inputs.reshape(size, 5) @ rng.normal(size=5) > 0).astype(np.int64)
    return Dataset("synthetic", torch.from_numpy(inputs), torch.from_numpy(labels), 2, pixel_scale=1.0)


def contains_run(values: np.ndarray, run: np.ndarray) -> bool:
    """Whether `run` appears in the flat `values` as consecutive entries (e.g. a training input inside a payload)."""
    starts = np.flatnonzero(values[: len(values) - len(run) + 1] == run[0])
    return any(np.array_equal(values[start : start + len(run)], run) for start in starts)


def synthetic_task(folder: Path) -> str:
    """The run-config `dataset` of synthetic_data's task (a test.npz of 40 of its points under `folder`): what a
    server half that reads the task (one example's shape, the classes) finds."""
    folder.mkdir(parents=True, exist_ok=True)
    test = synthetic_data(40, seed=0)
    np.savez(folder / "test.npz", x=test.images.numpy(), y=test.labels.numpy())
    return f"npz:{folder}"


def client_runtime(
    run: RunSettings, client_id: str, state_dir: Path, data: Dataset, device: str = "cpu"
) -> ClientRuntime:
    """A client holding `data`, with the run's model (seeded: every client starts from the same weights), training
    on `device`. The model's buffers are not wired: the servers these clients talk to have none either."""
    torch.manual_seed(0)
    model = build_model(run.model, data.input_shape, data.num_classes)
    node = NodeSettings(client_id, 0, 1, "", str(state_dir), device)
    return ClientRuntime(run, node, data, model, parameter_layout(model), torch.device(device))


def partition_runtime(
    run: RunSettings, state_dir: Path, partition: int = 0, partitions: int = 10, client_id: str | None = None
) -> ClientRuntime:
    """A client as a SuperNode's node config makes it: partition `partition` of the run's split of its dataset."""
    config = {"partition-id": partition, "num-partitions": partitions, "state-dir": str(state_dir)}
    node = NodeSettings.from_node_config(config | ({"client-id": client_id} if client_id else {}), default_device="cpu")
    torch.manual_seed(0)  # the same initial model in every runtime
    return ClientRuntime.create(run, node)


def newest_state(store):
    """The newest state a client store holds, accepted or not (None: none)."""
    rounds = store.saved_rounds()
    return store.load(rounds[-1], rounds[-1] + 1) if rounds else None


class InProcessFederation:
    """A strategy's server half in its round core (`server`, `core`) and real client halves (durable stores under
    `tmp_path`) exchanging real encoded payloads in this process, no network: node k holds client-k with
    synthetic_data(sizes[k-1], k) and a logistic regression; the run's dataset is synthetic_task's."""

    def __init__(self, tmp_path: Path, overrides: dict, sizes: list[int]) -> None:
        task = synthetic_task(tmp_path / "task")
        self.settings = run_settings({**DEFAULTS, "model": "logreg", "federation": "fed", "dataset": task, **overrides})
        algorithm = get_algorithm(self.settings.strategy)
        self.client_update = algorithm.client_half()
        self.runtimes = {
            node: client_runtime(self.settings, f"client-{node}", tmp_path / "state", synthetic_data(size, node))
            for node, size in enumerate(sizes, start=1)
        }
        self.layout = next(iter(self.runtimes.values())).layout
        self.server = algorithm.build_server(self.settings, self.layout)
        self.core = RoundCore(self.settings, self.server)
        torch.manual_seed(0)
        initial = get_parameters(build_model("logreg", (1, 1, 5), 2))
        self.arrays = ArrayRecord({name: Array(value) for name, value in initial.items()})
        self.report = None  # the last round's RoundReport

    def answer(self, message: Message) -> RecordDict:
        """The reply of the client half of the node `message` is for."""
        return self.client_update(message.content, self.runtimes[message.metadata.dst_node_id])

    def round(self, server_round: int, nodes: list[int], return_metrics: bool = False):
        """One round with `nodes` connected; returns the nodes the server sent work to (or the round's metrics), and
        keeps its report in `report`."""
        plan = self.core.configure(server_round, self.arrays, FakeGrid(nodes))
        replies = [reply_message(self.answer(m), m.metadata.dst_node_id) for m in plan.messages]
        outcome = self.core.aggregate(plan, replies)
        self.arrays = outcome.arrays if outcome.arrays is not None else self.arrays
        self.report = outcome.report
        return outcome.metrics if return_metrics else [m.metadata.dst_node_id for m in plan.messages]


# ---- the round loop on a fake grid --------------------------------------------------------------------------
def no_metrics(arrays, server_round: int) -> dict[str, float]:
    return {"accuracy": 0.0, "nll": 0.0, "ece": 0.0}


def run_loop(
    tmp_path: Path,
    reply,
    rounds: int = 5,
    evaluate=no_metrics,
    pipeline: bool = True,
    grid: FakeGrid | None = None,
    checkpoints: CheckpointStore | None = None,
    round_timeout: float = 0.5,
    **overrides: Any,
):
    """A FedAvg server on LAYOUT run by the real round loop for `rounds` rounds against nodes 1 and 2, which answer
    `reply(round, node)` (or `grid`'s way); rows in <tmp_path>/r.jsonl. Returns (round core, final arrays)."""
    run_settings = settings(**overrides)
    core = RoundCore(run_settings, FedAvg(run_settings, LAYOUT))
    initial = ArrayRecord({name: Array(value) for name, value in weights(0.0).items()})
    loop = LoopSettings(
        num_rounds=rounds,
        round_timeout=round_timeout,
        poll_interval=0.01,
        wait_for_clients=2,
        wait_for_clients_timeout=5,
        max_failed_rounds=run_settings.max_failed_rounds,
        pipeline_evaluation=pipeline,
        straggler_wait=run_settings.straggler_wait,
    )
    return core, run_rounds(
        grid or FakeGrid([1, 2], scripted(reply)),
        core,
        initial,
        loop,
        evaluate,
        str(tmp_path / "r.jsonl"),
        checkpoints or CheckpointStore(tmp_path / "state", "fed", {}),
    )


def rows(directory: Path, name: str = "r.jsonl") -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / name).read_text().splitlines()]


LABELS = torch.arange(200) % 10


def improving_metrics(arrays, server_round: int) -> dict[str, Any]:
    """Real metrics (reliability bins included) of predictions that get sharper and better each round, and an
    `_ensemble` set as a Bayesian strategy's evaluation adds."""
    generator = torch.Generator().manual_seed(server_round)
    logits = torch.randn(len(LABELS), 10, generator=generator) + server_round * torch.nn.functional.one_hot(LABELS, 10)
    metrics = classification_metrics(torch.softmax(logits, 1), LABELS)
    ensemble = classification_metrics(torch.softmax(logits / 2, 1), LABELS)
    return metrics | {f"{key}_ensemble": value for key, value in ensemble.items()}


# ---- checkpoints ----------------------------------------------------------------------------------------------
def model_arrays(value: float = 0.0) -> dict[str, np.ndarray]:
    return {"1.weight": np.arange(6, dtype=np.float32).reshape(2, 3) + value, "1.bias": np.ones(2, np.float32)}


def checkpoint(server_round: int = 3, arrays=None, strategy_tensors=None) -> Checkpoint:
    """A checkpoint of a small model with a strategy state of one client's dual mean."""
    return Checkpoint(
        server_round,
        model_arrays() if arrays is None else arrays,
        ServerState(
            {"duals/a/mean": np.linspace(0, 1, 5)} if strategy_tensors is None else strategy_tensors,
            {"dual_rounds": json.dumps({"a": 2})},
        ),
        wall_seconds=12.5,
    )


# ---- data files ---------------------------------------------------------------------------------------------
DIGITS_TEST_FRACTION = 0.3


def write_npz(path: Path, **arrays: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return path


def write_digits(folder: Path, seed: int = 0) -> Path:
    """scikit-learn's 8x8 digits (1,797 images, pixels 0..16) as train.npz and a held-out test.npz (30%)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    cut = round((1 - DIGITS_TEST_FRACTION) * len(order))
    folder.mkdir(parents=True, exist_ok=True)
    for name, chosen in (("train", order[:cut]), ("test", order[cut:])):
        np.savez(folder / f"{name}.npz", x=digits.images[chosen].astype(np.float32), y=digits.target[chosen])
    return folder
