"""Calls that climb back up the layers during one round: how often a lower layer calls into a higher one.

Runs one strategy for 2 rounds with 3 in-process clients (the harness of benchmarks/determinism.py) and, during round
2, counts with sys.setprofile every call from a fedbayes module into a module of a higher layer:

    bayes < protos < tasks < a strategy's math and settings < a strategy's halves, base, the registry
          < client, server, posterior < deploy

A hook the round core calls on a strategy goes down; a strategy calling back into the core, or the codec calling a
function the client handed it, goes up. Prints the total and each (caller -> callee) module pair.

    python benchmarks/layer_calls.py                          # this checkout
    python benchmarks/layer_calls.py --checkout /tmp/old      # another worktree: git worktree add /tmp/old f7b3c0e
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

LAYERS = {"bayes": 0, "protos": 1, "tasks": 2, "client": 5, "server": 5, "posterior": 5, "deploy": 6}


def layer(module: str) -> int | None:
    """The layer of a fedbayes module (by its name with or without the `fedbayes.` prefix); None for any other."""
    parts = module.removeprefix("fedbayes.").split(".")
    if parts[0] == "strategies":
        return 3 if parts[-1] in ("math", "settings") else 4
    return LAYERS.get(parts[0])


def count_upward_calls(strategy: str, overrides: dict[str, Any]) -> collections.Counter[tuple[str, str]]:
    from flwr.supercore.task_identity import TaskIdentity

    try:
        from tests.support import InProcessFederation
    except ImportError:  # checkouts before the tests were tiered
        from tests.inprocess import InProcessFederation  # type: ignore[no-redef]

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    calls: collections.Counter[tuple[str, str]] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
        callee_layer, caller_layer = layer(callee), layer(caller)
        if caller_layer is not None and callee_layer is not None and callee_layer > caller_layer:
            calls[(caller.removeprefix("fedbayes."), callee.removeprefix("fedbayes."))] += 1

    with tempfile.TemporaryDirectory() as scratch:
        federation = InProcessFederation(Path(scratch), {"strategy": strategy, "lr": 0.05, **overrides}, [40, 60, 80])
        federation.round(1, [1, 2, 3])
        sys.setprofile(profile)
        try:
            federation.round(2, [1, 2, 3])
        finally:
            sys.setprofile(None)
    return calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--strategy", default="bayesadmm")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    calls = count_upward_calls(args.strategy, {"local-epochs": 2} if args.strategy == "bayesadmm" else {})
    print(f"{args.strategy}, round 2, {checkout}: {sum(calls.values())} upward calls on {len(calls)} module pairs")
    for (caller, callee), count in calls.most_common():
        print(f"  {count:>5}  {caller} -> {callee}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
