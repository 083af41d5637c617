"""FedLap-Func's networked halves in one process (real payloads, the real round core and loop on a fake grid): with
no memory points it is FedLap row for row; with them the server holds exactly what its clients picked and
predicted, fits w_g to it, and sends it to no client; the trust boundary refuses memory that changes, comes twice or
is no probability; forgetting a client leaves none of its inputs in the checkpoint."""

import shutil

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from fedbayes.bayes.metrics import classification_metrics, predict_probs
from fedbayes.bayes.params import flatten, set_parameters
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PACKED_ARRAY, TENSORS_KEY, encode
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.loop import TIMING_FIELDS, run_rounds
from fedbayes.strategies.fedlap.math import as_sent, global_from_sites
from fedbayes.strategies.fedlap_func.math import fit_global, point_weights, represented_examples
from fedbayes.tasks.config import LoopSettings
from fedbayes.tasks.models import build_model
from tests.support import (
    FakeGrid,
    InProcessFederation,
    contains_run,
    declared_payload,
    newest_state,
    reply_message,
    rows,
)
from tests.support.forgetting import Federation
from tests.support.rogue import RogueRound, assert_rejected_without_trace

FIT = {"server-fit-steps": 40, "server-fit-lr": 1e-2, "function-weight": 0.5}
OWN_METRICS = {"memory_points", "server_fit_seconds", "server_fit_objective"}  # FedLap-Func's own row keys


def looped_rows(tmp_path, strategy, rounds=5, **keys):
    """`rounds` rounds of 4 in-process clients (fraction-train 0.75) through the real round loop, each evaluated on
    the clients' examples together; the results rows and the final arrays."""
    config = {"strategy": strategy, "prior-precision": 0.5, "lr": 0.05, "local-epochs": 2, "fraction-train": 0.75}
    federation = InProcessFederation(tmp_path, {**config, **keys}, sizes=[12, 30, 20, 8])
    images = torch.cat([runtime.data.images for runtime in federation.runtimes.values()])
    labels = torch.cat([runtime.data.labels for runtime in federation.runtimes.values()])
    model = build_model("logreg", (1, 1, 5), 2)

    def evaluate(arrays, server_round):
        set_parameters(model, {name: arrays[name].numpy() for name in arrays})
        return classification_metrics(predict_probs(model, images, 64, torch.device("cpu")), labels)

    loop = LoopSettings(
        num_rounds=rounds, round_timeout=5.0, poll_interval=0.01, wait_for_clients=4, wait_for_clients_timeout=5.0
    )
    arrays = run_rounds(
        FakeGrid(federation.runtimes, federation.answer),
        federation.core,
        federation.arrays,
        loop,
        evaluate,
        str(tmp_path / "rows.jsonl"),
        CheckpointStore(tmp_path / "server-state", "fed", {}),
    )
    return rows(tmp_path, "rows.jsonl"), arrays


def test_without_memory_points_it_is_fedlap_row_for_row(tmp_path):
    """M_k = ∅ ([P] §3.4: "FedLap-Func recovers FedLap"): every row's accuracy, NLL, ECE and reliability bins, train
    loss, clients, K, the sampled rounds and the final weights equal FedLap's bit for bit."""
    fedlap_rows, fedlap_arrays = looped_rows(tmp_path / "fedlap", "fedlap")
    func_rows, func_arrays = looped_rows(tmp_path / "func", "fedlap-func", **{"memory-points-per-class": 0})
    assert [row["memory_points"] for row in func_rows] == [0] * 5
    assert all(not OWN_METRICS & row.keys() for row in fedlap_rows)
    for fedlap, func in zip(fedlap_rows, func_rows, strict=True):
        assert {k: v for k, v in func.items() if k not in TIMING_FIELDS | OWN_METRICS} == {
            k: v for k, v in fedlap.items() if k not in TIMING_FIELDS
        }
    assert fedlap_rows[-1]["clients"] == 3 and fedlap_rows[-1]["accuracy"] > fedlap_rows[0]["accuracy"]
    for name in fedlap_arrays:
        np.testing.assert_array_equal(func_arrays[name].numpy(), fedlap_arrays[name].numpy())


def test_with_memory_points_the_rows_differ_from_fedlaps(tmp_path):
    fedlap_rows, _ = looped_rows(tmp_path / "fedlap", "fedlap", rounds=3)
    func_rows, _ = looped_rows(tmp_path / "func", "fedlap-func", rounds=3, **FIT)
    assert [row["memory_points"] for row in func_rows][-1] > 0
    assert func_rows[0]["nll"] != fedlap_rows[0]["nll"]  # the server's fit already moves round 1's w_g
    assert all("server_fit_objective" in row for row in func_rows)


