"""FedLap-Func over real processes (`fedbayes local`, 3 clients): it trains, and no instruction any client receives
carries a memory input, another client's or its own. Every ClientApp records each instruction as it arrived
(tests/support/faults, `record`); each is searched for every memory input the server's checkpoint holds."""

import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import tensor_group_fields
from fedbayes.server.checkpoint import CheckpointStore
from tests.support import contains_run
from tests.support.processes import cli_env, fault_env, fedbayes

pytestmark = pytest.mark.integration


def test_fedlap_func_trains_and_no_client_is_sent_a_memory_input(tmp_path):
    workdir, seen = tmp_path / "func", tmp_path / "seen"
    result = fedbayes(
        [
            *("local", "--strategy", "fedlap-func", "--clients", "3", "--rounds", "2", "--fraction", "0.05"),
            *("--split", "dirichlet", "--workdir", str(workdir)),
            *("--set", "local-epochs=1", "--set", "server-fit-steps=200", "--set", "memory-points-per-class=2"),
        ],
        env=cli_env(**fault_env("record", FEDBAYES_RECORD_DIR=str(seen))),
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == [1, 2] and [row["clients"] for row in rows] == [3, 3], rows
    assert rows[-1]["accuracy"] > 0.3 and rows[-1]["memory_points"] > 3  # chance is 0.1; 2 points per class held
    checkpoint = load_file(CheckpointStore(workdir / "server-state", "func", {}).path)
    held = {
        name: value.reshape(len(value), -1)
        for name, value in checkpoint.items()
        if name.startswith("strategy/memory/") and name.endswith("/inputs")
    }
    assert sorted(held) == [f"strategy/memory/client-{index}/inputs" for index in range(3)]
    assert sum(len(inputs) for inputs in held.values()) == rows[-1]["memory_points"]
    records = sorted(seen.glob("*.npz"))
    assert [path.name for path in records] == [f"client-{i}-round-{r}.npz" for i in range(3) for r in (1, 2)]
    for path in records:
        record = np.load(path)
        envelope = pb.Instruction.FromString(record["envelope"].tobytes())
        message = pb.FedLapFuncInstruction()
        assert envelope.body.Unpack(message), path.name
        assert tensor_group_fields(pb.FedLapFuncInstruction) == ["global_mean"] and not envelope.buffers.tensors
        packed = record["packed"]
        assert len(packed) == sum(math.prod(spec.shape) for spec in message.global_mean.tensors)  # w_g alone
        for name, inputs in held.items():
            assert not any(contains_run(packed, row) for row in inputs), (path.name, name)
