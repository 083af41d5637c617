"""Attack -> outcome for every strategy: the red team's well-formed attacks, in one process, through the real
server halves and client halves (tests/support InProcessFederation: 3 logistic-regression clients of 12/30/20
synthetic points).

Each cell runs round 1 honestly, then `ROGUE_ROUNDS` rounds in which client-1 (node 1, a registered client) sends
the attack and clients 2-3 stay honest (DSVGD and U-DSVGD schedule one client a round: every round the rogue is
scheduled it attacks). It reports whether every round was committed from the honest clients, whether the run is
still going (the global state finite, no RunFailed: a round with no accepted reply counts towards
max-failed-rounds in a row stop a run), whether the rogue was quarantined, and the first refusal's reason.

    python benchmarks/attack_matrix.py [--out benchmarks/results/attack_matrix.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from flwr.app import Error
from flwr.supercore.task_identity import TaskIdentity

from fedbayes.protos.codec import encode
from fedbayes.strategies.feddyn.client import LAMBDA_KEY
from tests.support import FakeGrid, InProcessFederation, declared_payload, reply_message, rogue
from tests.support.rogue import SIZES, UPDATE_GROUP, overrides

ROGUE_ROUNDS = 4
MAX_FAILED_ROUNDS = 3  # the run-config default
STRATEGIES = [
    "fedavg",
    "fedprox",
    "bayesadmm",
    "fedadmm",
    "bayesadmm-full",
    "feddyn",
    "fedlap",
    "fedlap-cov",
    "fedpa",
    "dsvgd",
    "p-dsvgd",
    "u-dsvgd",
]


def _dual_shift(group: str, name: str, array: np.ndarray) -> np.ndarray:
    """One local precision entry of 3e38 (its duals recomputed), then one dual entry far from the replay."""
    array = array.copy()
    if group == "local_precision":
        array.flat[0] = 3e38
    return array


ATTACKS = {
    # name: (client-1's change to its reply's tensors, given the strategy; extra run config; the strategies)
    "update of 1e38": (lambda strategy: rogue.filled(UPDATE_GROUP[strategy], 1e38), {}, STRATEGIES),
    "update of 1e30": (lambda strategy: rogue.filled(UPDATE_GROUP[strategy], 1e30), {}, STRATEGIES),
    "update x 1e6": ("scaled", {}, STRATEGIES),
    # The screen turned off: what the isolation (nothing unusable is committed) catches on its own.
    "3.4e38, screen-ratio=1e300": (
        lambda strategy: rogue.filled(UPDATE_GROUP[strategy], 3.4e38),
        {"screen-ratio": 1e300, "prior-precision": 0.5, "server-lr": 10.0},
        STRATEGIES,
    ),
    "dual shifted (1 entry 3e38)": (lambda strategy: _dual_shift, {}, ["bayesadmm", "bayesadmm-full"]),
    "lambda x 1000 in its store": (None, {}, ["feddyn"]),
}


def rogue_reply(federation: InProcessFederation, content, attack: str, server_round: int):
    """client-1's reply as the attack makes it (tests/support/rogue.py: consistent with what the server replays)."""
    server, strategy = federation.server, federation.settings.strategy
    make = ATTACKS[attack][0]
    if make == "scaled":
        reference = rogue.sent_reference(server, federation.layout, "client-1")
        change = rogue.scaled_update(reference, UPDATE_GROUP[strategy], 1e6)
    else:
        change = make(strategy)
    content = rogue.consistent_reply(server, content, change, server_round)
    if change is _dual_shift:  # after the duals were made to agree with it: one is moved
        payload = declared_payload(content, server.reply_type)
        first = next(iter(payload.tensors["dual_mean"]))
        payload.tensors["dual_mean"][first] = payload.tensors["dual_mean"][first].copy()
        payload.tensors["dual_mean"][first].flat[1] += 1e3
        content = encode(payload.envelope, payload.message, payload.tensors)
    return content


