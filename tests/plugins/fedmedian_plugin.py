"""An out-of-tree strategy, written as a user would write one (README "Write your own strategy"): FedMedian,
the coordinate-wise median of the clients' models, on FedAvg's messages and client half. Not part of fedbayes:
the tests put this folder on PYTHONPATH and run it as `strategy = "fedmedian_plugin:FEDMEDIAN"`."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from fedbayes.bayes.params import flatten, unflatten
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import new_header
from fedbayes.strategies import Algorithm
from fedbayes.strategies.base import WireStrategy, local_training, round_metrics
from fedbayes.strategies.fedavg import client_update


class FedMedian(WireStrategy):
    def __init__(self, settings, layout):
        super().__init__(settings)
        self.layout = layout

    def configure_train(self, server_round, arrays, config, grid):
        instruction = pb.FedAvgInstruction(header=new_header(self.settings.federation, server_round),
                                           training=local_training(self.settings, server_round))
        weights = {name: arrays[name].numpy() for name in self.layout}
        return self.instructions(instruction, {"weights": weights}, self.sample(grid, server_round))

    def aggregate_train(self, server_round, replies):
        payloads = self.decode_replies(replies, pb.FedAvgReply, {"weights": self.layout}, server_round)
        if not payloads:
            return None, None
        median = np.median([flatten(payload.tensors["weights"], self.layout) for payload in payloads], axis=0)
        self.commit(payloads, server_round)
        weights = unflatten(median, self.layout)
        return ArrayRecord({name: Array(value) for name, value in weights.items()}), round_metrics(payloads)


FEDMEDIAN = Algorithm(FedMedian, client_update)
