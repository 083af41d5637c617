"""Test-only: the ClientApp of one SuperNode stops in round $FEDBAYES_STALL_ROUND after touching the file
$FEDBAYES_STALL_MARKER, so a test knows that client is mid-round: it hangs there for good (to be killed),
or, with $FEDBAYES_STALL_RELEASE set, until that file exists (to hold the round open).

Put on PYTHONPATH of that SuperNode only (see fault_injection/sitecustomize.py for how the patched module
reaches its ClientApps). Nothing in the production code knows about this.
"""

import os
import sys
import time

if sys.argv and (sys.argv[0].endswith("flwr-clientapp") or sys.argv[1:2] == ["superexec"]):
    from pathlib import Path

    from client.state import ClientStateStore

    stall_round = int(os.environ["FEDBAYES_STALL_ROUND"])
    release = os.environ.get("FEDBAYES_STALL_RELEASE")
    load_state = ClientStateStore.load

    def load_or_stall(self, before_round=None):
        if before_round == stall_round:
            Path(os.environ["FEDBAYES_STALL_MARKER"]).touch()
            while release is None or not Path(release).exists():
                time.sleep(0.1)
        return load_state(self, before_round)

    ClientStateStore.load = load_or_stall
