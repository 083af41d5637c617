"""Benchmark-only (benchmarks/stragglers.py): the ClientApps of the SuperNode that has this directory on its
PYTHONPATH sleep FEDBAYES_SLOW_SECONDS after each round's computation, once they have given back their compute slot
(tasks/slots.py), as a client on a slow machine or link would: its reply comes late, and no other client waits for
its slot meanwhile. Loaded by its `fedbayes superexec`, whose forks inherit the patch."""

import os
import sys

if sys.argv[1:2] == ["superexec"]:
    import contextlib
    import time

    import fedbayes.client.app as app

    compute_slot = app.compute_slot

    @contextlib.contextmanager
    def slot_then_sleep():
        with compute_slot():
            yield
        time.sleep(float(os.environ["FEDBAYES_SLOW_SECONDS"]))

    app.compute_slot = slot_then_sleep  # train() looks it up at each call
