"""The client's round core, shared by every strategy's client half: decode and check the instruction, check the
model, load the durable state the server's accepted rounds point to, run the algorithm's `local_update`, commit
the new state, and wrap its reply in a Reply envelope (header, echoing the instruction's nonce; num_examples,
train_loss, compute_seconds, resumed_from_round, the model's buffers). The algorithm supplies only `local_update`,
from what the instruction says: a client never reads the run config to learn what the server meant. Where the
instruction asks for it (Instruction.client_evaluation), the core holds out a share of the client's examples from
training and reports the metrics on it of the global model and of the client's own posterior (client/evaluation.py),
which the strategy names (`ClientHalf.global_model`, `ClientHalf.local_posterior`). Where a
strategy's forget needs the client's own part (its factor lives only here), `ForgetHalf` answers that request from
the durable state alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import RecordDict
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.params import TensorLayout, Tensors, get_parameters, set_parameters, unflatten
from fedbayes.client.evaluation import held_out_metrics, held_out_split
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.client.state import ClientState, ClientStateStore
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import (
    decode,
    decode_header,
    encode,
    instruction_body_type,
    register_message_types,
    reply_header,
)
from fedbayes.tasks.compute import resolve_device
from fedbayes.tasks.datasets import Dataset


@dataclass
class LocalRound:
    """What `local_update` works from: the decoded instruction (the strategy's message), its tensors, its envelope's
    header, this client's runtime (data, model, device) and its durable state after the last round the server
    accepted (None: first round, or lost)."""

    instruction: ProtoMessage
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    header: pb.Header
    runtime: ClientRuntime
    stored: ClientState | None

    @property
    def server_round(self) -> int:
        return self.header.server_round

    @property
    def num_examples(self) -> int:
        return len(self.runtime.data.labels)


@dataclass
class LocalResult:
    """`local_update`'s answer: the strategy's reply message and its tensor groups, what every reply reports (the
    last epoch's mean training loss, the seconds of pure local compute), and the durable state to commit (stateful
    halves). The core wraps the reply in its envelope."""

    reply: ProtoMessage
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    train_loss: float
    compute_seconds: float
    state: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ForgetRound:
    """What a strategy's `forget_step` works from: the server's request (the strategy's message) and its tensors, its
    envelope's header, this client's durable state after its last accepted round (its factor), and the device the
    node config names. No data and no model: a leaving client has neither."""

    instruction: ProtoMessage
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    header: pb.Header
    stored: ClientState
    device: torch.device


@dataclass
class ForgetResult:
    """`forget_step`'s answer: the strategy's reply message, its tensor groups, the seconds of compute."""

    reply: ProtoMessage
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    compute_seconds: float


@dataclass(frozen=True)
class ForgetHalf:
    """A strategy's client half of forgetting its own client, where the client's factor lives only in its durable store
    (DSVGD, U-DSVGD; the server's half is strategies/base.py ClientForget). The server asks between rounds with an
    `instruction_type` message; `forget_step` answers it from the state of the client's last accepted round alone,
    which stays as it is (the server may refuse the answer, and the client asks again). `layouts`: (instruction,
    stored state) -> the layout of every tensor group of the instruction (the state fixes the sizes: a leaving
    client has no model to read them from).

    The reply is a Reply envelope whose resumed_from_round names the round of the state used, num_examples 0 (no
    data is used)."""

    instruction_type: type[ProtoMessage]
    forget_step: Callable[[ForgetRound], ForgetResult]
    layouts: Callable[[ProtoMessage, ClientState], Mapping[str, TensorLayout]]

    def __post_init__(self) -> None:
        register_message_types(self.instruction_type)

    def asks(self, content: RecordDict) -> bool:
        """Whether `content` is this half's request (by its body's declared type; decoding checks the rest).

        Args:
            content: a message's content as received.

        Returns:
            True when it is an Instruction whose body declares `instruction_type`.
        """
        return instruction_body_type(content) == self.instruction_type.DESCRIPTOR.full_name

    def __call__(self, content: RecordDict, node: NodeSettings) -> RecordDict:
        header = decode_header(content, sender="server")
        store = ClientStateStore(node.state_dir, header.federation, node.client_id)
        stored = store.load(header.accepted_rounds.get(node.client_id, 0), header.server_round)
        if stored is None:
            raise ValueError(
                f"{node.client_id}: the server asks for this client's part of its forget but names no accepted round "
                "of it: this client holds no factor the server's state has"
            )
        payload = decode(
            content, pb.Instruction, self.instruction_type, lambda message: self.layouts(message, stored), "server"
        )
        result = self.forget_step(
            ForgetRound(payload.message, payload.tensors, header, stored, resolve_device(node.device))
        )
        envelope = pb.Reply(
            header=reply_header(header, node.client_id),
            num_examples=0,
            compute_seconds=result.compute_seconds,
            resumed_from_round=stored.round,
        )
        return encode(envelope, result.reply, result.tensors)


# The members of a predictive, each the model's parameters by name (one: a point estimate or a Gaussian's mean;
# several: particles): of the global model, from the instruction; of the client's own posterior, after training.
GlobalModel = Callable[["LocalRound"], list[Tensors]]
LocalPosterior = Callable[["LocalRound", "LocalResult"], list[Tensors]]


@dataclass(frozen=True)
class ClientHalf:
    """A strategy's client half: `ClientHalf(...)(content, runtime)` turns an instruction into a reply.

    instruction_type  the protobuf message the server sends (registered with the codec as an envelope body)
    local_update      LocalRound -> LocalResult: the algorithm's local step
    layouts           (instruction, model layout) -> the layout of every tensor group of the instruction
    stateful          the half keeps durable state between rounds (client/state.py)
    forget            where the client's factor lives only in its durable store: the half that computes the client's
                      part of its own forget (ForgetHalf; None: the server forgets without the client)
    global_model      LocalRound -> the global model's members, from the instruction (`model_group`): what the
                      client evaluates on its held-out examples before training, where the server asks
                      (client-eval-fraction); None: this half cannot evaluate, and refuses such an instruction
    local_posterior   (LocalRound, LocalResult) -> the members of the client's own posterior after training, also
                      evaluated there; None (or no members): the strategy keeps no posterior of the client's own

    The model's buffers (BatchNorm statistics) are the core's: it loads the global ones before `local_update`
    and returns the model's after it; `runtime.layout` and the algorithm's math are the parameters alone.
    """

    instruction_type: type[ProtoMessage]
    local_update: Callable[[LocalRound], LocalResult]
    layouts: Callable[[ProtoMessage, TensorLayout], Mapping[str, TensorLayout]]
    stateful: bool = False
    forget: ForgetHalf | None = None
    global_model: GlobalModel | None = None
    local_posterior: LocalPosterior | None = None

    def __post_init__(self) -> None:
        register_message_types(self.instruction_type)

    def __call__(self, content: RecordDict, runtime: ClientRuntime) -> RecordDict:
        def layouts(message: ProtoMessage) -> dict[str, TensorLayout]:
            return {**self.layouts(message, runtime.layout), "buffers": runtime.buffer_layout}

        payload = decode(content, pb.Instruction, self.instruction_type, layouts, sender="server")
        header = payload.header
        held_out = None
        if payload.envelope.HasField("client_evaluation"):  # train on the rest, evaluate on the held-out share
            training, held_out = self.held_out(payload.envelope.client_evaluation, runtime)
            runtime = dataclasses.replace(runtime, data=training)  # shares runtime.timings
        set_parameters(runtime.model, payload.tensors["buffers"])  # the global buffers; training updates them
        stored = runtime.load_state(header) if self.stateful else None
        local = LocalRound(payload.message, payload.tensors, header, runtime, stored)
        global_metrics = None
        if held_out is not None:  # before training, at the global buffers
            global_metrics = self.metrics(runtime, self.global_members(local), payload.tensors["buffers"], held_out)
        result = self.local_update(local)
        if self.stateful:
            runtime.save_state(header, ClientState(result.state, {"federation": header.federation}))
        envelope = pb.Reply(
            header=reply_header(header, runtime.node.client_id),
            num_examples=len(runtime.data.labels),
            train_loss=result.train_loss,
            compute_seconds=result.compute_seconds,
            resumed_from_round=stored.round if stored is not None else 0,
        )
        buffers = get_parameters(runtime.model, runtime.buffer_layout)
        if held_out is not None and global_metrics is not None:
            envelope.evaluation.CopyFrom(self.evaluation(local, result, held_out, global_metrics, buffers))
        return encode(envelope, result.reply, {**result.tensors, "buffers": buffers})

    def held_out(self, request: pb.ClientEvaluationRequest, runtime: ClientRuntime) -> tuple[Dataset, Dataset]:
        """(the examples to train on, the held-out ones), as the server's `request` asks (client/evaluation.py).

        Args:
            request: the instruction's client evaluation: the share to hold out, in (0, 1), and the run's seed.
            runtime: the client's runtime; its data is split, and its client id mixed into the draw.

        Returns:
            (training examples, held-out examples), each in the order of `runtime.data`.

        Raises:
            ValueError: this half names no global model to evaluate (before anything is trained), or the share
                leaves nothing to train on or to evaluate on.
        """
        if self.global_model is None:
            raise ValueError(
                f"the server asks this client to evaluate on held-out examples (client-eval-fraction), but the client "
                f"half of {self.instruction_type.DESCRIPTOR.name} names no global model to evaluate "
                "(ClientHalf.global_model); set client-eval-fraction = 0"
            )
        return held_out_split(runtime.data, request, runtime.node.client_id)

    def global_members(self, local: LocalRound) -> list[Tensors]:
        """The global model's members, from the instruction (`global_model`).

        Args:
            local: the round.

        Returns:
            The members, each the model's parameters by name.

        Raises:
            ValueError: this half names no global model.
        """
        if self.global_model is None:  # held_out refuses such an instruction before this
            raise ValueError(f"the client half of {self.instruction_type.DESCRIPTOR.name} names no global model")
        return self.global_model(local)

    def evaluation(
        self,
        local: LocalRound,
        result: LocalResult,
        held_out: Dataset,
        global_metrics: pb.HeldOutMetrics,
        buffers: Tensors,
    ) -> pb.ClientEvaluation:
        """The reply's held-out metrics: the global model's (before training), and the client's own posterior's after
        training (at the model's buffers after training), where the strategy keeps one.

        Args:
            local: the round.
            result: `local_update`'s answer, from which `local_posterior` takes the client's members.
            held_out: the held-out examples.
            global_metrics: the global model's metrics on them, taken before training.
            buffers: the model's buffers after training, by name.

        Returns:
            The metrics; `local_posterior` is unset where the strategy has no members of the client's own.
        """
        evaluation = pb.ClientEvaluation(examples=len(held_out.labels), global_model=global_metrics)
        members = self.local_posterior(local, result) if self.local_posterior is not None else []
        if members:
            evaluation.local_posterior.CopyFrom(self.metrics(local.runtime, members, buffers, held_out))
        return evaluation

    @staticmethod
    def metrics(
        runtime: ClientRuntime, members: list[Tensors], buffers: Tensors, held_out: Dataset
    ) -> pb.HeldOutMetrics:
        """The metrics of the predictive `members` on the held-out examples (client/evaluation.py).

        Args:
            runtime: the client's runtime: its model (left as it is) and device.
            members: the predictive's members, each the model's parameters by name.
            buffers: the model's buffers by name, added to every member.
            held_out: the held-out examples.

        Returns:
            Accuracy, mean NLL and ECE.

        Raises:
            ValueError: no members.
        """
        return held_out_metrics(runtime.model, [member | buffers for member in members], held_out, runtime.device)


def model_group(group: str) -> GlobalModel:
    """A `ClientHalf.global_model` for an instruction whose tensor group `group` holds the global model.

    Args:
        group: the instruction's tensor group shaped like the model (FedAvg's "weights").

    Returns:
        LocalRound -> [that group's tensors]: one member, a point estimate.
    """
    return lambda local: [dict(local.tensors[group])]


def particle_members(particles: np.ndarray, layout: TensorLayout) -> list[Tensors]:
    """Particles as the members of a predictive.

    Args:
        particles: (N, P), each row all P parameters flat, in `layout` order.
        layout: the model's parameters.

    Returns:
        N members, each the model's parameters by name.
    """
    return [unflatten(np.asarray(row), layout) for row in particles]


def model_layouts(*groups: str) -> Callable[[ProtoMessage, TensorLayout], dict[str, TensorLayout]]:
    """Layouts for an instruction whose tensor groups are each shaped like the model.

    Args:
        groups: the names of the instruction's tensor groups.

    Returns:
        A `ClientHalf.layouts`: (instruction, model layout) -> that layout for each of `groups`.
    """
    return lambda instruction, layout: {group: layout for group in groups}
