"""Forgetting a client, the operations (server/forget/): the operator's `fedbayes forget` on a stopped federation and
between the rounds of a running one (a request made mid-round waits for the round's end), a client's own request
(`fedbayes client --leave --forget`: only from its own node, confirmed, its state deleted), the revoked id refused
afterwards, readmission, refinement rounds on resume, the refusals that change nothing, a SIGKILL at every step
leaving the old or the new checkpoint with an audit log that agrees; and one real loopback federation (integration).

The federations here are the round loop (server/loop.py run_rounds) with real BayesADMM halves behind a scripted grid
(tests/support/forgetting.py: 3 clients, logistic regression on synthetic data), whose checkpoints `fedbayes forget`
rebuilds the server from (its test set: <tmp>/data/test.npz)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fedbayes.bayes.params import flatten
from fedbayes.client.state import leave_request_note, left_marker
from fedbayes.deploy.cli import main
from fedbayes.posterior.export import RunLocation
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import encode, new_header
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.forget import (
    AUDIT_LOG,
    AuditLog,
    ForgetError,
    ForgetRequest,
    RequestQueue,
    forget_command,
    server_lock,
)
from tests.support import DEFAULTS
from tests.support.crafted import edit_json_metadata, in_child, rewrite_safetensors, write_user_models
from tests.support.forgetting import LEAVING, ClientsGrid, Federation


def test_an_operator_forget_on_a_stopped_federation(trained):
    """The newest checkpoint becomes the strategy's `forget` committed: client-3's duals gone, the global model its
    Forgotten.weights, the id unbound, revoked and out of the accepted rounds; the older checkpoint, which holds the
    client, deleted; the forget in the checkpoint's ledger and in the audit log; a resume accepts the checkpoint."""
    before = trained.newest()
    expected = before.core.strategy.forget("client-3")
    record = trained.forget("client-3")
    after = trained.newest()
    assert after.server_round == 2 and sorted(after.core.strategy.state.duals) == ["client-1", "client-2"]
    np.testing.assert_array_equal(
        flatten(after.arrays, after.core.strategy.layout), np.asarray(expected.weights, dtype=np.float32)
    )
    identities = after.core.identities
    assert identities.ledger.revoked == {"client-3"} and "client-3" not in identities.node_of_client
    assert sorted(after.core.accepted_rounds) == ["client-1", "client-2"]
    assert trained.snapshot().keys() == {"checkpoint-2.safetensors"}
    assert identities.ledger.records == (record,) and trained.audit() == [record]
    assert record["event"] == "forgotten" and record["contributed_rounds"] == [[1, 2]] and record["node"] == 3
    assert record["asked_by"].startswith("operator ") and record["exact"] is False
    assert record["kl_before_after"] == pytest.approx(expected.kl_before_after) and record["kl_before_after"] > 0
    assert record["note"] == expected.note
    CheckpointStore(
        trained.state_dir, "fed", trained.run_config, initial_arrays=before.arrays
    ).load()  # same settings: a resume takes it


