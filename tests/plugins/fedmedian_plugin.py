"""An out-of-tree strategy, written as a user would write one (README "Write your own strategy"): FedMedian,
the coordinate-wise median of the clients' models, on FedAvg's messages and client half. Not part of fedbayes:
the tests put this folder on PYTHONPATH and run it as `strategy = "fedmedian_plugin:FEDMEDIAN"`."""

from __future__ import annotations

import numpy as np

from fedbayes.bayes.params import flatten
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies import Algorithm
from fedbayes.strategies.base import StatelessStrategy, Update, local_training
from fedbayes.strategies.fedavg.client import client_update


class FedMedian(StatelessStrategy):
    """The server keeps nothing but the global model; each round's is the median of the clients' models."""

    reply_type = pb.FedAvgReply

    def instruction(self, server_round, arrays, nodes):
        weights = {name: arrays[name].numpy() for name in self.layout}
        return pb.FedAvgInstruction(training=local_training(self.settings.training, server_round)), {"weights": weights}

    def reply_layouts(self):
        return {"weights": self.layout}

    def absorb(self, payloads, server_round):
        return Update(np.median([flatten(payload.tensors["weights"], self.layout) for payload in payloads], axis=0))


FEDMEDIAN = Algorithm(FedMedian, client_update)
