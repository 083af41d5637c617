"""`fedbayes client`: join a federation from this machine with one command.

    fedbayes client --check --superlink fl.example.org:9092 --ca ca.crt --key hospital-d
    fedbayes client --superlink fl.example.org:9092 --ca ca.crt --key hospital-d \\
        --client-id hospital-d --data /data/hospital-d.npz --state-dir /var/lib/fedbayes

`--check` connects, authenticates and reports what the SuperLink says about this key, step by step,
without joining a run (deploy/fleet_probe.py). Without it the same checks run first, retried with
backoff for up to --activation-timeout seconds while the SuperLink is unreachable or still holds this
key's node (a client killed less than 60 s ago); then a SuperNode (TLS to the SuperLink, authenticated
with the client's private key, which the operator registered) and next to it the warm ClientApp executor
(deploy/warm_executor.py) run on this machine's loopback until interrupted or until either exits. On
Ctrl-C or SIGTERM the SuperNode signs off first, so the same command can start again at once.

The client id is the client's stable identity: its durable state lives under
--state-dir/<federation>/<client-id> and survives restarts, so running the same command again after a
crash continues where the client left off.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from fedbayes.deploy.fleet_probe import FleetTarget, ProbeError, check
from fedbayes.deploy.processes import ManagedProcess, ProcessGroup, free_ports
from fedbayes.tasks.config import _is_safe_name

DEFAULT_STATE_DIR = Path("/var/lib/fedbayes")
# A SuperNode that died without signing off stays online at the SuperLink until two 30 s heartbeats lapse.
DEFAULT_ACTIVATION_TIMEOUT = 120.0
MAX_BACKOFF = 8.0
SIGN_OFF_TIMEOUT = 10.0


def node_config(client_id: str, state_dir: Path, data_path: Path | None = None,
                partition: tuple[int, int] | None = None) -> str:
    """`--node-config` for a client: its own data file, or partition i of k of the run's split (tests)."""
    settings = [f'client-id="{client_id}"', f"state-dir={json.dumps(str(state_dir))}"]
    if data_path is not None:
        settings.append(f"data-path={json.dumps(str(data_path))}")
    if partition is not None:
        settings.append(f"partition-id={partition[0]} num-partitions={partition[1]}")
    return " ".join(settings)


def supernode_command(
    fedbayes: str, superlink: str, config: str, runtime_port: int, ca_cert: Path | None,
    auth_key: Path | None, isolation: str = "process",
) -> list[str]:
    """A SuperNode (`fedbayes supernode`: Flower's, without its 3 s idle sleep) dialing `superlink`: TLS with
    `ca_cert` (insecure without, loopback development only), authenticated with `auth_key`; its Runtime API
    for the ClientApp executor on 127.0.0.1:`runtime_port`."""
    security = ["--insecure"] if ca_cert is None else ["--root-certificates", str(ca_cert)]
    security += ["--auth-supernode-private-key", str(auth_key)] if auth_key is not None else []
    return [fedbayes, "supernode", *security, "--superlink", superlink, "--port", str(runtime_port),
            "--node-config", config, "--isolation", isolation]


def superexec_command(fedbayes: str, *supernodes: tuple[int, int]) -> list[str]:
    """The warm ClientApp executor for the SuperNodes (runtime port, pid) whose Runtime APIs are on this host's
    127.0.0.1 (plain HTTP that never leaves the machine); it serves each until that SuperNode exits."""
    served = [arg for port, pid in supernodes
              for arg in ("--runtime-api-address", f"127.0.0.1:{port}", "--parent-pid", str(pid))]
    return [fedbayes, "superexec", "--insecure", *served]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--superlink", required=True, help="the SuperLink's Fleet API, host:port (9092 by default)")
    parser.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate (ca.crt)")
    parser.add_argument("--key", type=Path, required=True, help="this client's private key (registered by the operator)")
    parser.add_argument("--check", action="store_true",
                        help="check name, network, TLS, clock and key against the SuperLink, report, and exit")
    parser.add_argument("--client-id", help="stable identity, [A-Za-z0-9._-]+ (required unless --check)")
    parser.add_argument("--data", type=Path, help=".npz with `x` and `y` (README \"Bring your own data\"; required unless --check)")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="durable client state")
    parser.add_argument("--log-dir", type=Path, help="write the two processes' logs here (default: this terminal)")
    parser.add_argument("--activation-timeout", type=float, default=DEFAULT_ACTIVATION_TIMEOUT, metavar="SECONDS",
                        help="how long to retry while the SuperLink is unreachable or still holds this key's node")


