"""Test-only: the ClientApp of one SuperNode stops in each round listed in $FEDBAYES_STALL_ROUNDS
("1,3") after touching <$FEDBAYES_STALL_MARKER>-r<round>, so a test knows that client is mid-round:
it hangs there for good (to be killed), or, with $FEDBAYES_STALL_RELEASE set, until
<$FEDBAYES_STALL_RELEASE>-r<round> exists (to hold the round open).

Put on PYTHONPATH of that SuperNode only (see fault_injection/sitecustomize.py for how the patched module
reaches its ClientApps). Nothing in the production code knows about this.
"""

import os
import sys
import time

if sys.argv and (sys.argv[0].endswith("flwr-clientapp") or sys.argv[1:2] == ["superexec"]):
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
