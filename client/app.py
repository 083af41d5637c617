"""ClientApp: node config -> client identity, data partition, device; run the strategy's client half."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; see tasks/compute.py

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.runtime import ClientRuntime, NodeSettings
from strategies import get_algorithm
from tasks.compute import configure_threads
from tasks.config import RunSettings

app = ClientApp()


@app.train()
def train(message: Message, context: Context) -> Message:
    configure_threads()
    settings = RunSettings.from_run_config(context.run_config)
    node = NodeSettings.from_node_config(context.node_config, default_device=settings.device)
    runtime = ClientRuntime.create(settings, node)
    reply = get_algorithm(settings.strategy).client_update(message.content, runtime)
    return Message(reply, reply_to=message)