def test_the_cli_prints_what_was_done_and_a_resume_runs_the_refinement_rounds_refusing_the_revoked_id(trained, capsys):
    code = main(
        ["forget", str(trained.state_dir), "--federation", "fed", "--client", "client-3", "--refine-rounds", "2"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "forgot client 'client-3' of federation 'fed' after round 2" in out
    assert "exact: no, an estimate" in out and "KL(before || after) = " in out
    assert "contributed rounds 1-2 (last accepted: 2)" in out and "through round 4" in out
    core, _, rows = trained.run(2)  # num-server-rounds 2: the refinement raises it to 4
    assert [row["round"] for row in rows] == [1, 2, 3, 4]
    assert [row["clients"] for row in rows[2:]] == [2, 2]
    assert "was forgotten after round 2" in rows[-1]["rejected"]["client 'client-3' (node 3)"]
    assert sorted(core.strategy.state.duals) == ["client-1", "client-2"]


@pytest.mark.parametrize("case", ["unknown", "already-forgotten", "last-remaining", "fedavg"])
def test_a_refused_request_changes_nothing_and_the_audit_says_why(tmp_path, case):
    federation = Federation(
        tmp_path,
        strategy="fedavg" if case == "fedavg" else "bayesadmm",
        sizes=(12, 16) if case == "last-remaining" else (12, 16, 20),
    )
    federation.run(2)
    if case in ("already-forgotten", "last-remaining"):
        federation.forget("client-2")
    before, audited = federation.snapshot(), len(federation.audit())
    client = {"unknown": "client-9", "fedavg": "client-1", "last-remaining": "client-1"}.get(case, "client-2")
    problem = {
        "unknown": "client 'client-9' is unknown",
        "already-forgotten": "was already forgotten after round 2",
        "last-remaining": "is the last remaining client",
        "fedavg": "fedavg: the server keeps no per-client factor",
    }
    with pytest.raises(ForgetError, match=problem[case]):
        federation.forget(client)
    assert federation.snapshot() == before
    assert [record["event"] for record in federation.audit()[audited:]] == ["refused"]
    assert problem[case] in federation.audit()[-1]["reason"]


@pytest.mark.parametrize(
    ("option", "client"), [("--client", ""), ("--readmit", ""), ("--client", "../client-3"), ("--client", "c" * 129)]
)
def test_a_request_for_no_client_id_is_refused_before_anything_is_locked_or_written(trained, capsys, option, client):
    before, files = trained.snapshot(), sorted(path.name for path in trained.directory.iterdir())
    assert main(["forget", str(trained.state_dir), "--federation", "fed", option, client]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == (
        f"fedbayes: error: {client[:128]!r} is not a client id (1 to 128 of [A-Za-z0-9._-]); nothing was asked"
    )
    assert trained.snapshot() == before and sorted(path.name for path in trained.directory.iterdir()) == files
    with pytest.raises(ForgetError, match="is not a client id"):
        ForgetRequest.by_operator("fed", client)


def test_refinement_rounds_are_bounded_on_the_command_line_in_python_and_in_a_request_file(trained, capsys):
    argv = ["forget", str(trained.state_dir), "--federation", "fed", "--client", "client-3"]
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--refine-rounds", "1000000000"])
    assert refused.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("error: argument --refine-rounds: must be in [0, 1000], got '1000000000'")
    )
    with pytest.raises(ForgetError, match=r"refine rounds 1001 must be in \[0, 1000\] \(MAX_REFINE_ROUNDS"):
        ForgetRequest.by_operator("fed", "client-3", 1001)
    before = trained.snapshot()
    written = ForgetRequest("20260101T000000-big", "fed", "client-3", "operator x@y", "", refine_rounds=10**9)
    with pytest.raises(ForgetError, match=r"refused: refine rounds 1000000000 must be in \[0, 1000\]"):
        forget_command(trained.location, written, 5.0)  # as a request file written by hand would be
    assert trained.snapshot() == before and [record["event"] for record in trained.audit()] == ["refused"]
    assert trained.forget("client-3", refine_rounds=1000)["refine_through_round"] == 1002


def test_a_checkpoint_of_another_federation_is_refused_before_anything_is_written(trained):
    shutil.copytree(trained.directory, trained.state_dir / "other")
    other = RunLocation(trained.state_dir, "other", {})
    with pytest.raises(ForgetError, match="is a checkpoint of federation 'fed', not of 'other'"):
        forget_command(other, ForgetRequest.by_operator("other", "client-3"), 5.0)
    assert sorted(path.name for path in (trained.state_dir / "other").iterdir()) == sorted(
        path.name for path in trained.directory.iterdir()
    )  # no request, no audit line
    assert not (trained.state_dir / "other" / AUDIT_LOG).exists()


def edit_newest_run_config(federation: Federation, **fields) -> None:
    """The newest checkpoint's run config changed, its checksum recomputed: as anyone who edits the file can."""
    newest = (federation.directory / "checkpoint.safetensors").resolve()
    rewrite_safetensors(newest, change_metadata=edit_json_metadata("run_config", **fields))


def test_a_model_the_checkpoint_names_is_imported_only_when_the_operator_names_it(trained, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(trained.tmp_path))
    write_user_models(trained.tmp_path)
    edit_newest_run_config(trained, model="user_models:linear")
    before = trained.snapshot()
    with pytest.raises(ForgetError, match="names model 'user_models:linear', code that would be imported") as error:
        trained.forget("client-3")
    assert str(error.value).endswith("name it yourself: --model user_models:linear; nothing was changed")
    assert trained.snapshot() == before and not (trained.tmp_path / "imported").exists()
    forget = ["forget", str(trained.state_dir), "--federation", "fed", "--client", "client-3"]
    assert main([*forget, "--model", "user_models:linear"]) == 0
    assert "forgot client 'client-3'" in capsys.readouterr().out and (trained.tmp_path / "imported").exists()


def test_a_checkpoint_whose_run_config_claims_a_huge_model_is_refused_before_it_is_built(trained):
    edit_newest_run_config(trained, model="mlp", hidden="100000,100000")  # 40 GB of weights, had it been built
    before = trained.snapshot()
    forget = ["forget", "server-state", "--federation", "fed", "--client", "client-3"]
    child = in_child(f"from fedbayes.deploy.cli import main\nrc = main({forget!r})", cwd=trained.tmp_path)
    assert child.rc == 1 and "mlp with 2 hidden layers has 6 parameter tensors, more than the 2" in child.stderr
    assert child.extra_mib < 256 and trained.snapshot() == before


def test_a_request_file_that_is_no_request_is_refused_and_removed_and_the_others_go_on(trained):
    queue = trained.directory / "forget-requests"
    queue.mkdir()
    (queue / "20260101T000000-bad.json").write_text('{"client": 3}')
    trained.forget("client-3")
    refused, forgotten = trained.audit()
    assert refused["event"] == "refused" and "is no forget request" in refused["reason"]
    assert forgotten["event"] == "forgotten" and not any(queue.iterdir())


def test_readmission_lets_the_id_back_as_a_new_client(trained):
    with pytest.raises(ForgetError, match="client 'client-3' is not revoked: there is nothing to readmit"):
        trained.forget("client-3", readmit=True)
    trained.forget("client-3")
    record = trained.forget("client-3", readmit=True)
    assert record["event"] == "readmitted"
    assert not trained.newest().core.identities.ledger.revoked
    core, _, rows = trained.run(3)
    assert rows[-1]["clients"] == 3 and core.accepted_rounds["client-3"] == 3
    assert [record["event"] for record in trained.audit()] == ["refused", "forgotten", "readmitted"]


def test_a_request_made_while_a_round_is_in_flight_waits_for_its_end(tmp_path):
    """The operator asks while round 2 is in flight: nothing changes until round 2 is committed and checkpointed
    (client-3's round-2 reply is absorbed); the forget is applied after it, and round 3 goes on without client-3."""
    federation = Federation(tmp_path)
    in_flight = []

    def during_round(server_round, grid):
        if server_round == 2 and not in_flight:
            with server_lock(federation.directory, wait=False) as free:
                assert not free  # the running server holds the lock: a request is queued for it
            RequestQueue(federation.directory / "forget-requests").submit(ForgetRequest.by_operator("fed", "client-3"))
        if server_round == 2:
            in_flight.append((federation.audit(), federation.snapshot()))

    core, _, rows = federation.run(3, ClientsGrid(federation.clients, during_round=during_round))
    assert all(audit == [] for audit, _ in in_flight)  # mid-round: not applied
    assert [row["clients"] for row in rows] == [3, 3, 2]
    (record,) = federation.audit()
    assert record["event"] == "forgotten" and record["round"] == 2 and record["contributed_rounds"] == [[1, 2]]
    assert sorted(core.strategy.state.duals) == ["client-1", "client-2"]
    assert "was forgotten after round 2" in rows[-1]["rejected"]["client 'client-3' (node 3)"]
    assert not any((federation.directory / "forget-requests").iterdir())


def test_a_client_leaves_and_is_forgotten_at_its_own_request(tmp_path):
    """Node 3 answers with LeaveAndForget from round 2 on: its request sends no update and is applied after round 2;
    round 3's instruction to node 3 says it is forgotten, so it deletes its state and writes the leave marker; its
    acknowledgement adds nothing to the audit."""
    federation = Federation(tmp_path)
    federation.run(1)
    grid = ClientsGrid(federation.clients, behaviour={3: LEAVING})
    core, _, rows = federation.run(3, grid)
    assert [row["clients"] for row in rows] == [3, 2, 2]
    (record,) = federation.audit()
    assert record["asked_by"] == "node 3, bound to client 'client-3'" and record["client"] == "client-3"
    assert record["node"] == 3 and record["round"] == 2
    assert grid.instructions[2, 3].forgotten_client_id == ""
    assert grid.instructions[3, 3].forgotten_client_id == "client-3"
    assert grid.instructions[3, 1].forgotten_client_id == ""
    state_dir = tmp_path / "state"
    assert not (state_dir / "fed" / "client-3").exists() and (state_dir / "fed" / "client-1").exists()
    assert json.loads(left_marker(state_dir, "client-3").read_text())["federation"] == "fed"
    assert sorted(core.strategy.state.duals) == ["client-1", "client-2"]


def test_a_forget_request_from_another_node_is_refused_and_logged(tmp_path):
    federation = Federation(tmp_path)
    federation.run(1)
    core, _, rows = federation.run(2, ClientsGrid(federation.clients, behaviour={2: "client-3"}))
    (record,) = federation.audit()  # the node that asked, and the client it named (not as the one who asked)
    assert record["event"] == "refused" and record["asked_by"] == "node 2, bound to client 'client-2'"
    assert record["client"] == "client-3"
    assert "node 2 asked to forget client 'client-3', which is bound to node 3" in record["reason"]
    assert (
        sorted(core.strategy.state.duals) == ["client-1", "client-2", "client-3"] and not core.identities.ledger.revoked
    )
    assert "claiming to be client 'client-3'" in " ".join(rows[-1]["rejected"])


def test_an_audit_line_cut_short_by_a_crash_is_no_record_and_the_next_one_starts_on_its_own_line(tmp_path):
    audit = AuditLog(tmp_path / AUDIT_LOG)
    audit.append({"request": "a"})
    with audit.path.open("a") as audit_file:
        audit_file.write('{"request": "b", "ev')
    assert audit.records() == [{"request": "a"}]
    audit.append({"request": "c"})
    assert audit.records() == [{"request": "a"}, {"request": "c"}]


# ---- a SIGKILL inside the operation ------------------------------------------------------------------------------


# what each kill leaves: (the checkpoint is the new one, checkpoint-1 still there, the forget audited)


# ---- a real federation ---------------------------------------------------------------------------------------------


# ---- the client's side -------------------------------------------------------------------------------------------
def clientapp_answer(tmp_path, forgotten: str, leave: bool):
    """client/app.py's ClientApp on an instruction whose header says `forgotten`, for node config client-id c1 (leaving
    or not): what it replies, or raises."""
    from flwr.app import Context, Message, RecordDict

    from fedbayes.client.app import _train

    header = new_header("fed", 4)
    header.forgotten_client_id = forgotten
    instruction = Message(
        encode(pb.Instruction(header=header), pb.FedAvgInstruction(), {}), dst_node_id=5, message_type="train"
    )
    node_config = {
        "client-id": "c1",
        "state-dir": str(tmp_path / "state"),
        "leave-and-forget": leave,
        "partition-id": 0,
        "num-partitions": 1,
    }
    context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config=DEFAULTS)
    return _train(instruction, context).content


def test_fedbayes_client_leave_forget_reaches_the_clientapp_which_asks_then_deletes_its_state_when_told(tmp_path):
    from argparse import Namespace

    from flwr.common.config import parse_config_args

    from fedbayes.client.runtime import NodeSettings
    from fedbayes.client.state import ClientStateStore
    from fedbayes.deploy.client import check_joining, node_config
    from fedbayes.protos.codec import decode

    args = Namespace(client_id="c1", data=None, state_dir=tmp_path / "state", log_dir=None, leave=True, forget=False)
    with pytest.raises(ValueError, match="--leave and --forget go together"):
        check_joining(args)
    args.forget = True
    check_joining(args)  # leaving needs no --data
    node = NodeSettings.from_node_config(parse_config_args([node_config("c1", tmp_path, leave_and_forget=True)]), "cpu")
    assert node.leave_and_forget and node.data_path == ""

    store = ClientStateStore(tmp_path / "state", "fed", "c1")
    store.path(3).parent.mkdir(parents=True)
    store.path(3).write_bytes(b"state after round 3")
    asked = decode(clientapp_answer(tmp_path, "", leave=True), pb.LeaveAndForget, None, {}, "c1")
    assert asked.header.client_id == "c1" and asked.header.server_round == 4
    assert store.saved_rounds() == [3]  # not told yet: kept
    # the request noted for `fedbayes client` to say, and to name if it gives up
    assert json.loads(leave_request_note(tmp_path / "state", "c1").read_text()) == {"federation": "fed", "round": 4}
    told = decode(clientapp_answer(tmp_path, "c1", leave=True), pb.LeaveAndForget, None, {}, "c1")
    assert told.header.client_id == "c1" and not store.directory.exists()
    assert json.loads(left_marker(tmp_path / "state", "c1").read_text())["federation"] == "fed"


def test_a_client_told_it_is_forgotten_refuses_to_train_naming_why(tmp_path):
    with pytest.raises(RuntimeError, match="the server has forgotten client 'c1' .* and refuses its replies"):
        clientapp_answer(tmp_path, "c1", leave=False)
