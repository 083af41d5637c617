"""Test-only: makes the ClientApp of one SuperNode send NaN weights.

Put on PYTHONPATH of that SuperNode only; its ClientApp processes inherit the environment: either
fresh `flwr-clientapp` processes, or forks of its `fedbayes superexec`, which then holds the patched
module for them. Nothing in the production code knows about this.
"""

import sys

if sys.argv and (sys.argv[0].endswith("flwr-clientapp") or sys.argv[1:2] == ["superexec"]):
    import numpy as np

    import fedbayes.client.core as core
    from fedbayes.protos.codec import encode

    def poisoned_encode(message, tensors):
        tensors = {group: {name: np.full_like(v, np.nan) for name, v in arrays.items()} for group, arrays in tensors.items()}
        return encode(message, tensors)

    core.encode = poisoned_encode  # the client's round core encodes every strategy's reply
