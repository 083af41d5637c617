"""ClientApp: node config -> client identity, data partition, device; run the strategy's client half."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; see tasks/compute.py

import time
from logging import INFO

import torch
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.common import log

from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.protos.codec import TIMINGS_KEY, check_payload_size
from fedbayes.strategies import get_algorithm
from fedbayes.tasks.compute import configure_threads
from fedbayes.tasks.config import RunSettings
from fedbayes.tasks.slots import compute_slot

app = ClientApp()


@app.train()
def train(message: Message, context: Context) -> Message:
    with compute_slot():  # a local federation lets only as many ClientApps compute at once as it has cores
        return _train(message, context)


def _train(message: Message, context: Context) -> Message:
    configure_threads()
    settings = RunSettings.from_run_config(context.run_config)
    node = NodeSettings.from_node_config(context.node_config, default_device=settings.device)
    started = time.perf_counter()
    runtime = ClientRuntime.create(settings, node)
    setup = time.perf_counter() - started
    log(INFO, "%s: %d examples, training on %s", node.client_id, len(runtime.data.labels), describe(runtime.device))
    check_payload_size(message.content, settings.max_payload_mb, sender="server")
    started = time.perf_counter()
    reply = get_algorithm(settings.strategy).client_update(message.content, runtime)
    # Where this client's part of the round went: data/model setup, the whole update (decode, state, train,
    # encode; the reply's compute_seconds is the training alone), the durable state's load and save.
    reply[TIMINGS_KEY] = ConfigRecord({"setup": setup, "update": time.perf_counter() - started, **runtime.timings})
    check_payload_size(reply, settings.max_payload_mb, sender=f"this client's ({node.client_id}) reply")
    return Message(reply, reply_to=message)


def describe(device: torch.device) -> str:
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