def test_the_server_fits_w_g_to_exactly_what_its_clients_picked_and_sends_it_to_none(tmp_path):
    """Through a join (client-4 in round 2), a client that loses its state (client-1 in round 4: it draws and sends
    the same inputs again and is accepted) and a checkpoint round trip: the server's memory of each client is that
    client's own rows at its stored indices, with their N_{k,c}/M_{k,c} and the client's newest predictions; w_g is
    the fit of those from w_lap; no instruction holds any memory input."""
    federation = InProcessFederation(
        tmp_path, {"strategy": "fedlap-func", "prior-precision": 0.5, **FIT}, [12, 30, 20, 8]
    )
    server, core = federation.server, federation.core
    for server_round in range(1, 6):
        nodes = [1, 2, 3] if server_round == 1 else [1, 2, 3, 4]
        if server_round == 4:
            shutil.rmtree(federation.runtimes[1].state_store("fed").directory)
        plan = core.configure(server_round, federation.arrays, FakeGrid(nodes))
        messages = plan.messages
        held = [memory.inputs.numpy().reshape(len(memory.inputs), -1) for memory in server.state.memories.values()]
        for message in messages:
            instruction = declared_payload(message.content, pb.FedLapFuncInstruction)
            assert set(instruction.tensors) == {"global_mean", "buffers"}
            packed = message.content.array_records[TENSORS_KEY][PACKED_ARRAY].numpy()
            assert not any(contains_run(packed, row) for rows_ in held for row in rows_)
        replies = [reply_message(federation.answer(m), m.metadata.dst_node_id) for m in messages]
        outcome = core.aggregate(plan, replies)
        federation.arrays = outcome.arrays
        assert outcome.report.accepted == [f"client-{node}" for node in nodes], outcome.report.rejected
        assert outcome.report.fresh_starts == (["client-1"] if server_round == 4 else [])
        for node in nodes:
            client, runtime = f"client-{node}", federation.runtimes[node]
            stored = newest_state(runtime.state_store("fed"))
            memory = server.state.memories[client]
            indices = stored.tensors["memory_indices"]
            assert len(indices) == len(torch.unique(runtime.data.labels))  # one per class it holds
            np.testing.assert_array_equal(memory.inputs.numpy(), runtime.data.images[indices].numpy())
            np.testing.assert_array_equal(memory.predictions.numpy(), stored.tensors["memory_predictions"].numpy())
            torch.testing.assert_close(memory.represented, represented_examples(runtime.data.labels, indices))
            assert memory.round == server_round
        sites = server.state.sites
        w_lap = as_sent(
            global_from_sites(sites.unclaimed + sum(site.mean for site in sites.sites.values()), 0.0, 0.5)[0]
        )
        clients = sorted(server.state.memories)
        inputs = torch.cat([server.state.memories[c].inputs for c in clients])
        fitted, _ = fit_global(
            server.model,
            w_lap,
            inputs,
            torch.cat([server.state.memories[c].predictions for c in clients]),
            point_weights(torch.cat([server.state.memories[c].represented for c in clients]), 0.5),
            0.5,
            steps=40,
            lr=1e-2,
        )
        torch.testing.assert_close(sites.global_mean, as_sent(fitted), rtol=0, atol=0)
        assert (sites.global_mean - w_lap).abs().max() > 1e-4  # the fit moved it
        sent = {name: outcome.arrays[name].numpy() for name in federation.layout}
        np.testing.assert_array_equal(flatten(sent, federation.layout), sites.global_mean.numpy())
    restored = type(server)(federation.settings, federation.layout)
    restored.commit(restored.load_state(server.save_state(server.state)))
    assert restored.state.memories.keys() == server.state.memories.keys()
    for client, memory in server.state.memories.items():
        again = restored.state.memories[client]
        for name in ("inputs", "represented", "predictions"):
            assert torch.equal(getattr(again, name), getattr(memory, name)), (client, name)
        assert again.round == memory.round
    torch.testing.assert_close(restored.state.sites.global_mean, server.state.sites.global_mean, rtol=0, atol=0)


# ---- the trust boundary -----------------------------------------------------------------------------------------
def tampered(content, change):
    """Node 1's honest reply with `change(envelope, message, tensors)` applied, re-encoded."""
    payload = declared_payload(content, pb.FedLapFuncReply)
    tensors = {
        group: {name: np.array(value) for name, value in arrays.items()} for group, arrays in payload.tensors.items()
    }
    change(payload.envelope, payload.message, tensors)
    return encode(payload.envelope, payload.message, tensors)


def as_fresh(game, inputs_change=lambda x: x, represented_change=lambda r: r):
    """A Change: the reply claims to start afresh and sends memory inputs (changed by `inputs_change`) with the
    server's record of the examples they stand for (changed by `represented_change`)."""
    memory = game.federation.server.state.memories["client-1"]

    def change(envelope, message, tensors):
        envelope.resumed_from_round = 0
        message.sends_inputs = True
        message.represented_examples[:] = represented_change(memory.represented.numpy()).tolist()
        tensors["memory_inputs"] = {"inputs": inputs_change(memory.inputs.numpy()).astype(np.float32)}

    return change


def predictions_change(change):
    def apply(envelope, message, tensors):
        tensors["memory_predictions"]["predictions"] = change(tensors["memory_predictions"]["predictions"])

    return apply


