"""`fedbayes client`: join a federation from this machine with one command.

    fedbayes client --superlink fl.example.org:9092 --ca ca.crt --key hospital-d \\
        --client-id hospital-d --data /data/hospital-d.npz --state-dir /var/lib/fedbayes

runs a SuperNode (TLS to the SuperLink, authenticated with the client's private key, which the
operator registered) and next to it the warm ClientApp executor (deploy/warm_executor.py) on this
machine's loopback, until interrupted or until either exits. The client id is the client's stable
identity: its durable state lives under --state-dir/<federation>/<client-id> and survives restarts, so
running the same command again after a crash continues where the client left off.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from deploy.processes import ProcessGroup, free_ports

DEFAULT_STATE_DIR = Path("/var/lib/fedbayes")


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
    flower_supernode: str, superlink: str, config: str, runtime_port: int, ca_cert: Path | None,
    auth_key: Path | None, isolation: str = "process",
) -> list[str]:
    """A SuperNode dialing `superlink`: TLS with `ca_cert` (insecure without, loopback development only),
    authenticated with `auth_key`; its Runtime API for the ClientApp executor on 127.0.0.1:`runtime_port`."""
    security = ["--insecure"] if ca_cert is None else ["--root-certificates", str(ca_cert)]
    security += ["--auth-supernode-private-key", str(auth_key)] if auth_key is not None else []
    return [flower_supernode, *security, "--superlink", superlink, "--port", str(runtime_port),
            "--node-config", config, "--isolation", isolation]


def superexec_command(fedbayes: str, runtime_port: int, supernode_pid: int) -> list[str]:
    """The warm ClientApp executor for the SuperNode whose Runtime API is on this host's 127.0.0.1 (plain
    HTTP that never leaves the machine); it exits with that SuperNode."""
    return [fedbayes, "superexec", "--insecure", "--runtime-api-address", f"127.0.0.1:{runtime_port}",
            "--parent-pid", str(supernode_pid)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--superlink", required=True, help="the SuperLink's Fleet API, host:port (9092 by default)")
    parser.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate (ca.crt)")
    parser.add_argument("--key", type=Path, required=True, help="this client's private key (registered by the operator)")
    parser.add_argument("--client-id", required=True, help="stable identity, [A-Za-z0-9._-]+")
    parser.add_argument("--data", type=Path, required=True, help=".npz with `images` and `labels`")
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="durable client state")
    parser.add_argument("--log-dir", type=Path, help="write the two processes' logs here (default: this terminal)")


def run(args: argparse.Namespace) -> int:
    from deploy.launcher import console_script, process_env

    for path, what in ((args.ca, "--ca"), (args.key, "--key"), (args.data, "--data")):
        if not path.is_file():
            raise FileNotFoundError(f"{what} {path} does not exist")
    (runtime_port,) = free_ports(1)
    config = node_config(args.client_id, args.state_dir.resolve(), data_path=args.data.resolve())
    env = process_env(Path.home() / ".flwr")
    with ProcessGroup(args.log_dir, env) as processes:
        supernode = processes.start("supernode", supernode_command(
            console_script("flower-supernode"), args.superlink, config, runtime_port, args.ca.resolve(), args.key.resolve()
        ))
        superexec = processes.start("superexec", superexec_command(console_script("fedbayes"), runtime_port, supernode.popen.pid))
        print(f"fedbayes client {args.client_id}: SuperNode -> {args.superlink} (TLS, node auth); Ctrl-C stops",
              file=sys.stderr, flush=True)
        while supernode.popen.poll() is None and superexec.popen.poll() is None:
            time.sleep(0.5)
        stopped = supernode if supernode.popen.poll() is not None else superexec
        print(f"fedbayes client: {stopped.name} exited with code {stopped.popen.returncode}", file=sys.stderr)
        return stopped.popen.returncode
