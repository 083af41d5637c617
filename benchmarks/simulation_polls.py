"""The simulation engine's instruction polls (fedbayes.flowerseam.simulation_polls): what one sweep costs with Flower
1.39's `InMemoryLinkState.get_message_ins` and with ours.

Flower's engine asks for every node's next instruction, one node after the other, then waits 0.1 s. While a round
trains, each node's instruction is stored and already delivered, so every ask finds nothing. This builds that state
(tests/support/linkstate.py: a link state set up as the engine sets one up, N nodes with one delivered instruction
each), times sweeps with each method, and prints ms per sweep and the share of a core the polling thread then takes
(sweep / (sweep + 0.1 s)).

    python benchmarks/simulation_polls.py --nodes 20 100 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.flowerseam.simulation_polls import check_only_own_messages
from tests.support.linkstate import simulated_link

ENGINE_WAIT = 0.1  # seconds the engine waits between sweeps (flwr/server/superlink/fleet/vce/vce_api.py)


def seconds_per_sweep(nodes: int, ours: bool, repeats: int) -> float:
    grid, node_ids = simulated_link(nodes, [(node, 0.0) for node in range(nodes)])
    if ours:
        assert check_only_own_messages(grid)
    for node_id in node_ids:  # the round's first sweep delivers every instruction
        assert len(grid.state.get_message_ins(node_id=node_id, limit=1)) == 1
    started = time.perf_counter()
    for _ in range(repeats):
        for node_id in node_ids:
            assert grid.state.get_message_ins(node_id=node_id, limit=1) == []
    return (time.perf_counter() - started) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--seconds", type=float, default=2.0, help="about how long to time each method per size")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")
    print(f"{'nodes':>6} {'Flower ms/sweep':>16} {'ours ms/sweep':>14} {'Flower core %':>14} {'ours core %':>12}")
    for nodes in args.nodes:
        probe = seconds_per_sweep(nodes, ours=False, repeats=1)
        repeats = max(1, int(args.seconds / max(probe, 1e-4)))
        flower, ours = (seconds_per_sweep(nodes, ours, repeats) for ours in (False, True))
        share = [100 * sweep / (sweep + ENGINE_WAIT) for sweep in (flower, ours)]
        print(f"{nodes:>6} {flower * 1e3:>16.2f} {ours * 1e3:>14.2f} {share[0]:>14.1f} {share[1]:>12.1f}")
    print(f"load average after: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main()
