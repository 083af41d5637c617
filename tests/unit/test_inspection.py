"""What `fedbayes runs`, `status` and `clients` (tasks/runfiles.py, deploy/inspection.py) decide from a run's files:
its status, each client's rounds and refusals, the lock a running server holds; and a damaged file named, never a
traceback. The commands on a real federation: tests/integration/test_inspection.py."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from fedbayes.deploy.cli import main
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.tasks.events import EVENTS_FILE, FAILED, RUN_ENDED, RUN_STARTED, TRACKING, EventLog
from fedbayes.tasks.runfiles import Status, client_tallies, decide_status, locate, lock_holders, snapshot
from tests.support import checkpoint


@pytest.mark.parametrize(
    ("processes", "done", "planned", "failure", "expected"),
    [
        ([41, 7], 1, 3, None, Status("running", "live process 41, 7")),
        ([41], 3, 3, "ValueError: boom", Status("running", "live process 41")),  # a new start after a failed one
        ([], 1, 3, "RunFailed: 3 rounds in a row", Status("failed", "RunFailed: 3 rounds in a row")),
        ([], 3, 3, "RuntimeError: after the last round", Status("failed", "RuntimeError: after the last round")),
        ([], 3, 3, None, Status("finished", "all 3 rounds are done")),
        ([], 4, 3, None, Status("finished", "all 3 rounds are done")),
    ],
)
def test_a_status_is_decided_by_processes_then_a_failure_then_the_rounds_done(
    processes, done, planned, failure, expected
):
    assert decide_status(processes, done, planned, failure) == expected


@pytest.mark.parametrize(("planned", "done"), [(3, "1 of 3 rounds done"), (None, "1 rounds done (of a number not")])
def test_a_run_short_of_its_rounds_with_no_process_and_no_failure_is_stopped(planned, done):
    status = decide_status([], 1, planned, None)
    assert status.state == "stopped" and f"no process runs it; {done}" in status.why
    assert status.why.endswith("and no failure reported: interrupted, killed, or its machine went down")


def row(server_round, clients, replied, rejected=None):
    return {
        "round": server_round,
        "accuracy": 0.5,
        "nll": 1.0,
        "ece": 0.1,
        "clients": clients,
        "reply_seconds": {client: 1.0 for client in replied},
        "rejected": rejected or {},
    }


def test_each_clients_accepted_and_refused_rounds_come_from_the_rows():
    nan = "bayesadmm: local_mean/1.weight contains NaN or Inf"
    rows = [
        row(1, 2, ["a", "b", "c"], {"client 'c' (node 12) claiming to be client 'b'": nan}),
        row(2, 2, ["a", "b", "node 12"], {"client 'c' (node 12)": nan, "node 30": "no reply within 60.0 s"}),
        row(3, 0, ["a", "b"], {"round": "the round could not be absorbed"}),  # nothing was committed
    ]
    tallies = client_tallies(rows)
    assert list(tallies) == ["a", "b", "c", "node 30", "round"]  # "node 12" is c's node, timed under it
    assert [(t.accepted, t.refused, t.last_round) for t in tallies.values()] == [
        (2, 0, 3),  # round 3 accepted nothing: it answered, but no reply of that round counts
        (2, 0, 3),
        (0, 2, 2),
        (0, 1, 2),
        (0, 1, 3),
    ]
    assert tallies["c"].reasons == {nan: [1, 2]} and tallies["c"].node == 12 and tallies["node 30"].node == 30


def test_the_lock_a_running_server_holds_is_found_without_taking_it(tmp_path):
    lock = tmp_path / "server.lock"
    lock.touch()
    assert lock_holders(lock) == []
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert lock_holders(lock) == [os.getpid()]
        with lock.open("a") as other:  # not taken by the look: another process may still take it once it is free
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(held, fcntl.LOCK_UN)
    assert lock_holders(lock) == [] and lock_holders(tmp_path / "no-such.lock") == []


# ---- a workdir on disk ---------------------------------------------------------------------------------------------
@pytest.fixture
def workdir(tmp_path):
    """A `fedbayes local` workdir of 3 planned rounds that wrote 2 rows and no log."""
    workdir = tmp_path / "fed"
    workdir.mkdir()
    (workdir / "run-config.toml").write_text(
        f'server-state-dir = "{workdir / "server-state"}"\nfederation = "fed"\nstrategy = "fedavg"\n'
        f'num-server-rounds = 3\nresults-path = "{workdir / "results.jsonl"}"\n'
    )
    write_rows(workdir, [json.dumps(row(1, 2, ["a", "b"])), json.dumps(row(2, 2, ["a", "b"]))])
    return workdir


def write_rows(workdir, lines):
    (workdir / "results.jsonl").write_text("".join(f"{line}\n" for line in lines))


def start(events: EventLog) -> None:
    events.emit(RUN_STARTED, federation="fed", named_by_server=False, strategy="fedavg", rounds=3)


def test_the_newest_starts_events_decide_whether_a_run_failed(workdir, capsys):
    assert snapshot(locate(workdir)).status.state == "stopped"
    events = EventLog()
    events.write_to(workdir / "server-state" / "fed" / EVENTS_FILE)
    start(events)
    events.emit(TRACKING, message="sending to tensorboard:/tmp/tb")
    events.emit(RUN_ENDED, outcome=FAILED, reason="RunFailed: nothing trained")
    shot = snapshot(locate(workdir))
    assert shot.status == Status("failed", "RunFailed: nothing trained")
    assert shot.events.tracking == ("sending to tensorboard:/tmp/tb",)
    start(events)  # the resumed start, later stopped
    with (workdir / "server-state" / "fed" / EVENTS_FILE).open("a") as events_file:
        events_file.write("{not an event\n")
    shot = snapshot(locate(workdir))
    assert shot.status.state == "stopped" and shot.events.tracking == ()
    assert "events.jsonl at byte" in capsys.readouterr().err  # named, left out


def test_a_forgets_refinement_raises_the_rounds_planned(workdir):
    audit = workdir / "server-state" / "fed" / "forget-audit.jsonl"
    audit.parent.mkdir(parents=True)
    audit.write_text(json.dumps({"event": "forgotten", "client": "b", "round": 2, "refine_through_round": 5}) + "\n")
    assert snapshot(locate(workdir)).planned == 5


def run_command(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_line_that_is_no_row_is_named_and_left_out(workdir, capsys):
    write_rows(workdir, [json.dumps(row(1, 2, ["a", "b"])), '{"round": 2, "accura', json.dumps(row(2, 2, ["a"]))])
    code, out, err = run_command(capsys, "runs", str(workdir.parent), "--json")
    assert code == 0
    assert f"fedbayes: warning: {workdir / 'results.jsonl'}:2: not a JSON row (" in err and "; left out" in err
    assert json.loads(out)[0]["rounds_done"] == 2


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda w: (w / "run-config.toml").write_text("federation = \n"),
            "{w}/run-config.toml: cannot read a run config",
        ),
        (lambda w: (w / "run-config.toml").write_bytes(b"\xff\xfe"), "{w}/run-config.toml: cannot read a run config"),
        (lambda w: write_rows(w, ["[1, 2]", "not json"]), "{w}/results.jsonl: none of its 2 lines is a results row"),
        (
            lambda w: (
                (w / "server-state" / "fed").mkdir(parents=True)
                or (w / "server-state" / "fed" / "results-start.json").write_text('{"path": 3}')
            ),
            "{w}/server-state/fed/results-start.json: not a results start record",
        ),
    ],
)
@pytest.mark.parametrize("command", ["status", "clients"])
def test_a_damaged_file_is_named_with_what_is_wrong_not_a_traceback(workdir, capsys, damage, message, command):
    damage(workdir)
    code, out, err = run_command(capsys, command, str(workdir))
    assert code == 1 and out == ""
    assert err.splitlines()[-1].startswith(f"fedbayes: error: {message.format(w=workdir)}")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["status", "clients"])
def test_a_damaged_checkpoint_is_named_with_the_field(workdir, capsys, command):
    store = CheckpointStore(workdir / "server-state", "fed", {})
    store.save(checkpoint(server_round=2))
    path = store.round_path(2)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a tensor's last byte: the checksum no longer matches
    path.write_bytes(bytes(data))
    code, _, err = run_command(capsys, command, str(workdir))
    assert code == 1 and "Traceback" not in err
    assert err.splitlines()[-1] == (
        f"fedbayes: error: server checkpoint {path} is damaged: 'checksum' does not match the file's contents "
        "(changed or corrupted after it was written)"
    )


def test_status_wants_a_run_or_a_superlink_and_not_both(workdir, capsys):
    for argv in ((), (str(workdir), "--superlink", "127.0.0.1:9093")):
        code, _, err = run_command(capsys, "status", *argv)
        assert code == 1 and "name a RUN, or a SuperLink with --superlink ADDR (one of the two)" in err


def test_a_superlink_that_does_not_answer_is_named(capsys):
    code, _, err = run_command(capsys, "status", "--superlink", "127.0.0.1:1")
    assert code == 1
    assert err.startswith(
        "fedbayes: error: the SuperLink's Control API at 127.0.0.1:1, asked insecurely (a TLS SuperLink needs --ca), "
        "did not answer: "
    )


def test_the_file_names_it_reads_are_those_the_server_and_the_launcher_write():
    """Named in tasks/runfiles.py, which may import neither the server nor the launcher."""
    from fedbayes.deploy import launcher
    from fedbayes.server import forget, loop
    from fedbayes.tasks import runfiles

    assert (runfiles.LOCK_FILE, runfiles.AUDIT_LOG) == (forget.LOCK_FILE, forget.AUDIT_LOG)
    assert (runfiles.RESULTS_START, runfiles.FLWR_HOME) == (loop.RESULTS_START, launcher.FLWR_HOME)
