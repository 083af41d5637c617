"""A strategy with messages of its own (tests/plugins/fedavgm_plugin: FedAvgM, its fedavgm.proto and generated
module): its halves exchange its messages through fedbayes' envelopes and codec with no edit to fedbayes."""

from __future__ import annotations

import filecmp

import numpy as np
from grpc_tools import protoc

from fedbayes.bayes.params import flatten
from fedbayes.protos import payloads_pb2 as pb
from tests.support import PLUGINS, ROOT, FakeGrid, InProcessFederation, envelope_of

REFERENCE = "fedavgm_plugin:FEDAVGM"
SIZES = [40, 60, 80]


def federation(tmp_path, momentum: float, strategy: str = REFERENCE) -> InProcessFederation:
    hyperparameters = {"fedavgm-momentum": momentum, "fedavgm-lr": 1.0} if strategy == REFERENCE else {}
    return InProcessFederation(tmp_path, {"strategy": strategy, "lr": 0.05, **hyperparameters}, SIZES)


def flat_arrays(run: InProcessFederation) -> np.ndarray:
    return flatten({name: run.arrays[name].numpy() for name in run.layout}, run.layout)


def trajectory(run: InProcessFederation, rounds: int) -> list[np.ndarray]:
    """The global model before round 1 and after each round, every node taking part."""
    models = [flat_arrays(run)]
    for server_round in range(1, rounds + 1):
        run.round(server_round, [1, 2, 3])
        models.append(flat_arrays(run))
    return models


def test_the_plugins_messages_ride_in_fedbayes_envelopes(plugin_path, tmp_path):
    run = federation(tmp_path, momentum=0.9)
    instruction = run.core.configure(1, run.arrays, FakeGrid([1])).messages[0]
    envelope = envelope_of(instruction.content)
    assert isinstance(envelope, pb.Instruction) and envelope.body.TypeName() == "fedavgm.v1.FedAvgMInstruction"
    reply = envelope_of(run.answer(instruction))
    assert isinstance(reply, pb.Reply) and reply.body.TypeName() == "fedavgm.v1.FedAvgMReply"
    assert reply.num_examples == SIZES[0] and reply.train_loss > 0


def test_without_momentum_it_is_fedavg(plugin_path, tmp_path):
    fedavgm = trajectory(federation(tmp_path / "m", momentum=0.0), rounds=3)
    fedavg = trajectory(federation(tmp_path / "a", momentum=0.0, strategy="fedavg"), rounds=3)
    for ours, theirs in zip(fedavgm[1:], fedavg[1:]):
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_the_server_carries_its_momentum_between_rounds(plugin_path, tmp_path):
    """Round 1 is FedAvg's (m starts at 0); round 2 moves by β·m₁ + d₂, where d₂ is the clients' mean change from
    the same global model, which a momentum-free run of the same clients measures."""
    with_momentum = federation(tmp_path / "m", momentum=0.9)
    w0, w1, w2 = trajectory(with_momentum, rounds=2)
    _, plain_w1, plain_w2 = trajectory(federation(tmp_path / "p", momentum=0.0), rounds=2)
    np.testing.assert_allclose(w1, plain_w1, atol=1e-6)
    m1, d2 = w1 - w0, plain_w2 - plain_w1
    np.testing.assert_allclose(w2 - w1, 0.9 * m1 + d2, atol=1e-5)
    np.testing.assert_allclose(with_momentum.server.state, 0.9 * m1 + d2, atol=1e-5)
    assert not np.allclose(w2, plain_w2, atol=1e-4)


def test_its_generated_module_is_current(tmp_path):
    source = PLUGINS / "fedavgm_plugin" / "fedavgm.proto"
    well_known = protoc._get_resource_file_name("grpc_tools", "_proto")  # google/protobuf/any.proto
    arguments = [
        "protoc",
        f"-I{PLUGINS}",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        str(source),
    ]
    assert protoc.main(arguments) == 0
    for name in ("fedavgm_pb2.py", "fedavgm_pb2.pyi"):
        assert filecmp.cmp(tmp_path / "fedavgm_plugin" / name, source.parent / name, shallow=False), name
