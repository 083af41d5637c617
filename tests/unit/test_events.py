"""The ServerApp's event stream (tasks/events.py): what the writer appends is what the reader returns; a line that is
no event is refused, naming what is wrong; a last line still being written is read once it is complete."""

from __future__ import annotations

import json
import threading

import pytest

from fedbayes.tasks.events import (
    CHECKPOINTED,
    COMMITTED,
    COMPLETED,
    EVALUATED,
    LOG_PREFIX,
    MAX_EVENT_BYTES,
    REFUSED,
    RUN_ENDED,
    RUN_STARTED,
    Event,
    EventLog,
    EventTail,
    MalformedEvent,
    event_of_log_line,
    last_start,
    parse_event,
    read_events,
)


def write_run(events: EventLog) -> None:
    events.emit(RUN_STARTED, federation="fed", named_by_server=True, strategy="fedavg", rounds=2)
    events.emit(COMMITTED, 1, clients=2, clients_sent=3)
    events.emit(REFUSED, 1, client="client 'c' (node 7)", reason="no reply within round-timeout (600 s)")
    events.emit(EVALUATED, 1, metrics={"accuracy": 0.5, "nll": 1.25})
    events.emit(CHECKPOINTED, 1, rounds=2)
    events.emit(RUN_ENDED, outcome=COMPLETED, reason=None)


def test_what_the_writer_appends_the_reader_returns_and_the_log_gets_the_same(tmp_path):
    logged: list[str] = []
    events = EventLog(mirror=logged.append)
    events.write_to(tmp_path / "fed" / "events.jsonl")
    write_run(events)
    read = [event for _, event in read_events(tmp_path / "fed" / "events.jsonl")]
    assert [(event.type, event.round) for event in read] == [
        (RUN_STARTED, None),
        (COMMITTED, 1),
        (REFUSED, 1),
        (EVALUATED, 1),
        (CHECKPOINTED, 1),
        (RUN_ENDED, None),
    ]
    assert read[3].fields == {"metrics": {"accuracy": 0.5, "nll": 1.25}} and read[2].fields["client"].endswith("7)")
    assert [event_of_log_line(f"INFO :      {line}") for line in logged] == read
    assert event_of_log_line("INFO :      round   1/2 | acc 0.5000 | ...") is None


def test_an_event_goes_to_the_log_alone_until_the_file_is_named(tmp_path):
    logged: list[str] = []
    events = EventLog(mirror=logged.append)
    events.emit(RUN_ENDED, outcome="failed", reason="ConfigError: no such key")
    assert logged[0].startswith(LOG_PREFIX) and not list(tmp_path.iterdir())


def test_the_writer_refuses_an_event_the_reader_would(tmp_path):
    events = EventLog()
    with pytest.raises(MalformedEvent, match="field 'clients_sent' is missing"):
        events.emit(COMMITTED, 1, clients=2)
    with pytest.raises(MalformedEvent, match="round is an integer"):
        events.emit(CHECKPOINTED, rounds=2)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"type": "exploded", "round": 1, "time": 1.0}', "type 'exploded' is none of"),
        ('{"type": "checkpointed", "round": "1", "time": 1.0, "rounds": 2}', "round is an integer"),
        ('{"type": "run_ended", "round": 3, "time": 1.0, "outcome": "completed", "reason": null}', "round is null"),
        ('{"type": "checkpointed", "round": 1, "rounds": 2}', "time is a number"),
        ('{"type": "checkpointed", "round": 1, "time": 1.0, "rounds": true}', "'rounds' is missing or not an int"),
        ('{"type": "evaluated", "round": 1, "time": 1.0, "metrics": {"accuracy": "high"}}', "finite numbers"),
        ('{"type": "run_ended", "round": null, "time": 1.0, "outcome": "fine", "reason": null}', "'outcome'"),
        ('{"type": "checkpointed", "round": 1, "time": 1.0, "rounds": 2, "eval": 1}', "has no field 'eval'"),
        ("x" * (MAX_EVENT_BYTES + 1), "over the 65536 an event may have"),
    ],
)
def test_a_line_that_is_no_event_is_refused_with_what_is_wrong(line, why):
    with pytest.raises(MalformedEvent, match=why):
        parse_event(line)


def test_a_malformed_line_in_the_file_is_named_by_its_offset_or_handed_on_and_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    good = Event(CHECKPOINTED, 1, 1.0, {"rounds": 2}).json_line()
    path.write_text(f"{good}\n{{broken\n{'y' * (MAX_EVENT_BYTES + 10)}\n{good}\n")
    with pytest.raises(MalformedEvent, match=rf"events.jsonl at byte {len(good) + 1}: not an event: not JSON"):
        list(read_events(path))
    refused: list[MalformedEvent] = []
    assert [end for end, _ in read_events(path, on_malformed=refused.append)] == [
        len(good) + 1,
        path.stat().st_size,
    ]
    assert len(refused) == 2 and "over the 65536 bytes" in str(refused[1])


def test_a_last_line_still_being_written_is_read_once_it_is_complete(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # no file yet
    line = Event(COMMITTED, 1, 1.0, {"clients": 1, "clients_sent": 1}).json_line()
    path.write_text(line[:20])
    assert tail.read() == []
    with path.open("a") as events_file:
        events_file.write(f"{line[20:]}\n")
    assert [event.type for event in tail.read()] == [COMMITTED]
    assert tail.read() == []  # each event once


def test_a_start_after_a_crash_ends_the_torn_line_before_its_events(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"type": "committed", "rou')  # a crash mid-line (the writer itself never leaves one)
    tail = EventTail(path, path.stat().st_size)  # a follower of the next start, from the file's size before it
    events = EventLog()
    events.write_to(path)
    write_run(events)
    refused: list[MalformedEvent] = []
    read = [event for _, event in read_events(path, on_malformed=refused.append)]
    assert len(refused) == 1 and [event.type for event in last_start(read)][0] == RUN_STARTED
    assert tail.read() == read  # the torn line's end is no event of its own


def test_the_newest_start_is_from_its_run_started_event_on(tmp_path):
    events = EventLog()
    events.write_to(tmp_path / "events.jsonl")
    write_run(events)
    write_run(events)
    everything = [event for _, event in read_events(tmp_path / "events.jsonl")]
    assert last_start(everything) == everything[6:] and last_start(everything[1:3]) == everything[1:3]


def test_lines_written_from_several_threads_land_whole(tmp_path):
    events = EventLog()
    events.write_to(tmp_path / "events.jsonl")
    reason = "r" * 400

    def write(label: str) -> None:
        for server_round in range(50):
            events.emit(REFUSED, server_round, client=label, reason=reason)

    threads = [threading.Thread(target=write, args=(f"client-{index}",)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 200 and all(json.loads(line)["reason"] == reason for line in lines)