def run_cell(strategy: str, attack: str, root: Path) -> dict:
    make, extra, _ = ATTACKS[attack]
    federation = InProcessFederation(root, {**overrides(strategy), "fraction-train": 1.0, **extra}, sizes=SIZES)
    core, nodes = federation.core, [1, 2, 3]
    federation.round(1, nodes)
    outcome = {"strategy": strategy, "attack": attack, "rounds": [], "reason": ""}
    for server_round in range(2, 2 + ROGUE_ROUNDS):
        if make is None and server_round == 2:  # the client's own durable λ_k is edited between rounds
            store = federation.runtimes[1].state_store("fed")
            state = store.load(core.accepted_rounds["client-1"], for_round=server_round)
            state.tensors[LAMBDA_KEY] = state.tensors[LAMBDA_KEY] * 1000
            store.save(state, core.accepted_rounds["client-1"], accepted_round=core.accepted_rounds["client-1"])
        plan = core.configure(server_round, federation.arrays, FakeGrid(nodes))
        messages = plan.messages
        replies, rogue_sent = [], False
        for message in messages:
            node = message.metadata.dst_node_id
            rogue_sent = rogue_sent or node == 1
            try:
                content = federation.client_update(message.content, federation.runtimes[node])
            except Exception as error:  # a client whose training fails replies with an error, as a ClientApp does
                replies.append(reply_message(None, node, Error(code=0, reason=f"{type(error).__name__}: {error}")))
                continue
            if node == 1 and make is not None:
                content = rogue_reply(federation, content, attack, server_round)
            replies.append(reply_message(content, node))
        aggregated = core.aggregate(plan, replies)
        federation.arrays = aggregated.arrays if aggregated.arrays is not None else federation.arrays
        report = aggregated.report
        honest = sorted(c for c in report.accepted if c != "client-1")
        rogue_label = "client 'client-1' (node 1)"
        if rogue_label in report.rejected and not outcome["reason"]:
            outcome["reason"] = report.rejected[rogue_label]
        outcome["rounds"].append(
            {
                "round": server_round,
                "sent_to_rogue": rogue_sent,
                "rogue_accepted": "client-1" in report.accepted,
                "honest_accepted": honest,
                "quarantined": sorted(report.quarantined),
                "finite": all(np.isfinite(federation.arrays[name].numpy()).all() for name in federation.arrays),
            }
        )
    rounds = outcome["rounds"]
    attacked = [r for r in rounds if r["sent_to_rogue"]]
    outcome["honest_committed"] = (
        all(r["honest_accepted"] for r in rounds)
        if len(messages) > 1
        else all(r["honest_accepted"] or r["sent_to_rogue"] for r in rounds)
    )
    outcome["rogue_refused"] = all(not r["rogue_accepted"] for r in attacked)
    outcome["run_going"] = all(r["finite"] for r in rounds) and longest_idle_streak(rounds) < MAX_FAILED_ROUNDS
    outcome["quarantined"] = any(r["quarantined"] for r in rounds)
    return outcome


def longest_idle_streak(rounds: list[dict]) -> int:
    """The most rounds in a row that accepted no reply (max-failed-rounds of them stop a run)."""
    longest = streak = 0
    for entry in rounds:
        streak = 0 if entry["honest_accepted"] or entry["rogue_accepted"] else streak + 1
        longest = max(longest, streak)
    return longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/attack_matrix.json"))
    args = parser.parse_args()
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # Messages outside a Flower run
    import logging

    logging.getLogger("flwr").setLevel(logging.ERROR)
    outcomes = []
    with TemporaryDirectory() as scratch:
        for attack, (_, _, strategies) in ATTACKS.items():
            for strategy in strategies:
                outcomes.append(run_cell(strategy, attack, Path(scratch) / f"{strategy}-{len(outcomes)}"))
                print(f"{attack} / {strategy}: done", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(outcomes, indent=1))
    yes = {True: "yes", False: "NO"}
    print("| attack | strategy | rogue refused | honest rounds committed | run going | quarantined | first reason |")
    print("|---|---|---|---|---|---|---|")
    for o in outcomes:
        reason = o["reason"].replace("|", "/")[:90]
        print(
            f"| {o['attack']} | {o['strategy']} | {yes[o['rogue_refused']]} | {yes[o['honest_committed']]} | "
            f"{yes[o['run_going']]} | {'yes' if o['quarantined'] else 'no'} | {reason} |"
        )


if __name__ == "__main__":
    main()
