"""Benchmark-only (benchmarks/oversize_reply.py): the ClientApp of the SuperNode that has this directory on
its PYTHONPATH sends a FedAvg reply padded with FEDBAYES_PADDING_MB MiB of random float32, and skips the
honest client's own size check. Loaded by its `fedbayes superexec`, whose forks inherit the patches."""

import os
import sys

if sys.argv[1:2] == ["superexec"]:
    import numpy as np
    from flwr.app import Array, ArrayRecord

    import fedbayes.client.core as core
    import fedbayes.protos.codec as codec

    def padded_encode(*args, **kwargs):
        content = codec.encode(*args, **kwargs)
        floats = int(float(os.environ["FEDBAYES_PADDING_MB"]) * 2**20) // 4
        padding = np.random.default_rng(0).standard_normal(floats, dtype=np.float32)  # random: no chunk dedup
        content["padding"] = ArrayRecord({"x": Array(padding)})
        return content

    codec.check_payload_size = lambda *args, **kwargs: None  # before client.app imports it
    core.encode = padded_encode
