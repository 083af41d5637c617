"""The server's round loop against a scripted grid: a federation that trains nothing stops loudly, naming why;
one bad round among good ones does not; a strategy that fails while absorbing a round keeps its state."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.loop import TIMING_FIELDS, RunFailed
from fedbayes.strategies.fedavg.server import FedAvg
from tests.support import FakeGrid, fedavg_reply, no_metrics, rows, scripted
from tests.support import run_loop as run


def test_rounds_without_an_accepted_reply_stop_the_run_naming_the_reasons(tmp_path):
    def reply(server_round, node):  # node 1 sends zero examples, node 2 never answers
        return fedavg_reply("client-1", server_round, num_examples=0) if node == 1 else None

    with pytest.raises(RunFailed) as failure:
        run(tmp_path, reply, **{"max-failed-rounds": 2})
    message = str(failure.value)
    assert message.startswith("2 rounds in a row (max-failed-rounds) accepted no client reply")
    assert "client 'client-1' (node 1): rejected reply: field 'num_examples': 0 is not in" in message
    # waited for up to round-timeout in round 1 (its size unknown), cut by straggler-wait in round 2
    assert "node 2: no reply within" in message and "straggler-wait=2 x the" in message
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2  # the failed rounds are on record


def test_a_run_with_fewer_rounds_than_max_failed_rounds_that_trains_nothing_fails(tmp_path):
    with pytest.raises(
        RunFailed, match=r"none of the 2 rounds accepted a client reply \(rounds 1-2\); last round: .*num_examples"
    ):
        run(tmp_path, lambda r, node: fedavg_reply(f"client-{node}", r, num_examples=0), rounds=2)
    assert len(rows(tmp_path)) == 2
    with pytest.raises(RunFailed, match=r"^its one round \(round 1\) accepted no client reply; last round: "):
        run(tmp_path / "one", lambda r, node: fedavg_reply(f"client-{node}", r, num_examples=0), rounds=1)


def test_max_failed_rounds_stop_the_run_early_naming_the_rounds(tmp_path):
    def reply(server_round, node):  # from round 2 on nothing usable
        return fedavg_reply(f"client-{node}", server_round, num_examples=5 if server_round == 1 else 0)

    with pytest.raises(RunFailed) as failure:
        run(tmp_path, reply, rounds=10, **{"max-failed-rounds": 3})
    assert str(failure.value).startswith(
        "3 rounds in a row (max-failed-rounds) accepted no client reply (rounds 2-4); the run stopped after round 4 "
        "of 10; last round: "
    )
    assert [row["clients"] for row in rows(tmp_path)] == [2, 0, 0, 0]


def test_a_run_that_ends_on_rounds_without_an_accepted_reply_fails_though_they_are_fewer_than_the_limit(tmp_path):
    """Rounds 4 and 5 of 5 accept nothing (as after a forget left one client that sends NaN): two rounds, under
    max-failed-rounds (3), but the run ends on a federation that no longer trains."""

    def reply(server_round, node):
        return fedavg_reply(f"client-{node}", server_round, num_examples=0 if server_round >= 4 else 5)

    with pytest.raises(RunFailed) as failure:
        run(tmp_path, reply, rounds=5)
    message = str(failure.value)
    assert message.startswith("none of the last 2 rounds accepted a client reply (rounds 4-5); last round: "), message
    assert "field 'num_examples': 0 is not in" in message
    assert len(rows(tmp_path)) == 5  # every round on record


def test_a_run_whose_last_round_alone_accepts_nothing_completes(tmp_path):
    """One such round at the end can be a lone client's turn to leave: not a failure by itself."""
    run(tmp_path, lambda r, node: fedavg_reply(f"client-{node}", r, num_examples=0 if r == 5 else 5), rounds=5)
    assert [row["clients"] for row in rows(tmp_path)] == [2, 2, 2, 2, 0]


