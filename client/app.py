"""ClientApp: node config -> client identity, data partition, device; run the strategy's client half."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; see tasks/compute.py

import json
import time
from logging import INFO

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import log

from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.client.state import ClientStateStore, leave_request_note
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import TIMINGS_KEY, check_payload_size, decode_header, encode, reply_header
from fedbayes.strategies import get_algorithm, run_settings
from fedbayes.tasks.compute import configure_threads
from fedbayes.tasks.config import RunSettings
from fedbayes.tasks.slots import compute_slot
from fedbayes.tasks.storage import write_atomically

app = ClientApp()


@app.train()
def train(message: Message, context: Context) -> Message:
    """The ClientApp's train handler: answer the server's instruction, training where it asks this client to, while
    holding one of the federation's compute slots (tasks/slots.py).

    Args:
        message: the server's message; its content an Instruction (or a strategy's forget request).
        context: the run's context: its run config and this node's node config.

    Returns:
        The reply: the strategy's Reply with this client's timings, its part of its own forget, or a LeaveAndForget.

    Raises:
        ConfigError: the run config or node config is invalid.
        PayloadError: the instruction or the reply is over the run's `max-payload-mb`, or the instruction is
            malformed.
        RuntimeError: the server has forgotten this client and refuses its replies.
        ValueError: what the client half, its data or its model refuses (ClientRuntime.create, ClientHalf).
    """
    with compute_slot():  # a local federation lets only as many ClientApps compute at once as it has cores
        return _train(message, context)


def _train(message: Message, context: Context) -> Message:
    configure_threads()
    settings = run_settings(context.run_config)
    node = NodeSettings.from_node_config(context.node_config, default_device=settings.device)
    check_payload_size(message.content, settings.max_payload_mb, sender="server")
    answer = answer_without_training(message.content, node, settings)
    if answer is not None:
        return Message(answer, reply_to=message)
    forgotten = decode_header(message.content, sender="server").forgotten_client_id
    if forgotten == node.client_id:  # every reply would be refused: say why here, where the client's operator looks
        raise RuntimeError(
            f"the server has forgotten client {node.client_id!r} (fedbayes forget) and refuses its "
            "replies; stop this client, or ask the federation's operator to readmit it"
        )
    started = time.perf_counter()
    runtime = ClientRuntime.create(settings, node)
    setup = time.perf_counter() - started
    log(INFO, "%s: %d examples, training on %s", node.client_id, len(runtime.data.labels), describe(runtime.device))
    started = time.perf_counter()
    reply = get_algorithm(settings.strategy).client_half()(message.content, runtime)
    # Where this client's part of the round went: data/model setup, the whole update (decode, state, train,
    # encode; the reply's compute_seconds is the training alone), the durable state's load and save.
    reply[TIMINGS_KEY] = ConfigRecord({"setup": setup, "update": time.perf_counter() - started, **runtime.timings})
    check_payload_size(reply, settings.max_payload_mb, sender=f"this client's ({node.client_id}) reply")
    return Message(reply, reply_to=message)


def answer_without_training(content: RecordDict, node: NodeSettings, settings: RunSettings) -> RecordDict | None:
    """What this client answers without data or training (None: it trains): its part of its own forget, where the
    server asks for it (a strategy whose factor lives on the client, client/core.py ForgetHalf; whether this client
    leaves or the operator asked), else, when it is leaving (`--leave --forget`), a LeaveAndForget.

    Args:
        content: the server's message content.
        node: this SuperNode's settings.
        settings: the run's settings; its strategy's client half says whether it has a forget half.

    Returns:
        The reply's content, or None when the client is to train.

    Raises:
        PayloadError: the message's envelope is malformed.
        ValueError: the server asks for this client's part of its forget but names no accepted round of it.
        StateLostError: the state of that round is gone.
        StateCorruptError: its file cannot be read.
    """
    forget = getattr(get_algorithm(settings.strategy).client_half(), "forget", None)
    if forget is not None and forget.asks(content):
        log(INFO, "%s: computing this client's part of its forget from its durable state", node.client_id)
        return forget(content, node)
    if node.leave_and_forget:
        return leave_and_forget(content, node)
    return None


def leave_and_forget(content: RecordDict, node: NodeSettings) -> RecordDict:
    """The answer of a client leaving for good (`fedbayes client --leave --forget`) to any instruction: LeaveAndForget,
    no training. Once the instruction says the server has forgotten it (Header.forgotten_client_id; server/forget/),
    its durable state in that federation is deleted first, and the leave marker stops `fedbayes client`; until then
    each request is noted (the leave-request note) for `fedbayes client` to report.

    Args:
        content: the server's message content; only its header is read.
        node: this SuperNode's settings: its client id and state directory.

    Returns:
        The LeaveAndForget reply's content.

    Raises:
        PayloadError: the message's envelope is malformed.
        OSError: the state cannot be deleted, or the marker or note written.
    """
    header = decode_header(content, sender="server")
    if header.forgotten_client_id == node.client_id:
        store = ClientStateStore(node.state_dir, header.federation, node.client_id)
        marker = store.delete_for_leaving(header.server_round)
        log(
            INFO,
            "%s: the server has forgotten this client; deleted %s, leaving (%s)",
            node.client_id,
            store.directory,
            marker,
        )
    else:
        log(INFO, "%s: asking the server to forget this client (round %d)", node.client_id, header.server_round)
        note = {"federation": header.federation, "round": header.server_round}
        write_atomically(leave_request_note(node.state_dir, node.client_id), json.dumps(note).encode())
    return encode(pb.LeaveAndForget(header=reply_header(header, node.client_id)), None, {})


def describe(device: torch.device) -> str:
    """A device as the client's log names it.

    Args:
        device: the device the client trains on.

    Returns:
        For a CUDA device the device and its GPU name, "cuda:0 (<name>)"; else the device as torch prints it.
    """
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