def run(args: argparse.Namespace) -> int:
    target = FleetTarget.from_address(args.superlink, args.ca, args.key)
    if args.check:
        node_id = check(target, say=print)
        print(f"ok: this machine can join the federation at {target.address} as node {node_id}; "
              "run the same command without --check (and with --client-id, --data) to join")
        return 0
    if args.client_id is None or args.data is None:
        raise ValueError("joining needs --client-id and --data (only --check does without them)")
    if not _is_safe_name(args.client_id):
        raise ValueError(f"--client-id {args.client_id!r} must match [A-Za-z0-9._-]+")
    if not args.data.is_file():
        raise FileNotFoundError(f"--data {args.data} does not exist")
    node_id = wait_until_accepted(target, args.activation_timeout)
    say(f"the SuperLink at {target.address} accepts this key as node {node_id}")
    return run_supernode(args)


def wait_until_accepted(target: FleetTarget, timeout: float) -> int:
    """Run the checks until the SuperLink accepts this key; retry, backing off, what may pass by itself (an
    unreachable SuperLink, a node still online from a killed session), for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 1.0
    while True:
        try:
            return check(target, say=lambda _line: None)
        except ProbeError as problem:
            if not problem.retryable or time.monotonic() + delay > deadline:
                raise
            say(f"{problem}; trying again in {delay:.0f} s (gives up after {timeout:.0f} s: --activation-timeout)")
            time.sleep(delay)
            delay = min(2 * delay, MAX_BACKOFF)


def run_supernode(args: argparse.Namespace) -> int:
    """The SuperNode and its ClientApp executor until interrupted or until either exits; its exit code."""
    from fedbayes.deploy.launcher import console_script, process_env

    (runtime_port,) = free_ports(1)
    config = node_config(args.client_id, args.state_dir.resolve(), data_path=args.data.resolve())
    with ProcessGroup(args.log_dir, process_env(Path.home() / ".flwr")) as processes:
        supernode = processes.start("supernode", supernode_command(
            console_script("fedbayes"), args.superlink, config, runtime_port, args.ca.resolve(), args.key.resolve()
        ))
        try:
            superexec = processes.start(
                "superexec", superexec_command(console_script("fedbayes"), (runtime_port, supernode.popen.pid))
            )
            say(f"{args.client_id}: SuperNode -> {args.superlink} (TLS, node auth); Ctrl-C stops")
            while supernode.popen.poll() is None and superexec.popen.poll() is None:
                time.sleep(0.5)
            stopped = supernode if supernode.popen.poll() is not None else superexec
            say(f"{stopped.name} exited with code {stopped.popen.returncode}")
            return stopped.popen.returncode
        finally:
            sign_off(processes, supernode)


def sign_off(processes: ProcessGroup, supernode: ManagedProcess) -> None:
    """Stop the SuperNode alone and wait for it: on SIGTERM it deactivates its node at the SuperLink, so the
    key can come back at once. (ProcessGroup's stop signals every process of the group, the SuperNode
    twice; the second signal kills it inside its exit handler before it signs off, and the SuperLink then
    refuses the key for 60 s.) If it does not exit in time, the group's stop takes over."""
    processes.stop(supernode)
    try:
        supernode.popen.wait(timeout=SIGN_OFF_TIMEOUT)
    except subprocess.TimeoutExpired:
        say(f"the SuperNode did not exit within {SIGN_OFF_TIMEOUT:.0f} s of SIGTERM; killing it (the SuperLink "
            "then holds its node for up to 60 s)")


def say(message: str) -> None:
    print(f"fedbayes client: {message}", file=sys.stderr, flush=True)