@pytest.mark.parametrize(("last", "fails"), [(0.39, True), (0.41, False)])
def test_a_run_whose_accuracy_collapses_fails_naming_the_rounds(tmp_path, last, fails):
    """Accuracy 0.8 after round 1, `last` after round 3: under half of round 1's (ACCURACY_COLLAPSE) fails the run,
    once every row and checkpoint is written."""
    accuracies = {1: 0.8, 2: 0.6, 3: last}

    def evaluate(arrays, server_round):
        return {"accuracy": accuracies[server_round], "nll": 1.0, "ece": 0.1}

    def reply(server_round, node):
        return fedavg_reply(f"client-{node}", server_round)

    store = CheckpointStore(tmp_path / "state", "fed", {})
    if fails:
        with pytest.raises(RunFailed) as failure:
            run(tmp_path, reply, rounds=3, evaluate=evaluate, checkpoints=store)
        assert str(failure.value) == (
            f"accuracy fell from 0.8000 (round 1) to {last:.4f} (round 3), under 0.5 x its first value: training "
            "diverged"
        )
    else:
        run(tmp_path, reply, rounds=3, evaluate=evaluate, checkpoints=store)
    assert len(rows(tmp_path)) == 3 and store.load().server_round == 3


def test_a_node_refused_round_after_round_is_quarantined_and_the_others_go_on(tmp_path):
    """Node 1's updates are absurd (1e30): refused by the screen in rounds 1-2, it sits out rounds 3-4 (not even
    sent work), and is asked again in round 5; node 2 trains in every round and the run never fails."""

    def reply(server_round, node):
        return fedavg_reply(f"client-{node}", server_round, value=1e30 if node == 1 else 1.0)

    core, arrays = run(tmp_path, reply, **{"max-client-rejections": 2, "quarantine-rounds": 2})
    table = [(row["clients"], row["clients_sent"], row["quarantined"]) for row in rows(tmp_path)]
    assert table == [(1, 2, []), (1, 2, ["node 1"]), (1, 1, ["node 1"]), (1, 1, []), (1, 2, [])]
    assert (arrays["fc.bias"].numpy() == 1.0).all() and core.accepted_rounds == {"client-2": 5}
    assert "refused by the screen" in rows(tmp_path)[-1]["rejected"]["client 'client-1' (node 1)"]


def test_a_straggler_cannot_set_the_pace_of_every_round(tmp_path):
    """Node 1 replies 0.2 s into each round, node 2 never. With straggler-wait=2 the server waits for node 2, whose
    size it does not know, up to round-timeout once; from round 2 on a round waits ~0.6 s, not the 3 s round-timeout,
    and says why node 2 was left out."""
    round_started = {}

    def reply(server_round, node):
        started = round_started.setdefault(server_round, time.monotonic())
        if node == 1 and time.monotonic() - started >= 0.2:
            return fedavg_reply("client-1", server_round, value=1.0)
        return None

    run(tmp_path, reply, rounds=3, round_timeout=3.0, **{"straggler-wait": 2.0})
    written = rows(tmp_path)
    assert [row["clients"] for row in written] == [1, 1, 1]
    assert "round-timeout" in written[0]["rejected"]["node 2"]
    for row in written[1:]:
        assert "straggler-wait=2 x the" in row["rejected"]["node 2"]
        assert row["round_seconds"] < 3.0  # cut before round-timeout
    assert set(written[1]["reply_seconds"]) == {"client-1"}  # who answered, and when


