"""The client's round core, shared by every strategy's client half: decode and check the instruction, check the
model, load the durable state the server's accepted rounds point to, run the algorithm's `local_update`, commit
the new state, build the reply's header and encode it. The algorithm supplies only `local_update`, from what the
instruction says: a client never reads the run config to learn what the server meant."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flwr.app import RecordDict
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.params import get_parameters, set_parameters
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.state import ClientState
from fedbayes.protos.codec import TensorLayout, decode, encode, new_header


@dataclass
class LocalRound:
    """What `local_update` works from: the decoded instruction, its tensors, this client's runtime (data, model,
    device) and its durable state after the last round the server accepted (None: first round, or lost)."""

    instruction: ProtoMessage
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    runtime: ClientRuntime
    stored: ClientState | None

    @property
    def server_round(self) -> int:
        return self.instruction.header.server_round

    @property
    def num_examples(self) -> int:
        return len(self.runtime.data.labels)


@dataclass
class LocalResult:
    """`local_update`'s answer: the reply message (the core fills in its header, num_examples and, for a
    stateful half, resumed_from_round), its tensor groups, and the durable state to commit (stateful halves)."""

    reply: ProtoMessage
    tensors: Mapping[str, Mapping[str, np.ndarray]]
    state: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientHalf:
    """A strategy's client half: `ClientHalf(...)(content, runtime)` turns an instruction into a reply.

    instruction_type  the protobuf message the server sends
    local_update      LocalRound -> LocalResult: the algorithm's local step
    layouts           (instruction, model layout) -> the layout of every tensor group of the instruction
    stateful          the half keeps durable state between rounds (client/state.py)

    The model's buffers (BatchNorm statistics) are the core's: it loads the global ones before `local_update`
    and returns the model's after it; `runtime.layout` and the algorithm's math are the parameters alone.
    """

    instruction_type: type[ProtoMessage]
    local_update: Callable[[LocalRound], LocalResult]
    layouts: Callable[[ProtoMessage, TensorLayout], Mapping[str, TensorLayout]]
    stateful: bool = False

    def __call__(self, content: RecordDict, runtime: ClientRuntime) -> RecordDict:
        def layouts(message: ProtoMessage) -> dict[str, TensorLayout]:
            return {**self.layouts(message, runtime.layout), "buffers": runtime.buffer_layout}

        payload = decode(content, self.instruction_type, layouts, sender="server")
        header = payload.message.header
        set_parameters(runtime.model, payload.tensors["buffers"])  # the global buffers; training updates them
        stored = runtime.load_state(header) if self.stateful else None
        result = self.local_update(LocalRound(payload.message, payload.tensors, runtime, stored))
        result.tensors = {**result.tensors, "buffers": get_parameters(runtime.model, runtime.buffer_layout)}
        if self.stateful:
            runtime.save_state(header, ClientState(result.state, {"federation": header.federation}))
            result.reply.resumed_from_round = stored.round if stored is not None else 0
        result.reply.header.CopyFrom(new_header(header.federation, header.server_round, runtime.node.client_id))
        result.reply.num_examples = len(runtime.data.labels)
        return encode(result.reply, result.tensors)


def model_layouts(*groups: str) -> Callable[[ProtoMessage, TensorLayout], dict[str, TensorLayout]]:
    """Layouts for an instruction whose tensor groups are each shaped like the model."""
    return lambda instruction, layout: {group: layout for group in groups}
