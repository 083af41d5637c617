"""Stragglers: how long rounds take, and whose replies a `straggler-wait` cuts, on heterogeneous federations.

`run` runs one federation as `fedbayes local` does (FMNIST, `--fraction`, `--clients`, a Dirichlet split by default),
optionally with one slow client: its ClientApp sleeps `--slow-seconds` after each round's computation, once it has
given back its compute slot, as a client on a slow machine or link would (benchmarks/stragglers/sitecustomize.py). It
writes the results rows with each client's example count (from the split) to `--out`:

    python benchmarks/stragglers.py run --strategy fedavg --seed 0 --rounds 5 --set straggler-wait=0 --out F.json
    python benchmarks/stragglers.py run ... --slow-client 3 --slow-seconds 60 --out F.json

`table` prints, per run, its rounds' seconds and the replies cut; and, for a run with straggler-wait=0 (nothing cut,
every reply's arrival time recorded: the row's `reply_seconds`), what each `--waits` would have cut and how long its
rounds would have taken, under the plain multiple (the round ends (1 + w) x the time half the replies took after it
started) and under the server's rule (`server/loop.py` `straggler_deadlines`: that allowance scaled by each client's
examples against the median of the replies in by then, a client of unknown size waited for once):

    python benchmarks/stragglers.py table F.json ... [--waits 1,2,3,5]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SLOW_ENV = "FEDBAYES_SLOW_SECONDS"
CUT = re.compile(r"no reply within ([0-9.]+) s: straggler-wait")  # server/loop.py Stragglers.why


def partition_sizes(clients: int, fraction: float, split: str, seed: int) -> dict[str, int]:
    """Each client's example count, as `fedbayes partitions` prints it: client id -> examples."""
    from fedbayes.deploy.processes import console_script

    printed = subprocess.run(
        [
            console_script("fedbayes"),
            "partitions",
            "--clients",
            str(clients),
            "--fraction",
            str(fraction),
            "--split",
            split,
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [line.split() for line in printed.splitlines() if re.match(r"\s*\d+\s", line)]
    return {f"client-{int(row[0])}": int(row[1]) for row in rows}


def run(args: argparse.Namespace) -> None:
    from fedbayes.deploy.launcher import LocalFederation, LocalRun, check_run_config, parse_override

    workdir = args.workdir.resolve()
    results = workdir / "results.jsonl"
    spec = LocalRun(
        args.strategy,
        args.clients,
        args.rounds,
        fraction=args.fraction,
        split=args.split,
        seed=args.seed,
        overrides=dict(parse_override(text) for text in args.set),
    )
    config = spec.run_config(workdir, results)
    settings = check_run_config(config, args.clients)
    examples = partition_sizes(args.clients, args.fraction, args.split, args.seed)
    with LocalFederation(workdir, preload_supernodes=True, max_message_mb=settings.max_payload_mb) as federation:
        for index in range(args.clients):
            slow = index == args.slow_client
            env = {"PYTHONPATH": f"{HERE / 'stragglers'}:{HERE.parent}", SLOW_ENV: str(args.slow_seconds)}
            federation.start_supernode(index, args.clients, extra_env=env if slow else None)
        rows = federation.follow(results, federation.submit(config), args.rounds, on_row=lambda row: None)
    report = {
        "strategy": args.strategy,
        "seed": args.seed,
        "split": args.split,
        "fraction": args.fraction,
        "clients": args.clients,
        "overrides": config | {"results-path": None},
        "straggler_wait": settings.straggler_wait,
        "slow_client": None if args.slow_client is None else f"client-{args.slow_client}",
        "slow_seconds": args.slow_seconds if args.slow_client is not None else 0.0,
        "examples": examples,
        "load": Path("/proc/loadavg").read_text().split()[:3],
        "rows": [
            {
                key: row.get(key)
                for key in ("round", "clients", "clients_sent", "round_seconds", "rejected", "reply_seconds")
            }
            for row in rows
        ],
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}: rounds {[round(row['round_seconds'], 1) for row in rows]} s")


def exchange_seconds(row: dict[str, Any]) -> float:
    """How long the round waited for replies: until its last reply, or until it stopped waiting for one it cut (the
    seconds its refusal names)."""
    cut_at = [float(found[1]) for why in (row["rejected"] or {}).values() if (found := CUT.match(why))]
    return max([*row["reply_seconds"].values(), *cut_at])


def cut_by_straggler_wait(row: dict[str, Any]) -> list[str]:
    return sorted(who for who, why in (row["rejected"] or {}).items() if "straggler-wait" in why)


def replay(
    arrivals: dict[str, float], examples: dict[str, int | None], wait: float, by_examples: bool, graced: set[str]
) -> tuple[float, list[str]]:
    """A round whose replies arrived at `arrivals` (seconds from the push) under straggler-wait `wait`: (its seconds,
    the clients it would have cut). The plain multiple, or (`by_examples`) the server's rule, with `examples` what the
    server knew of each client (None: unknown) and `graced` the clients of unknown size waited for once already."""
    from fedbayes.server.loop import straggler_deadlines

    order = sorted(arrivals, key=arrivals.__getitem__)
    half = max(1, math.ceil(len(order) / 2))
    half_seconds = arrivals[order[half - 1]]
    replied, waiting = order[:half], order[half:]
    if by_examples:
        deadlines = straggler_deadlines(
            half_seconds,
            {client: examples[client] for client in waiting},
            [n for client in replied if (n := examples[client]) is not None],
            wait,
            graced,
        )
    else:
        deadlines = dict.fromkeys(waiting, (1 + wait) * half_seconds)
    end, cut = half_seconds, []
    for index, client in enumerate(waiting):
        still = waiting[index:]
        stop = max(deadlines[other] for other in still)
        if arrivals[client] > stop:
            return stop, still
        end = arrivals[client]
    return end, cut


def describe(report: dict[str, Any]) -> str:
    slow = f" slow {report['slow_client']} +{report['slow_seconds']:g} s" if report["slow_client"] else ""
    shown = ("local-epochs", "model", "batch-size")
    extra = "".join(f" {key}={value}" for key, value in report["overrides"].items() if key in shown)
    return f"{report['strategy']} seed {report['seed']}{slow}{extra}"


def seconds_list(values: list[float]) -> str:
    return " ".join(f"{value:.1f}" for value in values)


def table(args: argparse.Namespace) -> None:
    """Per run: its rounds' seconds and the honest replies (and slow client) cut; for a run at straggler-wait=0, the
    exchanges replayed under each wait and rule. The exchange: from the push to the last reply taken, or the cut
    (`exchange_seconds`)."""
    waits = [float(w) for w in args.waits.split(",")]
    print("| run | load | straggler-wait | rule | round seconds (exchange) | honest replies cut | slow client cut |")
    print("|---|---|---|---|---|---|---|")
    for path in args.files:
        report = json.loads(Path(path).read_text())
        name, rows, slow = describe(report), report["rows"], report["slow_client"]
        load = "/".join(report["load"])
        cuts = [cut_by_straggler_wait(row) for row in rows]
        honest = sum(1 for cut in cuts for who in cut if slow is None or slow not in who)
        slow_cut = sum(1 for cut in cuts if slow is not None and any(slow in who for who in cut))
        exchanges = [exchange_seconds(row) for row in rows]
        shown = f"{seconds_list([row['round_seconds'] for row in rows])} ({seconds_list(exchanges)})"
        wait = report["straggler_wait"]
        print(f"| {name} | {load} | {wait:g} | run | {shown} | {honest} | {slow_cut}/{len(rows) if slow else '-'} |")
        if wait != 0:
            continue
        for wait in waits:
            for by_examples in (False, True):
                known: dict[str, int | None] = dict.fromkeys(report["examples"])
                graced: set[str] = set()
                times, honest, slow_cut = [], 0, 0
                for row in rows:
                    arrivals = {client: s for client, s in row["reply_seconds"].items() if client in known}
                    end, cut = replay(arrivals, known, wait, by_examples, graced)
                    times.append(end)
                    honest += sum(1 for client in cut if client != slow)
                    slow_cut += slow in cut
                    graced |= {client for client in arrivals if known[client] is None}
                    known |= {client: report["examples"][client] for client in arrivals if client not in cut}
                rule = "by size" if by_examples else "plain"
                print(
                    f"| {name} | {load} | {wait:g} | {rule}, replayed | ({seconds_list(times)}) | {honest} |"
                    f" {slow_cut}/{len(rows) if slow else '-'} |"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run")
    one.add_argument("--strategy", required=True)
    one.add_argument("--seed", type=int, default=0)
    one.add_argument("--rounds", type=int, default=5)
    one.add_argument("--clients", type=int, default=10)
    one.add_argument("--fraction", type=float, default=0.1)
    one.add_argument("--split", default="dirichlet")
    one.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    one.add_argument("--slow-client", type=int)
    one.add_argument("--slow-seconds", type=float, default=60.0)
    one.add_argument("--workdir", type=Path, required=True)
    one.add_argument("--out", type=Path, required=True)
    many = commands.add_parser("table")
    many.add_argument("files", nargs="+")
    many.add_argument("--waits", default="1,2,3,5")
    args = parser.parse_args()
    run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    main()
