"""RoundFinisher hands the checkpointed state back as a value: the evaluation thread writes nothing of the core's."""

from __future__ import annotations

import threading
import time

import numpy as np
from flwr.app import Array, ArrayRecord

from fedbayes.server.loop import FinishedRound, PhaseTimer, ResultsLog, RoundFinisher
from fedbayes.strategies.base import ServerState

NO_METRICS = {"accuracy": None, "nll": None, "ece": None}


class SavedCheckpoints:
    """The checkpoints the finisher saves, kept in memory."""

    def __init__(self) -> None:
        self.saved: list[object] = []

    def save(self, checkpoint: object) -> None:
        self.saved.append(checkpoint)


def finisher(tmp_path, handed: list[tuple[ServerState, str]], evaluate=lambda arrays, server_round: dict(NO_METRICS)):
    def checkpoint_written(state: ServerState) -> None:
        handed.append((state, threading.current_thread().name))

    return RoundFinisher(
        evaluate,
        ResultsLog(str(tmp_path / "results.jsonl")),
        SavedCheckpoints(),  # type: ignore[arg-type]
        time.monotonic(),
        num_rounds=2,
        pipelined=True,
        checkpoint_written=checkpoint_written,
    )


def finished_round(server_round: int) -> FinishedRound:
    arrays = ArrayRecord({"w": Array(np.zeros(2, dtype="float32"))})
    row = {"clients": 1, "clients_sent": 1}
    return FinishedRound(server_round, arrays, time.monotonic(), row, PhaseTimer(), {}, ServerState())


def test_the_checkpointed_state_reaches_the_core_on_the_loops_thread_once_waited_for(tmp_path):
    handed: list[tuple[ServerState, str]] = []
    released = threading.Event()
    rounds = finisher(tmp_path, handed, evaluate=lambda arrays, server_round: released.wait(5) and dict(NO_METRICS))
    round_1 = finished_round(1)
    rounds.submit(round_1)
    rounds.collect()  # still evaluating: nothing handed over yet, and collect does not wait
    assert handed == []
    released.set()
    rounds.wait()
    rounds.close()
    assert handed == [(round_1.state, threading.current_thread().name)]


def test_collect_hands_over_a_finished_round_without_waiting(tmp_path):
    handed: list[tuple[ServerState, str]] = []
    rounds = finisher(tmp_path, handed)
    round_1 = finished_round(1)
    rounds.submit(round_1)
    while rounds.pending is not None and not rounds.pending.done():
        time.sleep(0.01)
    rounds.collect()
    assert handed == [(round_1.state, threading.current_thread().name)]
    rounds.wait()  # nothing pending: nothing handed twice
    rounds.close()
    assert len(handed) == 1
