"""DSVGD's bookkeeping with the real server and client halves in one process (messages routed by hand):
scheduling, the server adopting uploads bit for bit, local particles staying on their client, dropped
replies, checkpoints, P-DSVGD."""

import logging

import numpy as np
import pytest
import torch

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode
from fedbayes.strategies import get_algorithm
from fedbayes.strategies.base import ServerState
from fedbayes.strategies.dsvgd.math import initial_particles
from tests.support import (
    FakeGrid,
    declared_payload,
    newest_state,
    partition_runtime,
    reply_message,
    round_core,
    settings,
)

NODE_CLIENTS = {11: "client-2", 12: "client-0", 13: "client-1"}  # node order is not client-id order


def federation(tmp_path, strategy="dsvgd", **overrides):
    run = settings(
        **{
            "strategy": strategy,
            "fraction": 0.05,
            "model": "logreg",
            "pool": 4,
            "particles": 3,
            "local-steps": 3,
            "distill-steps": 3,
            "svgd-lr": 0.01,
            "distill-lr": 0.01,
            **overrides,
        }
    )
    runtimes = {
        node: partition_runtime(run, tmp_path, int(client.split("-")[1]), 3, client)
        for node, client in NODE_CLIENTS.items()
    }
    layout = runtimes[11].layout
    return round_core(get_algorithm(strategy).build_server(run, layout)), runtimes, run


def run_round(core, runtimes, server_round, lose_reply=False):
    """One round: the server's messages go to their nodes' client halves; returns (messages, replies, the round's
    report)."""
    plan = core.configure(server_round, None, FakeGrid(runtimes))
    messages = plan.messages
    replies = []
    for message in messages:
        node = message.metadata.dst_node_id
        content = get_algorithm(runtimes[node].settings.strategy).client_half()(message.content, runtimes[node])
        replies.append(reply_message(content, node))
    delivered = [] if lose_reply else replies
    return messages, replies, core.aggregate(plan, delivered).report


def store_files(runtime):
    return (
        {path.name: path.read_bytes() for path in runtime.state_store("fed").directory.glob("*")}
        if runtime.state_store("fed").directory.is_dir()
        else {}
    )


def all_tensors(content, message_type):
    return [value for group in declared_payload(content, message_type).tensors.values() for value in group.values()]


def test_one_client_per_round_round_robin_upload_adopted_bit_for_bit_local_particles_stay_home(tmp_path):
    core, runtimes, settings = federation(tmp_path)
    size = sum(int(np.prod(shape)) for shape in runtimes[11].layout.values())
    layout = {"particles": (3, size)}
    scheduled, wire = [], []
    for server_round in range(1, 8):
        before = {node: store_files(runtime) for node, runtime in runtimes.items()}
        messages, replies, _ = run_round(core, runtimes, server_round)
        assert len(messages) == 1 and len(replies) == 1
        node = messages[0].metadata.dst_node_id
        scheduled.append(NODE_CLIENTS[node])
        reply = decode(replies[0].content, pb.Reply, pb.DSVGDReply, {"particles": layout}, sender="test")
        assert [(spec.name, tuple(spec.shape)) for spec in reply.message.particles.tensors] == [
            ("particles", (3, size))
        ]
        assert not reply.envelope.buffers.tensors  # the MLP has none
        assert np.array_equal(core.strategy.particles, reply.tensors["particles"]["particles"])  # bit for bit
        assert core.strategy.particles.shape == (3, size) and core.strategy.particles.dtype == np.float32
        # a client's second visit starts from the local particles of its first
        first_visit = 1 + scheduled.index(scheduled[-1])
        assert reply.reply.resumed_from_round == (0 if first_visit == server_round else server_round - 3)
        for other in set(runtimes) - {node}:
            assert store_files(runtimes[other]) == before[other]  # non-scheduled clients untouched
        wire += [(messages[0].content, pb.DSVGDInstruction), (replies[0].content, pb.DSVGDReply)]
    # discovery in node order, then round-robin continuing in client-id order
    assert scheduled == ["client-2", "client-0", "client-1", "client-2", "client-0", "client-1", "client-2"]
    stored = [
        newest_state(runtime.state_store("fed")).tensors["local_particles"].numpy() for runtime in runtimes.values()
    ]
    assert all(local.shape == (3, size) for local in stored)
    for content, message_type in wire:
        for value in all_tensors(content, message_type):
            assert not any(value.shape == local.shape and np.allclose(value, local) for local in stored)
    initial = initial_particles(runtimes[11].layout, 3, settings.seed)
    assert not np.allclose(core.strategy.particles, initial)


def test_a_lost_reply_leaves_the_particles_and_the_clients_next_start_alone(tmp_path):
    core, runtimes, _ = federation(tmp_path)
    for server_round in (1, 2, 3):
        run_round(core, runtimes, server_round)
    particles = core.strategy.particles.copy()
    messages, _, _ = run_round(core, runtimes, 4, lose_reply=True)  # client-2 ran and saved, the reply got lost
    lost_node = messages[0].metadata.dst_node_id
    assert np.array_equal(core.strategy.particles, particles) and core.accepted_rounds["client-2"] == 1
    assert runtimes[lost_node].state_store("fed").saved_rounds() == [1, 4]
    for server_round in (5, 6, 7):
        messages, replies, report = run_round(core, runtimes, server_round)
        assert report.fresh_starts == []  # it restarted from round 1's particles, not afresh
    assert messages[0].metadata.dst_node_id == lost_node
    reply = decode(
        replies[0].content,
        pb.Reply,
        pb.DSVGDReply,
        {"particles": {"particles": core.strategy.particles.shape}},
        sender="test",
    )
    assert reply.reply.resumed_from_round == 1
    assert core.accepted_rounds["client-2"] == 7