def fewer_points(envelope, message, tensors):
    message.memory_points -= 1
    tensors["memory_predictions"]["predictions"] = tensors["memory_predictions"]["predictions"][1:]


def resends_inputs(game):
    memory = game.federation.server.state.memories["client-1"]

    def change(envelope, message, tensors):
        message.sends_inputs = True
        message.represented_examples[:] = memory.represented.tolist()
        tensors["memory_inputs"] = {"inputs": memory.inputs.numpy()}

    return change


def too_many(envelope, message, tensors):
    message.memory_points = 3  # memory-points-per-class 1 x 2 classes is the most
    tensors["memory_predictions"] = {"predictions": np.full((3, 2), 0.5, np.float32)}


ATTACKS = {
    "other memory inputs than it sent": (lambda g: as_fresh(g, lambda x: x + 0.5), "fixed once sent"),
    "the same inputs with other counts": (lambda g: as_fresh(g, represented_change=lambda r: r * 2), "together for"),
    "counts that are no class sizes": (
        lambda g: as_fresh(g, represented_change=lambda r: r + np.array([0.5, -0.5])),
        "a class's examples over its memory points",
    ),
    "inputs of another shape": (lambda g: as_fresh(g, lambda x: x[..., :4]), "shape must be"),
    "memory inputs again while resuming": (resends_inputs, "and only then"),
    "negative predictions": (
        lambda g: predictions_change(lambda p: np.tile(np.float32([1.5, -0.5]), (len(p), 1))),
        "negative values",
    ),
    "predictions that do not sum to 1": (lambda g: predictions_change(lambda p: p * 0.9), "not 1"),
    "NaN predictions": (lambda g: predictions_change(lambda p: np.full_like(p, np.nan)), "contains NaN"),
    "more points than memory-points-per-class x classes": (lambda g: too_many, "more than memory-points-per-class"),
    "predictions on fewer points than it holds": (lambda g: fewer_points, "the server holds"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_memory_that_changes_comes_twice_or_is_no_probability_is_refused_without_trace(tmp_path, attack):
    """Round 2's reply of client-1 altered; the round goes on with client-2 and client-3 exactly as a server that
    never saw client-1's reply (state, checkpoint and global model)."""
    game = RogueRound(tmp_path, "fedlap-func", **FIT)
    assert len(game.federation.server.state.memories["client-1"].inputs) == 2
    make, words = ATTACKS[attack]
    rogue = tampered(game.replies[1], make(game))
    server, result, expected = game.aggregate({1: rogue}, honest_nodes=[2, 3])
    assert_rejected_without_trace(server, result, expected, game.control, "client 'client-1' (node 1)", words)


def test_a_client_that_lost_its_state_may_send_the_same_memory_again(tmp_path):
    game = RogueRound(tmp_path, "fedlap-func", **FIT)
    memory = game.federation.server.state.memories["client-1"]
    server, result, _ = game.aggregate({1: tampered(game.replies[1], as_fresh(game))}, honest_nodes=[2, 3])
    assert result.report.accepted == ["client-1", "client-2", "client-3"] and not result.report.rejected
    assert result.report.fresh_starts == ["client-1"]
    assert torch.equal(server.strategy.state.memories["client-1"].inputs, memory.inputs)


# ---- forgetting -------------------------------------------------------------------------------------------------
def test_forgetting_a_client_leaves_none_of_its_memory_inputs_in_the_checkpoint(tmp_path):
    """`fedbayes forget`'s path on a stopped federation: the checkpoint after it holds client-2's site, memory
    inputs, counts and predictions nowhere (no tensor named for it, no run of values equal to one of its inputs), the
    other clients' memory as before, and w_g fitted to theirs alone."""
    federation = Federation(tmp_path, "fedlap-func", **FIT)
    federation.run(2)
    before = federation.newest()
    forgotten_memory = before.core.strategy.state.memories["client-2"]
    expected = before.core.strategy.forget("client-2")
    record = federation.forget("client-2")
    assert record["event"] == "forgotten" and record["note"] == expected.note and record["kl_before_after"] > 0
    (checkpoint_path,) = federation.snapshot()
    tensors = load_file(federation.directory / checkpoint_path)
    assert [name for name in tensors if "client-2" in name] == []
    rows_ = forgotten_memory.inputs.numpy().reshape(len(forgotten_memory.inputs), -1)
    for name, value in tensors.items():
        flat = np.asarray(value, dtype=np.float32).ravel()
        assert not any(contains_run(flat, row) for row in rows_), name
    after = federation.newest()
    state = after.core.strategy.state
    assert sorted(state.memories) == ["client-1", "client-3"] and sorted(state.sites.sites) == ["client-1", "client-3"]
    for client in ("client-1", "client-3"):
        assert torch.equal(state.memories[client].inputs, before.core.strategy.state.memories[client].inputs)
    np.testing.assert_array_equal(
        flatten(after.arrays, after.core.strategy.layout), expected.weights.astype(np.float32)
    )
