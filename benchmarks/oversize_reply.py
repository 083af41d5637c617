"""What a reply over `max-payload-mb` costs the server before it is refused.

One SuperLink (TLS, node auth, --database as in deployments; or, with --in-memory, insecure with
Flower's in-memory state, as `fedbayes local`) and `--honest-clients` SuperNodes plus one rogue on loopback; the rogue's
FedAvg reply is padded with `--padding-mb` MiB of random data (benchmarks/oversize_reply/sitecustomize.py,
which also skips the honest client's own size check). The run's `max-payload-mb` (default 512) refuses it.
While the round runs this samples, every 0.2 s, the peak resident memory (VmHWM) of the ServerApp, the
SuperLink, the SuperNode and its ClientApp executor, and the size of the SuperLink's database file.

    python benchmarks/oversize_reply.py --padding-mb 600 [--in-memory] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from fedbayes.deploy.launcher import LocalFederation
from fedbayes.deploy.pki import init_pki, make_supernode_key
from fedbayes.deploy.processes import ProcessGroup, process_name

HERE = Path(__file__).resolve().parent
ROLES = ("ServerApp", "SuperLink", "SuperNode", "ClientApp")


def role(pid: int) -> str | None:
    """The federation role of process `pid`: by its name where it is a fork that named itself (ServerApps and
    ClientApps of the warm executors, SuperNodes of the fork server), else by its command line."""
    name = process_name(pid)
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if name == "flwr-serverapp" or "flwr-serverapp" in cmdline:
        return "ServerApp"
    if name == "flwr-clientapp" or "flwr-clientapp" in cmdline:
        return "ClientApp"
    if "fedbayes superlink" in cmdline:
        return "SuperLink"
    if name.startswith("supernode-") or "fedbayes supernode " in cmdline:
        return "SuperNode"
    return None


def peak_rss_mb(group: ProcessGroup) -> dict[str, float]:
    """VmHWM (peak resident set) of the largest process of each role among this federation's processes
    (other federations may run on the same machine)."""
    peaks = dict.fromkeys(ROLES, 0.0)
    for pid in group.members():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        hwm = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        if (which := role(pid)) is not None:
            peaks[which] = max(peaks[which], hwm / 1024)
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--padding-mb", type=float, default=600.0)
    parser.add_argument("--max-payload-mb", type=float, default=512.0)
    parser.add_argument(
        "--max-message-mb",
        type=float,
        help="the SuperLink's and SuperNodes' --max-message-mb (default: --max-payload-mb, as `fedbayes local` has)",
    )
    parser.add_argument("--honest-clients", type=int, default=1, help="whose replies the round commits")
    parser.add_argument("--workdir", type=Path, default=Path("runs/oversize-reply"))
    parser.add_argument("--in-memory", action="store_true", help="insecure SuperLink without --database")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    tls = init_pki(workdir.parent / f"{workdir.name}-pki")
    clients = 1 + args.honest_clients
    key_dir = workdir.parent / f"{workdir.name}-pki" / "supernodes"
    keys = [make_supernode_key(key_dir, f"client-{index}") for index in range(clients)]
    results = workdir / "results.jsonl"
    peaks, database_mb, stop = dict.fromkeys(ROLES, 0.0), [0.0], threading.Event()

    def sample(group: ProcessGroup) -> None:
        while not stop.is_set():
            for role, value in peak_rss_mb(group).items():
                peaks[role] = max(peaks[role], value)
            database = workdir / "superlink.db"
            if database.exists():
                database_mb[0] = max(database_mb[0], database.stat().st_size / 2**20)
            time.sleep(0.2)

    security = {} if args.in_memory else {"tls": tls, "node_auth": True}
    max_message_mb = args.max_message_mb or args.max_payload_mb
    with LocalFederation(workdir, max_message_mb=max_message_mb, **security) as federation:
        if not args.in_memory:
            for key in keys:
                federation.register(key.public)
        federation.start_supernode(
            0,
            clients,
            auth_key=None if args.in_memory else keys[0].private,
            extra_env={
                "PYTHONPATH": f"{HERE / 'oversize_reply'}:{HERE.parent}",
                "FEDBAYES_PADDING_MB": str(args.padding_mb),
            },
        )
        for index in range(1, clients):
            federation.start_supernode(index, clients, auth_key=None if args.in_memory else keys[index].private)
        sampler = threading.Thread(target=sample, args=(federation.processes,), daemon=True)
        sampler.start()
        started = time.monotonic()
        submit = federation.submit(
            {
                "strategy": "fedavg",
                "num-server-rounds": 1,
                "fraction": 0.02,
                "wait-for-clients": clients,
                "max-payload-mb": args.max_payload_mb,
                "results-path": str(results),
            }
        )
        rows = federation.follow(results, submit, 1, on_row=lambda row: None)
        seconds = time.monotonic() - started
        stop.set()
        sampler.join()
        server_log = (federation.log_dir / "flwr-run.log").read_text()
        superlink_log = (federation.log_dir / "superlink.log").read_text(errors="replace")
    refusals = [
        line.strip() for line in server_log.splitlines() if "max-payload-mb" in line or "max-message-mb" in line
    ]
    refusal = refusals[0] if refusals else "(no refusal logged)"
    database = workdir / "superlink.db"
    report = {
        "padding_mb": args.padding_mb,
        "max_payload_mb": args.max_payload_mb,
        "max_message_mb": max_message_mb,
        "in_memory": args.in_memory,
        "round": rows[0] if rows else None,
        "seconds": round(seconds, 1),
        "peak_rss_mb": {k: round(v) for k, v in peaks.items()},
        "superlink_db_peak_mb": round(database_mb[0]),
        "superlink_db_end_mb": round(database.stat().st_size / 2**20) if database.exists() else 0,
        "superlink_errors": sorted(
            {line.split("]")[0] + "]" for line in superlink_log.splitlines() if "ERROR" in line}
        ),
        "refusal": refusal,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
