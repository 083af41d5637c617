"""The events the real round loop writes (server/loop.py, tasks/events.py), in order, against a fake grid: each
round's start, its replies, whom it refused and why, its commit, its evaluation (where it has one) and its
checkpoint; and what `fedbayes run`'s progress line makes of them. The whole ServerApp's, run started to run ended,
through `fedbayes local`: tests/integration/test_progress.py."""

from __future__ import annotations

import pytest
from flwr.app import Array, ArrayRecord

from fedbayes.deploy.progress import RoundDone, RoundEvents
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.loop import RunFailed, forgotten_event, run_rounds
from fedbayes.server.round_core import RoundCore
from fedbayes.strategies.fedavg.server import FedAvg
from fedbayes.tasks.config import LoopSettings
from fedbayes.tasks.events import (
    CHECKPOINTED,
    COMMITTED,
    EVALUATED,
    EVENTS_FILE,
    FORGOTTEN,
    REFUSED,
    REPLIES,
    ROUND_STARTED,
    EventLog,
    event_of_log_line,
    read_events,
)
from tests.support import LAYOUT, FakeGrid, fedavg_reply, rows, scripted, settings, weights


def evaluate_even_rounds(arrays, server_round: int) -> dict[str, float | None]:
    if server_round % 2:
        return {"accuracy": None, "nll": None, "ece": None}
    return {"accuracy": 0.25 * server_round, "nll": 1.0 / server_round, "ece": 0.1}


def run(tmp_path, reply, rounds: int, logged: list[str]):
    events = EventLog(mirror=logged.append)
    events.write_to(tmp_path / "state" / "fed" / EVENTS_FILE)
    run_settings = settings()
    core = RoundCore(run_settings, FedAvg(run_settings, LAYOUT))
    loop = LoopSettings(
        num_rounds=rounds,
        round_timeout=0.5,
        poll_interval=0.01,
        wait_for_clients=2,
        wait_for_clients_timeout=5,
        max_failed_rounds=run_settings.max_failed_rounds,
    )
    run_rounds(
        FakeGrid([1, 2], scripted(reply)),
        core,
        ArrayRecord({name: Array(value) for name, value in weights(0.0).items()}),
        loop,
        evaluate_even_rounds,
        str(tmp_path / "r.jsonl"),
        CheckpointStore(tmp_path / "state", "fed", {}),
        events=events,
    )
    return [event for _, event in read_events(tmp_path / "state" / "fed" / EVENTS_FILE)]


def test_each_round_writes_its_events_in_order_and_the_log_carries_the_same(tmp_path):
    def reply(server_round, node):
        return None if (server_round, node) == (2, 2) else fedavg_reply(f"client-{node}", server_round)

    logged: list[str] = []
    events = run(tmp_path, reply, 2, logged)
    # round 1 is checkpointed while round 2 trains (RoundFinisher), and before round 2 commits
    assert [event.type for event in events if event.round == 1] == [ROUND_STARTED, REPLIES, COMMITTED, CHECKPOINTED]
    assert [event.type for event in events if event.round == 2] == [
        ROUND_STARTED,
        REPLIES,
        REFUSED,
        COMMITTED,
        EVALUATED,
        CHECKPOINTED,
    ]
    order = [(event.type, event.round) for event in events]
    assert order.index((CHECKPOINTED, 1)) < order.index((COMMITTED, 2))
    by_type = {(event.type, event.round): event.fields for event in events}
    assert by_type[REPLIES, 2] == {"sent": 2, "replies": 1, "silent": 1}
    refused = by_type[REFUSED, 2]
    assert refused["client"] == "client 'client-2' (node 2)" and "round-timeout" in refused["reason"]
    assert by_type[COMMITTED, 2] == {"clients": 1, "clients_sent": 2}
    assert by_type[EVALUATED, 2] == {"metrics": {"accuracy": 0.5, "nll": 0.5, "ece": 0.1}}
    # the same as the rows say, and what the log carries for a ServerApp on another machine
    written = rows(tmp_path)
    assert [row["clients"] for row in written] == [2, 1] and written[1]["rejected"] == {
        refused["client"]: refused["reason"]
    }
    assert [event_of_log_line(f"INFO :      {line}") for line in logged] == events
    progress = RoundEvents()
    assert [done for event in events if (done := progress.feed(event))] == [
        RoundDone(1, 2, None, 2, 2),
        RoundDone(2, 2, 0.5, 1, 2),
    ]


def test_a_round_that_accepted_nothing_is_committed_with_none_and_its_refusals(tmp_path):
    with pytest.raises(RunFailed):
        run(tmp_path, lambda server_round, node: None, 1, [])
    read = [event for _, event in read_events(tmp_path / "state" / "fed" / EVENTS_FILE)]
    assert [event.type for event in read if event.type == REFUSED] == [REFUSED, REFUSED]
    assert next(event.fields for event in read if event.type == COMMITTED) == {"clients": 0, "clients_sent": 2}
    assert read[-1].type == CHECKPOINTED  # the failed round is on record before the run stops


def test_a_forget_audit_record_that_forgot_a_client_is_a_forgotten_event(tmp_path):
    events = EventLog()
    events.write_to(tmp_path / EVENTS_FILE)
    report = forgotten_event(events)
    record = {"event": "forgotten", "request": "r1", "client": "client-2", "round": 3, "asked_by": "operator"}
    report({**record, "refine_through_round": 5})
    report({**record, "event": "refused", "reason": "no such client"})  # refused and readmitted are no forget
    report(record)  # no refinement rounds
    read = [event for _, event in read_events(tmp_path / EVENTS_FILE)]
    assert [(event.type, event.round, dict(event.fields)) for event in read] == [
        (FORGOTTEN, 3, {"client": "client-2", "request": "r1", "refine_through_round": 5}),
        (FORGOTTEN, 3, {"client": "client-2", "request": "r1", "refine_through_round": None}),
    ]