def test_server_state_round_trip(tmp_path):
    core, runtimes, settings = federation(tmp_path)
    for server_round in (1, 2):
        run_round(core, runtimes, server_round)
    restored = round_core(get_algorithm("dsvgd").build_server(settings, runtimes[11].layout))
    restored.load_state_dict(core.state_dict())
    assert np.array_equal(restored.strategy.particles, core.strategy.particles)
    assert restored.accepted_rounds == core.accepted_rounds == {"client-2": 1, "client-0": 2}
    assert restored.strategy.state.last_scheduled == "client-0"


def test_saved_particles_of_another_count_are_refused_before_they_are_used(tmp_path):
    """The server's kernels are N x N: a checkpoint's N must be the run's, not whatever its rows say."""
    core, runtimes, settings = federation(tmp_path, "p-dsvgd")
    run_round(core, runtimes, 1)
    saved = core.state_dict()
    width = saved.tensors["particles"].shape[1]
    for name in ("particles", next(name for name in saved.tensors if name.startswith("local/"))):
        changed = ServerState({**saved.tensors, name: np.zeros((50, width), np.float32)}, saved.metadata)
        restored = round_core(get_algorithm("p-dsvgd").build_server(settings, runtimes[11].layout))
        with pytest.raises(
            ValueError,
            match=rf"saved state '{name}': particles of shape \(50, {width}\), this run's are \(3, {width}\)",
        ):
            restored.load_state_dict(changed)


def test_p_dsvgd_schedules_several_clients_and_distils_their_local_particles(tmp_path):
    core, runtimes, _ = federation(tmp_path, "p-dsvgd", **{"fraction-train": 0.67, "server-steps": 5})
    initial = None
    for server_round in (1, 2):
        messages, replies, _ = run_round(core, runtimes, server_round)
        assert len(messages) == 2
        for reply in replies:
            payload = declared_payload(reply.content, pb.PDSVGDReply)
            assert list(payload.tensors["local_particles"]) == ["particles"] and payload.tensors["buffers"] == {}
        if initial is None:
            initial = initial_particles(runtimes[11].layout, 3, 0)
    assert 2 <= len(core.strategy.state.local_particles) <= 3
    for client, local in core.strategy.state.local_particles.items():
        node = next(n for n, c in NODE_CLIENTS.items() if c == client)
        stored = newest_state(runtimes[node].state_store("fed")).tensors["local_particles"].numpy()
        assert np.array_equal(local, stored)  # P-DSVGD uploads exactly what the client keeps
    assert torch.isfinite(torch.from_numpy(core.strategy.particles)).all()
    assert not np.allclose(core.strategy.particles, initial)
    state = core.state_dict()
    assert {f"local/{client}" for client in core.strategy.state.local_particles} <= set(state.tensors)


@pytest.mark.parametrize(
    ("strategy", "kde_bandwidth", "sent"),
    [("dsvgd", 0.0, 1.5), ("p-dsvgd", 0.0, 0.55), ("u-dsvgd", 0.0, 0.55), ("dsvgd", 0.3, 0.3), ("p-dsvgd", 2.0, 2.0)],
)
def test_a_kde_bandwidth_of_0_sends_the_variants_default_and_a_set_one_is_sent_as_set(
    tmp_path, caplog, strategy, kde_bandwidth, sent
):
    with caplog.at_level(logging.INFO, logger="flwr"):
        core, runtimes, _ = federation(tmp_path, strategy, **{"kde-bandwidth": kde_bandwidth})
    messages = core.configure(1, None, FakeGrid(runtimes)).messages
    assert messages
    for message in messages:
        assert declared_payload(message.content, pb.DSVGDInstruction).message.kde_bandwidth == sent
    assert (f"{strategy}: kde-bandwidth {sent:g}, the variant's default" in caplog.text) == (kde_bandwidth == 0)


@pytest.mark.parametrize("strategy", ["dsvgd", "p-dsvgd"])
def test_the_lr_schedule_sets_both_loops_step_sizes_over_the_rounds(tmp_path, strategy):
    """Under `lr-schedule` cosine the instruction's step sizes follow lr's cosine over the rounds; constant sends
    svgd-lr and distill-lr as set."""
    rates = {"svgd-lr": 0.02, "distill-lr": 0.01, "num-server-rounds": 4}
    for schedule, factors in (("cosine", (1.0, 0.853553, 0.5, 0.146447)), ("constant", (1.0,) * 4)):
        core, runtimes, _ = federation(tmp_path / schedule, strategy, **rates, **{"lr-schedule": schedule})
        for server_round, factor in enumerate(factors, 1):
            instruction, _ = core.strategy.instruction(server_round, None, [11])
            assert instruction.step_size == pytest.approx(0.02 * factor, rel=1e-5)
            assert instruction.distill_step_size == pytest.approx(0.01 * factor, rel=1e-5)
            if schedule == "constant":
                assert (instruction.step_size, instruction.distill_step_size) == (0.02, 0.01)  # exactly as set
