"""Test-only fault injection into the ClientApps of one SuperNode: put this folder on that SuperNode's PYTHONPATH
with FEDBAYES_FAULT set (tests/support/processes.py fault_env). Its ClientApps inherit the environment, as fresh
`flwr-clientapp` processes or as forks of its `fedbayes superexec`, which then holds the patched modules for them;
the ServerApp and the daemons run unchanged. Nothing in fedbayes knows about this.

  nan       every reply's tensors are NaN
  raise     every FedAvg client half raises
  stall     the ClientApp stops in each round listed in $FEDBAYES_STALL_ROUNDS ("1,3") after touching
            <$FEDBAYES_STALL_MARKER>-r<round>: for good (to be killed), or, with $FEDBAYES_STALL_RELEASE, until
            <$FEDBAYES_STALL_RELEASE>-r<round> exists (to hold the round open)
  rogue     the client turns hostile as $FEDBAYES_ROGUE_ATTACK says:
              spoof:<id>  every reply claims to come from client <id>
              sybil       every reply claims a new client id (<own id>-r<round>)
              dtype       every reply's packed tensors are declared float32 but hold unicode .npy bytes
              examples    every reply claims 2^64 - 1 examples
              late:<r>    the reply of round <r> is honest but sent after $FEDBAYES_ROGUE_DELAY seconds
              replay      the reply of round 1 is honest and recorded in $FEDBAYES_ROGUE_RECORD; every later reply is
                          that recording sent again, its round edited to the current one
              mean-scale:<f>  BayesADMM: the local posterior's mean is multiplied by <f> before the client's own dual
                          step, so the reply is well-formed and its duals agree with the server's replay
              pad:<MiB>   every reply carries <MiB> MiB of random float32 more (a record of its own), past the client's
                          own size check
  record    no fault: every instruction a client half receives is written, as it arrived, to
            $FEDBAYES_RECORD_DIR/<client id>-round-<r>.npz (`packed`: its one float32 Array of tensors; `envelope`: its
            serialized Instruction), so a test can see everything that reached the client
"""

import os
import sys


def in_a_clientapp() -> bool:
    return bool(sys.argv) and (sys.argv[0].endswith("flwr-clientapp") or sys.argv[1:2] == ["superexec"])


def inject_nan() -> None:
    import numpy as np

    import fedbayes.client.core as core
    from fedbayes.protos.codec import encode

    def poisoned_encode(envelope, message, tensors):
        tensors = {
            group: {name: np.full_like(v, np.nan) for name, v in arrays.items()} for group, arrays in tensors.items()
        }
        return encode(envelope, message, tensors)

    core.encode = poisoned_encode  # the client's round core encodes every strategy's reply


def inject_raise() -> None:
    import fedbayes.strategies.fedavg.client as fedavg

    def failing_local_update(local):
        raise RuntimeError("injected fault: this client cannot train")

    fedavg.client_update = fedavg.ClientHalf(
        fedavg.client_update.instruction_type, failing_local_update, fedavg.client_update.layouts
    )


def inject_stall() -> None:
    import time
    from pathlib import Path

    from fedbayes.client.state import ClientStateStore

    stall_rounds = {int(r) for r in os.environ["FEDBAYES_STALL_ROUNDS"].split(",")}
    release = os.environ.get("FEDBAYES_STALL_RELEASE")
    load_state = ClientStateStore.load

    def load_or_stall(self, accepted_round, for_round):
        if for_round in stall_rounds:
            Path(f"{os.environ['FEDBAYES_STALL_MARKER']}-r{for_round}").touch()
            while release is None or not Path(f"{release}-r{for_round}").exists():
                time.sleep(0.1)
        return load_state(self, accepted_round, for_round)

    ClientStateStore.load = load_or_stall


