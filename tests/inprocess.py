"""A federation inside the test process: a strategy's server half and real client halves (with durable stores
under tmp_path) exchanging real encoded payloads, no network. For strategies' membership and state tests."""

from __future__ import annotations

import numpy as np
import torch

from flwr.app import Array, ArrayRecord

from fedbayes.bayes.params import get_parameters, parameter_layout
from fedbayes.client.runtime import ClientRuntime, NodeSettings
from fedbayes.strategies import get_algorithm
from fedbayes.tasks.config import RunSettings
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.models import build_model
from tests.helpers import reply_message
from tests.test_config import DEFAULTS


class FakeGrid:
    def __init__(self, nodes):
        self.nodes = list(nodes)

    def get_node_ids(self):
        return self.nodes


def synthetic_runtime(settings: RunSettings, client_id: str, size: int, state_dir, seed: int) -> ClientRuntime:
    """A client with `size` 2-class points in 5 dimensions (as 1x1x5 images) and a logistic regression."""
    rng = np.random.default_rng(seed)
    inputs = rng.normal(rng.normal(0, 1, 5), 1.0, size=(size, 1, 1, 5)).astype(np.float32)
    labels = (inputs.reshape(size, 5) @ rng.normal(size=5) > 0).astype(np.int64)
    data = Dataset("synthetic", torch.from_numpy(inputs), torch.from_numpy(labels), 2, pixel_scale=1.0)
    torch.manual_seed(0)
    model = build_model("logreg", data.input_shape, 2)
    node = NodeSettings(client_id, 0, 1, "", str(state_dir), "cpu")
    return ClientRuntime(settings, node, data, model, parameter_layout(model), torch.device("cpu"))


class InProcessFederation:
    def __init__(self, tmp_path, overrides: dict, sizes: list[int]):
        self.settings = RunSettings.from_run_config({**DEFAULTS, "model": "logreg", "federation": "fed", **overrides})
        algorithm = get_algorithm(self.settings.strategy)
        self.client_update = algorithm.client_update
        self.runtimes = {node: synthetic_runtime(self.settings, f"client-{node}", size, tmp_path / "state", node)
                         for node, size in enumerate(sizes, start=1)}
        self.layout = next(iter(self.runtimes.values())).layout
        self.server = algorithm.server(self.settings, self.layout)
        torch.manual_seed(0)
        initial = get_parameters(build_model("logreg", (1, 1, 5), 2))
        self.arrays = ArrayRecord({name: Array(value) for name, value in initial.items()})

    def round(self, server_round: int, nodes: list[int], return_metrics: bool = False):
        """One round with `nodes` connected; returns the nodes the server sent work to (or the round's metrics)."""
        messages = list(self.server.configure_train(server_round, self.arrays, None, FakeGrid(nodes)))
        replies = [reply_message(self.client_update(m.content, self.runtimes[m.metadata.dst_node_id]),
                                 m.metadata.dst_node_id) for m in messages]
        arrays, metrics = self.server.aggregate_train(server_round, replies)
        self.arrays = arrays if arrays is not None else self.arrays
        return metrics if return_metrics else [m.metadata.dst_node_id for m in messages]
