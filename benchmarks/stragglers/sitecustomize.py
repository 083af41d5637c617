"""Benchmark-only (benchmarks/stragglers.py): the ClientApps of the SuperNode that has this directory on its
PYTHONPATH are FEDBAYES_SLOW_FACTOR times slower than their data explains: after each round's computation, once they
have given back their compute slot (tasks/slots.py), they sleep (factor - 1) times the seconds they computed, as a
client on a slow machine or link would; no other client waits for its slot meanwhile. Loaded by its
`fedbayes superexec`, whose forks inherit the patch."""

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
            started = time.monotonic()
            yield
            computed = time.monotonic() - started
        time.sleep((float(os.environ["FEDBAYES_SLOW_FACTOR"]) - 1) * computed)

    app.compute_slot = slot_then_sleep  # train() looks it up at each call
