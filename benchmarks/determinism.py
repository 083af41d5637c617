"""Per-round numbers of short deterministic runs of every strategy, to show that a refactor changed no number.

Each strategy runs 4 rounds with 3 in-process clients (real encoded payloads, durable client stores; the
harness of tests/support InProcessFederation) on synthetic logistic-regression data. Per round it prints the
training loss and a SHA-256 of the global arrays, bit for bit.

    python benchmarks/determinism.py --write before.json        # on the old code
    python benchmarks/determinism.py --compare before.json      # on the new code: exits 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flwr.supercore.task_identity import TaskIdentity

from tests.support import InProcessFederation

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # what a ServerApp run would set

RUNS = {
    "fedavg": {},
    "fedprox": {},
    "feddyn": {"feddyn-alpha": 0.1},
    "fedlap": {},
    "fedlap-cov": {},
    "bayesadmm": {"local-epochs": 2},
    "fedadmm": {},
    "bayesadmm-full": {},
    "fedpa": {"burn-in-rounds": 2, "samples": 2},
    "dsvgd": {"particles": 4, "local-steps": 5, "distill-steps": 5},
    "p-dsvgd": {"particles": 4, "local-steps": 5, "distill-steps": 5, "server-steps": 5},
    "u-dsvgd": {"particles": 4, "local-steps": 5, "distill-steps": 5},
}
ROUNDS = 4


def digest(arrays) -> str:
    sha = hashlib.sha256()
    for name in sorted(arrays.keys()):
        sha.update(name.encode())
        sha.update(np.ascontiguousarray(arrays[name].numpy()).tobytes())
    return sha.hexdigest()[:16]


def run(strategy: str, overrides: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        federation = InProcessFederation(Path(tmp), {"strategy": strategy, "lr": 0.05, **overrides}, [40, 60, 80])
        rows = []
        for server_round in range(1, ROUNDS + 1):
            metrics = federation.round(server_round, [1, 2, 3], return_metrics=True)
            rows.append(
                {
                    "round": server_round,
                    "train-loss": metrics.get("train-loss") if metrics else None,
                    "arrays": digest(federation.arrays),
                }
            )
        return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, help="save the numbers as JSON")
    parser.add_argument("--compare", type=Path, help="compare with numbers saved by --write; exit 1 if any differs")
    parser.add_argument("--strategies", nargs="+", choices=list(RUNS), default=list(RUNS))
    args = parser.parse_args()
    results = {strategy: run(strategy, RUNS[strategy]) for strategy in args.strategies}
    saved = json.loads(args.compare.read_text()) if args.compare else None
    print(f"{'strategy':<14} {'round':>5} {'train-loss':>22} {'arrays sha256':>17}  same")
    differ = 0
    for strategy, rows in results.items():
        for row in rows:
            same = (
                ""
                if saved is None
                else ("yes" if saved.get(strategy, [None] * ROUNDS)[row["round"] - 1] == row else "NO")
            )
            differ += same == "NO"
            print(f"{strategy:<14} {row['round']:>5} {row['train-loss']!r:>22} {row['arrays']:>17}  {same}")
    if args.write:
        args.write.write_text(json.dumps(results, indent=1))
    if saved is not None:
        print(f"{differ} of {sum(map(len, results.values()))} rows differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
