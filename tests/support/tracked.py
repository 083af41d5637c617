"""A FedAvg federation of scripted logistic-regression clients through the real round loop, tracked as the ServerApp
tracks it: what the tracking tests (tests/component/test_tracking.py, tests/integration/test_tracking.py) run."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, new_header
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.loop import run_rounds
from fedbayes.server.tracking import posterior_export, tracked_run
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.strategies.fedavg.server import FedAvg
from fedbayes.tasks.config import LoopSettings
from fedbayes.tasks.runlog import TRACKING
from tests.support import FakeGrid, improving_metrics, round_core, scripted

LOGREG = {"1.weight": (10, 784), "1.bias": (10,)}  # model=logreg on Fashion-MNIST: the export rebuilds it
ROUNDS = 4


def logreg_reply(server_round: int, node: int, federation: str):
    weights = {name: np.full(shape, 0.01 * server_round, np.float32) for name, shape in LOGREG.items()}
    envelope = pb.Reply(header=new_header(federation, server_round, f"client-{node}"), num_examples=10, train_loss=0.3)
    return encode(envelope, pb.FedAvgReply(), {"weights": weights})


def tracked_federation(tmp_path: Path, tracking_value: str, rounds: int = ROUNDS) -> tuple[dict, float]:
    """A FedAvg federation of two scripted clients through run_rounds, tracked as the ServerApp tracks it
    (server/app.py); its run config and the seconds it took."""
    federation = tmp_path.name.replace("[", "-").replace("]", "")
    run_config = {
        **default_run_config(),
        "federation": federation,
        "model": "logreg",
        "tracking": tracking_value,
        "num-server-rounds": rounds,
        "results-path": str(tmp_path / "r.jsonl"),
        "server-state-dir": str(tmp_path / "state"),
    }
    settings = run_settings(run_config)
    core = round_core(FedAvg(settings, LOGREG))
    initial = ArrayRecord({name: Array(np.zeros(shape, np.float32)) for name, shape in LOGREG.items()})
    loop = LoopSettings(
        num_rounds=rounds, round_timeout=5.0, poll_interval=0.01, wait_for_clients=2, wait_for_clients_timeout=5
    )
    store = CheckpointStore(settings.server_state_dir, federation, run_config)
    started = time.monotonic()
    with tracked_run(
        settings.tracker, run_config, posterior_export(settings.server_state_dir, federation, run_config)
    ) as sinks:
        run_rounds(
            FakeGrid([1, 2], scripted(lambda r, node: logreg_reply(r, node, federation))),
            core,
            initial,
            loop,
            improving_metrics,
            settings.results_path,
            store,
            sinks,
        )
    return run_config, time.monotonic() - started


def tracking_warnings(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and record.getMessage().startswith(TRACKING)
    ]