def inject_rogue() -> None:
    import io
    import time

    import numpy as np
    from flwr.app import Array, ArrayRecord, RecordDict

    import fedbayes.client.core as core
    from fedbayes.protos import payloads_pb2 as pb
    from fedbayes.protos.codec import ENVELOPE_KEY, PACKED_ARRAY, TENSORS_KEY, encode, with_envelope

    attack = os.environ["FEDBAYES_ROGUE_ATTACK"]

    def unicode_bytes(shape):
        buffer = io.BytesIO()
        np.save(buffer, np.full(shape, "x"), allow_pickle=False)
        return buffer.getvalue()

    def hostile_encode(envelope, message, tensors):
        header = envelope.header
        if attack.startswith("spoof:"):
            header.client_id = attack.removeprefix("spoof:")
        elif attack == "sybil":
            header.client_id = f"{header.client_id}-r{header.server_round}"
        elif attack == "examples":
            envelope.num_examples = 2**64 - 1
        elif attack.startswith("late:") and header.server_round == int(attack.removeprefix("late:")):
            time.sleep(float(os.environ["FEDBAYES_ROGUE_DELAY"]))
        content = encode(envelope, message, tensors)
        if attack == "replay":
            content = replayed(content, header.server_round)
        if attack.startswith("pad:"):
            floats = int(float(attack.removeprefix("pad:")) * 2**20) // 4
            padding = np.random.default_rng(0).standard_normal(floats, dtype=np.float32)  # random: no chunk dedup
            content["padding"] = ArrayRecord({"x": Array(padding)})
        if attack == "dtype":
            group = next(iter(content.array_records))
            arrays = dict(content.array_records[group].items())
            name = next(iter(arrays))
            shape = tuple(arrays[name].shape)
            arrays[name] = Array(dtype="float32", shape=shape, stype="numpy.ndarray", data=unicode_bytes(shape))
            content[group] = ArrayRecord(arrays)
        return content

    def replayed(content, server_round):
        """Round 1's reply recorded as it is sent (each ClientApp is a process of its own: on disk); later rounds'
        replaced by it, its round edited to theirs."""
        record = os.environ["FEDBAYES_ROGUE_RECORD"]
        if server_round == 1:
            envelope = np.frombuffer(content.config_records[ENVELOPE_KEY]["message"], np.uint8)
            with open(record, "wb") as file:
                np.savez(file, envelope=envelope, tensors=content[TENSORS_KEY][PACKED_ARRAY].numpy())
            return content
        with np.load(record) as recorded:
            envelope = pb.Reply.FromString(recorded["envelope"].tobytes())
            tensors = recorded["tensors"]
        envelope.header.server_round = server_round
        return with_envelope(RecordDict({TENSORS_KEY: ArrayRecord({PACKED_ARRAY: Array(tensors)})}), envelope)

    core.encode = hostile_encode  # the client's round core encodes every strategy's reply
    if attack.startswith("pad:"):
        import fedbayes.protos.codec as codec

        codec.check_payload_size = lambda *args, **kwargs: None  # before client.app imports it

    if attack.startswith("mean-scale:"):
        import fedbayes.strategies.bayesadmm.client as bayesadmm

        honest_training = bayesadmm._train_ivon

        def scaled_training(*args, **kwargs):
            local, loss_and_seconds, state = honest_training(*args, **kwargs)
            scaled = bayesadmm.Gaussian(local.mean * float(attack.removeprefix("mean-scale:")), local.precision)
            return scaled, loss_and_seconds, state

        bayesadmm._train_ivon = scaled_training  # local_update looks it up at each call


def inject_record() -> None:
    from pathlib import Path

    import numpy as np

    from fedbayes.client.core import ClientHalf
    from fedbayes.protos.codec import ENVELOPE_KEY, PACKED_ARRAY, TENSORS_KEY, decode_header

    directory = Path(os.environ["FEDBAYES_RECORD_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    answer = ClientHalf.__call__

    def recording_answer(self, content, runtime):
        round_ = decode_header(content, sender="server").server_round
        envelope = content.config_records[ENVELOPE_KEY]["message"]
        np.savez(
            directory / f"{runtime.node.client_id}-round-{round_}.npz",
            packed=content.array_records[TENSORS_KEY][PACKED_ARRAY].numpy(),
            envelope=np.frombuffer(envelope, dtype=np.uint8),
        )
        return answer(self, content, runtime)

    ClientHalf.__call__ = recording_answer  # every strategy's client half is a ClientHalf


FAULTS = {
    "nan": inject_nan,
    "raise": inject_raise,
    "stall": inject_stall,
    "rogue": inject_rogue,
    "record": inject_record,
}

if in_a_clientapp() and os.environ.get("FEDBAYES_FAULT"):
    FAULTS[os.environ["FEDBAYES_FAULT"]]()
