"""Seconds per round of Flower's Ray simulation with many virtual clients (the README's simulation command).

For each number of virtual clients N (`--clients`, default 100 and 1000) this runs `fedbayes run <repo> local
--federation-config num-supernodes=N` with logistic regression, `fraction-train` 0.1 (N/10 clients train each
round), FedAvg, 1 local epoch, on `--fraction` of FMNIST split iid over the N clients, for `--rounds` rounds, and
reads the rows the ServerApp writes: round_s (push .. evaluation, server/loop.py) per round, and the whole
command's wall time (Ray and the simulation SuperLink's start-up and shut-down included). `fedbayes run` stops
everything it started; the script checks that no process of the run's FLWR_HOME is left.

Run:  python benchmarks/simulation_scale.py [--clients 100 1000 --rounds 3]
Writes benchmarks/results/simulation_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.environment import DEFAULTS
from tests.support.processes import processes_with_env

OUTPUT = REPO / "benchmarks" / "results" / "simulation_scale.json"


def run_simulation(clients: int, rounds: int, fraction: float, root: Path) -> dict:
    results, home = root / f"sim-{clients}.jsonl", root / f"home-{clients}"
    config = (
        f'num-server-rounds={rounds} fraction={fraction} model="logreg" fraction-train=0.1 '
        f'results-path="{results}" server-state-dir="{root / "server-state"}"'
    )
    command = [
        str(Path(sys.executable).with_name("fedbayes")),
        "run",
        str(REPO),
        "local",
        "--stream",
        "--federation-config",
        f"num-supernodes={clients}",
        "-c",
        config,
    ]
    env = {**os.environ, **DEFAULTS, "FLWR_HOME": str(home)}
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"simulation with {clients} clients failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    steady = [row["round_seconds"] for row in rows[1:]] or [rows[0]["round_seconds"]]
    return {
        "clients": clients,
        "rounds": len(rows),
        "clients_per_round": [row["clients_sent"] for row in rows],
        "round_seconds": [row["round_seconds"] for row in rows],
        "median_round_seconds_2_n": statistics.median(steady),
        "command_wall_seconds": wall,
        "left_behind": processes_with_env("FLWR_HOME", str(home)),
        "final_accuracy": rows[-1]["accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=1.0, help="of FMNIST, split iid over the clients")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="fedbayes-simscale-") as tmp:
        for clients in args.clients:
            runs.append(run_simulation(clients, args.rounds, args.fraction, Path(tmp)))
            r = runs[-1]
            print(
                f"{clients:>5} virtual clients ({r['clients_per_round'][0]} per round): round_s "
                f"{' '.join(f'{s:.1f}' for s in r['round_seconds'])}; median of rounds 2..N "
                f"{r['median_round_seconds_2_n']:.1f} s; whole command {r['command_wall_seconds']:.0f} s; "
                f"processes left: {len(r['left_behind'])}",
                flush=True,
            )
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(
        json.dumps(
            {
                "benchmark": "simulation_scale",
                "load_average_at_start": load,
                "load_average_at_end": os.getloadavg(),
                "settings": vars(args),
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