def test_a_client_is_waited_for_by_its_size_and_one_slower_than_its_size_is_cut(tmp_path):
    """Nodes 1 and 2 hold 10 examples each and reply 0.1 s into a round; node 3 holds 100 and replies after 1 s (its
    compute grows with its data), node 4 holds 10 and replies after 2.5 s. Round 1 waits for all (their sizes are
    not known yet); from round 2 on straggler-wait=2 allows node 3 21 x the time half the replies took (its size is
    10 x their median) and node 4 3 x: node 3 is in every round, node 4 cut."""
    round_started = {}
    arrives = {1: (0.1, 10), 2: (0.1, 10), 3: (1.0, 100), 4: (2.5, 10)}  # node -> (seconds, examples)

    def reply(server_round, node):
        started = round_started.setdefault(server_round, time.monotonic())
        seconds, examples = arrives[node]
        if time.monotonic() - started >= seconds:
            return fedavg_reply(f"client-{node}", server_round, num_examples=examples, value=1.0)
        return None

    grid = FakeGrid([1, 2, 3, 4], scripted(reply))
    run(tmp_path, reply, rounds=3, round_timeout=10.0, grid=grid, **{"straggler-wait": 2.0})
    written = rows(tmp_path)
    assert [row["clients"] for row in written] == [4, 3, 3]
    for row in written[1:]:
        assert list(row["rejected"]) == ["client 'client-4' (node 4)"]
        assert "straggler-wait=2 x the" in row["rejected"]["client 'client-4' (node 4)"]
        assert "client-3" in row["reply_seconds"]


def test_a_bad_round_between_good_ones_does_not_stop_the_run(tmp_path):
    def reply(server_round, node):
        good = server_round % 2 == 1  # rounds 2 and 4 bring nothing usable
        return fedavg_reply(f"client-{node}", server_round, num_examples=5 if good else 0, value=1.0)

    core, arrays = run(tmp_path, reply, **{"max-failed-rounds": 2})
    assert core.accepted_rounds == {"client-1": 5, "client-2": 5}
    assert (arrays["fc.bias"].numpy() == 1.0).all()


def test_a_strategy_failing_while_absorbing_leaves_its_state_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    """A bug (or a reply a strategy should have refused) that raises inside the round core's aggregate: that round
    changes nothing and counts as failed; the server keeps running."""
    from fedbayes.bayes.params import weighted_mean

    calls = []

    def broken_mean(vectors, weights_):  # raises in round 1 only
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("boom")
        return weighted_mean(vectors, weights_)

    monkeypatch.setattr("fedbayes.strategies.fedavg.server.weighted_mean", broken_mean)
    core, arrays = run(tmp_path, lambda r, node: fedavg_reply(f"client-{node}", r, value=float(r)), rounds=2)
    first, second = rows(tmp_path)
    assert (first["clients"], second["clients"]) == (0, 2) and len(calls) == 2
    assert core.accepted_rounds == {"client-1": 2, "client-2": 2}
    assert (arrays["fc.bias"].numpy() == 2.0).all()
    assert "round 1: absorbing the replies failed (ZeroDivisionError: boom)" in caplog.text


def test_each_row_says_where_the_round_went(tmp_path):
    """Server phases (and the previous round's checkpoint) plus the clients' median phases from their replies;
    a client's malformed timings are dropped, never an error."""
    from flwr.app import ConfigRecord

    from fedbayes.protos.codec import TIMINGS_KEY

    def reply(server_round, node):
        content = fedavg_reply(f"client-{node}", server_round, value=1.0)
        content[TIMINGS_KEY] = ConfigRecord({"setup": 0.5 * node, "update": 2.0, "state-load": float("nan")})
        return content

    run(tmp_path, reply, rounds=2)
    written = rows(tmp_path)
    for row in written:
        phases = row["phase_seconds"]
        assert {
            "wait_clients",
            "configure",
            "push",
            "first_reply",
            "last_reply",
            "previous_round",
            "aggregate",
            "evaluate",
        } <= set(phases)
        assert 0 <= phases["first_reply"] <= phases["last_reply"] <= row["round_seconds"]
        assert row["client_phase_seconds"] == {"setup": 0.75, "update": 2.0}  # medians; the NaN is dropped
        assert row["client_phase_max"] == {"setup": 1.0, "update": 2.0}  # the slowest client's
    assert written[0]["phase_seconds"]["previous_checkpoint"] is None
    assert written[1]["phase_seconds"]["previous_checkpoint"] > 0


