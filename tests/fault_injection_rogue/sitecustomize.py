"""Test-only: the ClientApp of one SuperNode turns hostile, as $FEDBAYES_ROGUE_ATTACK says:
  spoof:<id>  every reply claims to come from client <id>
  sybil       every reply claims a new client id (<own id>-r<round>)
  dtype       every reply's packed tensors are declared float32 but hold unicode .npy bytes
  examples    every reply claims 2^64 - 1 examples
  late:<r>    the reply of round <r> is honest but sent after $FEDBAYES_ROGUE_DELAY seconds (past round-timeout)
  mean-scale:<f>  BayesADMM: the local posterior's mean is multiplied by <f> before the client's own dual step, so
              the reply is well-formed and its duals agree with the server's replay (only the screen can stop it)

Put on PYTHONPATH of that SuperNode only (see fault_injection/sitecustomize.py for how the patched module
reaches its ClientApps). Nothing in the production code knows about this.
"""

import os
import sys

if sys.argv and (sys.argv[0].endswith("flwr-clientapp") or sys.argv[1:2] == ["superexec"]):
    import io
    import time

    import numpy as np
    from flwr.app import Array, ArrayRecord

    import fedbayes.client.core as core
    from fedbayes.protos.codec import encode

    attack = os.environ["FEDBAYES_ROGUE_ATTACK"]

    def unicode_bytes(shape):
        buffer = io.BytesIO()
        np.save(buffer, np.full(shape, "x"), allow_pickle=False)
        return buffer.getvalue()

    def hostile_encode(message, tensors):
        header = message.header
        if attack.startswith("spoof:"):
            header.client_id = attack.removeprefix("spoof:")
        elif attack == "sybil":
            header.client_id = f"{header.client_id}-r{header.server_round}"
        elif attack == "examples":
            message.num_examples = 2**64 - 1
        elif attack.startswith("late:") and header.server_round == int(attack.removeprefix("late:")):
            time.sleep(float(os.environ["FEDBAYES_ROGUE_DELAY"]))
        content = encode(message, tensors)
        if attack == "dtype":
            group = next(iter(content.array_records))
            arrays = dict(content.array_records[group].items())
            name = next(iter(arrays))
            shape = tuple(arrays[name].shape)
            arrays[name] = Array(dtype="float32", shape=shape, stype="numpy.ndarray", data=unicode_bytes(shape))
            content[group] = ArrayRecord(arrays)
        return content

    core.encode = hostile_encode  # the client's round core encodes every strategy's reply

    if attack.startswith("mean-scale:"):
        import fedbayes.strategies.bayesadmm as bayesadmm

        honest_training = bayesadmm._train_ivon

        def scaled_training(*args, **kwargs):
            local, loss_and_seconds, state = honest_training(*args, **kwargs)
            scaled = bayesadmm.Gaussian(local.mean * float(attack.removeprefix("mean-scale:")), local.precision)
            return scaled, loss_and_seconds, state

        bayesadmm._train_ivon = scaled_training  # local_update looks it up at each call