class RecordingStore(CheckpointStore):
    """Keeps every checkpoint the loop saves, with how many rows the results file held at that moment."""

    def __init__(self, root, results):
        super().__init__(root, "fed", {})
        self.results, self.saved = results, []

    def save(self, checkpoint):
        super().save(checkpoint)
        rows = len(self.results.read_text().splitlines())
        arrays = {name: value.tolist() for name, value in checkpoint.arrays.items()}
        self.saved.append((checkpoint.server_round, rows, arrays, checkpoint.strategy_state.metadata))


def deterministic_run(tmp_path, pipeline):
    """Five rounds whose replies differ per round and client; the metrics depend on the evaluated arrays. With
    pipelining, round 1's evaluation holds on until round 2's instructions were pushed: it overlaps for sure."""
    grid = FakeGrid(
        [1, 2], scripted(lambda r, node: fedavg_reply(f"client-{node}", r, num_examples=node, value=r * node))
    )
    checkpoints = RecordingStore(tmp_path / "state", tmp_path / "r.jsonl")

    def evaluate(arrays, server_round):
        if pipeline and server_round == 1:
            assert wait_until(lambda: grid.round >= 2), "round 2 was not pushed while round 1 was evaluated"
        total = float(sum(arrays[name].numpy().sum() for name in arrays))
        return {"accuracy": total, "nll": float(server_round), "ece": total / 7}

    run(tmp_path, None, rounds=5, evaluate=evaluate, pipeline=pipeline, grid=grid, checkpoints=checkpoints)
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows(tmp_path)], checkpoints.saved


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_pipelined_evaluation_writes_the_same_rows_and_checkpoints_in_round_order(tmp_path):
    serial_rows, serial_checkpoints = deterministic_run(tmp_path / "serial", pipeline=False)
    piped_rows, piped_checkpoints = deterministic_run(tmp_path / "pipelined", pipeline=True)
    assert [row["round"] for row in piped_rows] == [1, 2, 3, 4, 5]
    assert piped_rows == serial_rows and len({row["accuracy"] for row in piped_rows}) == 5
    assert piped_checkpoints == serial_checkpoints
    # checkpoint t is saved after row t and before row t + 1
    assert [(saved[0], saved[1]) for saved in piped_checkpoints] == [(r, r) for r in range(1, 6)]


def test_an_evaluation_that_fails_stops_the_run_with_its_error_and_no_row_or_checkpoint_for_it(tmp_path):
    def evaluate(arrays, server_round):
        if server_round == 2:
            raise RuntimeError("evaluation broke")
        return no_metrics(arrays, server_round)

    with pytest.raises(RuntimeError, match="evaluation broke"):
        run(tmp_path, lambda r, node: fedavg_reply(f"client-{node}", r, value=1.0), evaluate=evaluate)
    assert [row["round"] for row in rows(tmp_path)] == [1]
    assert CheckpointStore(tmp_path / "state", "fed", {}).load().server_round == 1


def test_instructions_name_the_accepted_rounds_of_a_checkpoint_on_disk(tmp_path):
    """Pipelined, round t+1's instructions name round t accepted while checkpoint t may still be unwritten, so
    they also name the accepted rounds of a checkpoint already on disk (Header.checkpointed_rounds): the rounds a
    server killed now would resume with, whose states the clients keep. Round 1's evaluation holds on until
    round 2 was pushed, so round 2's instructions go out with no checkpoint on disk at all."""
    from fedbayes.protos.codec import decode_header
    from fedbayes.server.round_core import CORE_STATE_KEY

    class Store(CheckpointStore):
        def save(self, checkpoint):
            super().save(checkpoint)
            on_disk.append(json.loads(checkpoint.strategy_state.metadata[CORE_STATE_KEY])["accepted_rounds"])

    class RecordingGrid(FakeGrid):
        def push_messages(self, messages):
            for message in messages:
                header = decode_header(message.content, "server")
                sent.append(
                    (header.server_round, dict(header.accepted_rounds), dict(header.checkpointed_rounds), list(on_disk))
                )
            return super().push_messages(messages)

    on_disk, sent = [], []  # accepted rounds of each checkpoint written; per instruction: round, headers, on disk
    grid = RecordingGrid([1, 2], scripted(lambda r, node: fedavg_reply(f"client-{node}", r, value=1.0)))

    def evaluate(arrays, server_round):
        if server_round == 1:
            assert wait_until(lambda: grid.round >= 2), "round 2 was not pushed while round 1 was evaluated"
        return no_metrics(arrays, server_round)

    run(tmp_path, None, rounds=4, evaluate=evaluate, grid=grid, checkpoints=Store(tmp_path / "state", "fed", {}))
    assert [entry[0] for entry in sent] == [1, 1, 2, 2, 3, 3, 4, 4]
    for server_round, accepted, checkpointed, written in sent:
        assert set(checkpointed) <= set(accepted)
        for client, checkpointed_round in checkpointed.items():  # a round some checkpoint on disk names
            assert checkpointed_round in {rounds[client] for rounds in written if client in rounds}
        if server_round == 2:  # round 1 accepted, its checkpoint not yet written: nothing durable to keep
            assert len(accepted) == 1 and checkpointed == {}
    assert all(checkpointed for r, _, checkpointed, _ in sent if r == 4)  # checkpoint 2 at least is on disk by then


def test_an_error_from_the_superlink_names_the_node_the_instruction_went_to(tmp_path):
    """For a node it saw go offline, Flower's SuperLink answers with an error from its own node id (1): the exchange
    names the node the instruction went to, keeps the error out of the replies, and the round reports that node as
    absent, not refused (no quarantine), while the others' replies are used."""
    from flwr.app import Error
    from flwr.common.constant import ErrorCode

    from fedbayes.server.loop import exchange
    from tests.support import InProcessFederation, reply_message

    federation = InProcessFederation(tmp_path, {"strategy": "fedavg", "lr": 0.05}, [40, 60, 80])
    offline = 3

    class OfflineGrid(FakeGrid):
        def pull_messages(self, message_ids):
            replies = []
            for message_id in list(message_ids):
                message = self.pushed.pop(message_id)
                node = message.metadata.dst_node_id
                if node == offline:
                    error = Error(code=ErrorCode.NODE_UNAVAILABLE, reason="node offline")
                    replies.append(reply_message(None, 1, error, reply_to=message_id))
                else:
                    replies.append(reply_message(federation.answer(message), node, reply_to=message_id))
            return replies

    grid = OfflineGrid([1, 2, offline])
    plan = federation.core.configure(1, federation.arrays, grid)
    messages = plan.messages
    replies, silent, errors = exchange(grid, messages, 10.0, 0.01, {})
    assert silent == {} and set(errors) == {offline} and errors[offline].code == ErrorCode.NODE_UNAVAILABLE
    assert sorted(reply.metadata.src_node_id for reply in replies) == [1, 2]
    outcome = federation.core.aggregate(plan, replies, errors, silent)
    report = outcome.report
    assert outcome.arrays is not None and len(report.accepted) == 2
    assert report.rejected == {f"node {offline}": "client error: node offline"}
    assert federation.core.quarantine.refusals == {}  # an offline node's error counts towards no quarantine


def test_a_strategys_warning_is_in_its_rounds_row_and_only_there(tmp_path, monkeypatch):
    """`Update.warning` (BayesADMM's collapsing precision, for one) reaches the results row that `fedbayes local`
    prints it from; a round without one has none."""
    absorb = FedAvg.absorb

    def warning_in_round_2(self, payloads, server_round):
        update = absorb(self, payloads, server_round)
        return dataclasses.replace(update, warning="take care") if server_round == 2 else update

    monkeypatch.setattr(FedAvg, "absorb", warning_in_round_2)
    run(tmp_path, lambda r, node: fedavg_reply(f"client-{node}", r, value=1.0), rounds=3)
    assert [row["warnings"] for row in rows(tmp_path)] == [[], ["take care"], []]
