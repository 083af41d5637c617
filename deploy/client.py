"""`fedbayes client`: join a federation from this machine with one command.

    fedbayes client --check --superlink fl.example.org:9092 --ca ca.crt --key hospital-d
    fedbayes client --superlink fl.example.org:9092 --ca ca.crt --key hospital-d \\
        --client-id hospital-d --data /data/hospital-d.npz --state-dir /var/lib/fedbayes

Every option is checked on this machine first, before the SuperLink is asked anything, and a refusal names
it (--ca and --key readable and usable, --client-id, --data's header, --state-dir and --log-dir writable).
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

`--leave --forget` (no --data needed): the same SuperNode, whose ClientApp answers every instruction with a request
to forget this client (LeaveAndForget) instead of training. The server honours it only from this client's own node,
between rounds (server/forget/), and says so in its next instruction; the ClientApp then deletes the client's
durable state for that federation and writes the leave marker (client/state.py), and this command signs off and
exits 0. A refused request (e.g. the last remaining client) is asked again at every instruction. It waits for that
at most --leave-timeout seconds (0: no limit), saying at the start what it waits for and each time it has asked;
then it gives up, exits 1 and says why: no instruction came (no run is going on, or the federation ended before
this client's turn), or the server has not confirmed the request it was sent. The client's state is kept then.
"""

from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fedbayes.deploy.fleet_probe import FleetTarget, ProbeError, check, load_private_key, release_if_online
from fedbayes.deploy.processes import ManagedProcess, ProcessGroup, free_ports
from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, checked_number
from fedbayes.tasks.message_limits import MAX_MESSAGE_OPTION, default_max_message_mb
from fedbayes.tasks.preflight import unwritable
from fedbayes.tasks.storage import MAX_CLIENT_ID_LENGTH, is_safe_name

DEFAULT_STATE_DIR = Path("/var/lib/fedbayes")
# A SuperNode that died without signing off stays online at the SuperLink until two 30 s heartbeats lapse.
DEFAULT_ACTIVATION_TIMEOUT = 120.0
MAX_BACKOFF = 8.0
SIGN_OFF_TIMEOUT = 10.0
# How long --leave --forget waits for the server to ask and confirm: the `fedbayes forget` default wait.
DEFAULT_LEAVE_TIMEOUT = 600.0


def node_config(
    client_id: str,
    state_dir: Path,
    data_path: Path | None = None,
    partition: tuple[int, int] | None = None,
    leave_and_forget: bool = False,
) -> str:
    """`--node-config` for a client: its own data file, or partition i of k of the run's split (tests); or, leaving,
    neither (client/runtime.py NodeSettings).

    Args:
        client_id: the client's id, [A-Za-z0-9._-]+ (not quoted further).
        state_dir: the folder of its durable state (its federations' folders go under it).
        data_path: its own .npz data file; None: none (partition, or leaving).
        partition: (i, k): partition i of k of the run's split; None: none.
        leave_and_forget: the ClientApp asks to be forgotten instead of training.

    Returns:
        The space-separated `key=value` pairs, paths as JSON strings.
    """
    settings = [f'client-id="{client_id}"', f"state-dir={json.dumps(str(state_dir))}"]
    if data_path is not None:
        settings.append(f"data-path={json.dumps(str(data_path))}")
    if partition is not None:
        settings.append(f"partition-id={partition[0]} num-partitions={partition[1]}")
    if leave_and_forget:
        settings.append("leave-and-forget=true")
    return " ".join(settings)


def supernode_arguments(
    superlink: str,
    config: str,
    runtime_port: int,
    ca_cert: Path | None,
    auth_key: Path | None,
    isolation: str = "process",
) -> list[str]:
    """`fedbayes supernode`'s arguments (Flower's SuperNode, without its 3 s idle sleep) for a SuperNode dialing
    `superlink`: TLS with `ca_cert` (insecure without, loopback development only), authenticated with `auth_key`;
    its Runtime API for the ClientApp executor on 127.0.0.1:`runtime_port`.

    Args:
        superlink: the Fleet API's host:port.
        config: its `--node-config` (`node_config`).
        runtime_port: the Runtime API's port on 127.0.0.1.
        ca_cert: the federation's CA certificate; None: insecure.
        auth_key: the client's private key (node authentication); None: none.
        isolation: `process` (an executor of its own serves it) or `subprocess` (Flower's stock path).

    Returns:
        The arguments after `fedbayes supernode`.
    """
    security = ["--insecure"] if ca_cert is None else ["--root-certificates", str(ca_cert)]
    security += ["--auth-supernode-private-key", str(auth_key)] if auth_key is not None else []
    return [
        *security,
        "--superlink",
        superlink,
        "--port",
        str(runtime_port),
        "--node-config",
        config,
        "--isolation",
        isolation,
    ]


def superexec_command(fedbayes: str, *supernodes: tuple[int, int]) -> list[str]:
    """The warm ClientApp executor for the SuperNodes (runtime port, pid) whose Runtime APIs are on this host's
    127.0.0.1 (plain HTTP that never leaves the machine); it serves each until that SuperNode exits.

    Args:
        fedbayes: the `fedbayes` executable.
        supernodes: (Runtime API port, SuperNode process id) per SuperNode; at least one.

    Returns:
        The command line.
    """
    served = [
        arg
        for port, pid in supernodes
        for arg in ("--runtime-api-address", f"127.0.0.1:{port}", "--parent-pid", str(pid))
    ]
    return [fedbayes, "superexec", "--insecure", *served]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`fedbayes client`'s options.

    Args:
        parser: the `client` parser.
    """
    parser.add_argument("--superlink", required=True, help="the SuperLink's Fleet API, host:port (9092 by default)")
    parser.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate (ca.crt)")
    parser.add_argument(
        "--key", type=Path, required=True, help="this client's private key (registered by the operator)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check name, network, TLS, clock and key against the SuperLink, report, and exit",
    )
    parser.add_argument("--client-id", help="stable identity, [A-Za-z0-9._-]+ (required unless --check)")
    parser.add_argument(
        "--data", type=Path, help=".npz with `x` and `y` (docs/extending/data.md; required unless --check)"
    )
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="durable client state")
    parser.add_argument("--log-dir", type=Path, help="write the two processes' logs here (default: this terminal)")
    parser.add_argument(
        "--leave",
        action="store_true",
        help="with --forget: ask the server to forget this client, delete its state once it has, and "
        "leave (instead of training)",
    )
    parser.add_argument("--forget", action="store_true", help="see --leave")
    parser.add_argument(
        "--leave-timeout",
        type=checked_number(float, NON_NEGATIVE),
        default=DEFAULT_LEAVE_TIMEOUT,
        metavar="SECONDS",
        help=f"with --leave --forget: give up (exit 1, the state kept) when the server has not confirmed within "
        f"this long (default {DEFAULT_LEAVE_TIMEOUT:.0f}; 0: no limit)",
    )
    parser.add_argument(
        MAX_MESSAGE_OPTION,
        type=checked_number(float, POSITIVE),
        default=default_max_message_mb(),
        metavar="MB",
        help="refuse an instruction over this many MiB as it arrives, with an error reply naming the limit "
        "(default: max-payload-mb's default; at least the federation's max-payload-mb)",
    )
    parser.add_argument(
        "--activation-timeout",
        type=checked_number(float, NON_NEGATIVE),
        default=DEFAULT_ACTIVATION_TIMEOUT,
        metavar="SECONDS",
        help="how long to retry while the SuperLink is unreachable or still holds this key's node",
    )


def run(args: argparse.Namespace) -> int:
    """`fedbayes client`: with --check, the SuperLink's checks step by step; else join until interrupted.

    Args:
        args: the command line (`add_arguments`).

    Returns:
        0 after --check passed, else `run_supernode`'s exit code.

    Raises:
        ValueError: an option this machine refuses (`fleet_target`, `check_joining`).
        ProbeError: a step of the checks failed (after the retries `wait_until_accepted` makes).
        TimeoutError: --leave --forget gave up.
    """
    target = fleet_target(args)
    if args.check:
        node_id = check(target, say=print)
        print(
            f"ok: this machine can join the federation at {target.address} as node {node_id}; "
            "run the same command without --check (and with --client-id, --data) to join"
        )
        return 0
    check_joining(args)
    node_id = wait_until_accepted(target, args.activation_timeout)
    say(f"the SuperLink at {target.address} accepts this key as node {node_id}")
    return run_supernode(args, target, node_id)


def fleet_target(args: argparse.Namespace) -> FleetTarget:
    """The SuperLink as --superlink, --ca and --key name it, each checked on this machine first, before the
    SuperLink is asked anything (an unreachable one is retried; a bad file would only be named after that).

    Args:
        args: the command line: superlink, ca, key.

    Returns:
        The SuperLink's host and port, and the CA and key files.

    Raises:
        ValueError: a port outside 1..65535, a --ca that is no readable PEM certificate, or an unreadable --key.
        ProbeError: --superlink is not host:port, or --key is not a key the SuperLink can accept.
    """
    target = FleetTarget.from_address(args.superlink, args.ca, args.key)
    if not 0 < target.port < 65536:
        raise ValueError(f"--superlink {args.superlink!r}: port {target.port} is not in 1..65535")
    try:
        ssl.create_default_context(cafile=str(args.ca))
    except OSError as error:  # ssl.SSLError (no certificate in it) is one
        raise ValueError(
            f"--ca {args.ca} is not a readable PEM certificate file ({error.strerror or error}); use "
            "the federation's ca.crt, from its operator"
        ) from None
    try:
        load_private_key(args.key)  # a ProbeError naming --key for a key the SuperLink cannot accept
    except OSError as error:
        raise ValueError(f"--key {args.key} cannot be read ({error.strerror or error})") from None
    return target


def check_joining(args: argparse.Namespace) -> None:
    """Refuse, naming the option, what joining needs and this machine can check before it starts anything.

    Args:
        args: the command line: leave, forget, client_id, data, state_dir, log_dir.

    Raises:
        ValueError: --leave without --forget (or the other way), no --client-id or (not leaving) no --data, a bad
            client id, a --data whose header is refused, or a --state-dir or --log-dir this user cannot write.
    """
    from fedbayes.tasks.npzdata import NpzDataError, read_header

    if args.leave != args.forget:
        raise ValueError(
            "--leave and --forget go together: they ask the server to forget this client, then leave "
            "(to stop taking part without that, stop the client: Ctrl-C)"
        )
    if args.client_id is None or (args.data is None and not args.leave):
        raise ValueError(
            "joining needs --client-id and --data (only --check does without them, and --leave --forget without --data)"
        )
    client_id = args.client_id
    if not (client_id.isascii() and is_safe_name(client_id) and len(client_id) <= MAX_CLIENT_ID_LENGTH):
        raise ValueError(f"--client-id {client_id!r} must be 1 to {MAX_CLIENT_ID_LENGTH} characters of [A-Za-z0-9._-]")
    try:
        if args.data is not None:
            read_header(args.data)  # keys, dtypes, shapes and labels; the ClientApp checks `x` itself
    except NpzDataError as error:
        raise ValueError(f"--data: {error}") from None
    for option, folder in (("--state-dir", args.state_dir), ("--log-dir", args.log_dir)):
        if folder is not None and (problem := unwritable(folder, directory=True)):
            raise ValueError(f"{option}: {problem}")


def wait_until_accepted(target: FleetTarget, timeout: float) -> int:
    """Run the checks until the SuperLink accepts this key; retry, backing off, what may pass by itself (an
    unreachable SuperLink, a node still online from a killed session), for up to `timeout` seconds.

    Args:
        target: the SuperLink and this client's files.
        timeout: seconds of retrying (--activation-timeout); 0: one attempt.

    Returns:
        The node id the SuperLink holds for this key.

    Raises:
        ProbeError: a step failed that will not pass by itself, or a retryable one still fails at the deadline.
    """
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


def run_supernode(args: argparse.Namespace, target: FleetTarget, node_id: int) -> int:
    """The SuperNode and its ClientApp executor until interrupted or until either exits; its node offline after.

    Args:
        args: the command line (`add_arguments`), checked (`check_joining`).
        target: the SuperLink (`fleet_target`).
        node_id: the node the SuperLink holds for this key (`wait_until_accepted`).

    Returns:
        The exit code of the one that exited; with --leave: 0 once the server has forgotten this client.

    Raises:
        TimeoutError: --leave --forget gave up (`Leaving.done`).
    """
    from fedbayes.deploy.launcher import console_script, process_env

    (runtime_port,) = free_ports(1)
    data_path = args.data.resolve() if args.data else None  # leaving needs none
    config = node_config(args.client_id, args.state_dir.resolve(), data_path=data_path, leave_and_forget=args.leave)
    leaving = Leaving(args.state_dir.resolve(), args.client_id, args.leave_timeout) if args.leave else None
    with ProcessGroup(args.log_dir, process_env(Path.home() / ".flwr")) as processes:
        supernode = processes.start(
            "supernode",
            [
                console_script("fedbayes"),
                "supernode",
                *supernode_arguments(args.superlink, config, runtime_port, args.ca.resolve(), args.key.resolve()),
                MAX_MESSAGE_OPTION,
                repr(args.max_message_mb),
            ],
        )
        try:
            superexec = processes.start(
                "superexec", superexec_command(console_script("fedbayes"), (runtime_port, supernode.popen.pid))
            )
            say(f"{args.client_id}: SuperNode -> {args.superlink} (TLS, node auth); Ctrl-C stops")
            if leaving is not None:
                say(f"{args.client_id}: {leaving.waits_for()}")
            while supernode.popen.poll() is None and superexec.popen.poll() is None:
                if leaving is not None and leaving.done():
                    return 0
                time.sleep(0.5)
            stopped = supernode if supernode.popen.poll() is not None else superexec
            code = stopped.popen.poll()
            assert code is not None  # the loop ended because it exited
            say(f"{stopped.name} exited with code {code}")
            return code
        finally:
            sign_off(processes, supernode)
            make_sure_offline(target, node_id)


class Leaving:
    """What `--leave --forget` waits for, read from the notes the ClientApp leaves in the state directory
    (client/state.py): each request it sent (the leave-request note), and the server's confirmation (the leave marker,
    written once the client's state is deleted). Notes of an earlier attempt are dropped at the start."""

    def __init__(
        self, state_dir: Path, client_id: str, timeout: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Args:
        state_dir: --state-dir, resolved.
        client_id: the client's id.
        timeout: --leave-timeout, in seconds; 0: no limit.
        clock: the monotonic clock, in seconds.
        """
        from fedbayes.client.state import leave_request_note, left_marker

        self.client_id, self.timeout, self.clock = client_id, timeout, clock
        self.marker, self.note = left_marker(state_dir, client_id), leave_request_note(state_dir, client_id)
        self.note.unlink(missing_ok=True)
        self.deadline = clock() + timeout if timeout else None
        self.asked: dict | None = None  # the newest request the ClientApp sent

    def waits_for(self) -> str:
        """What it waits for, as a sentence to say at the start.

        Returns:
            The sentence, with the limit.
        """
        limit = f"up to {self.timeout:.0f} s (--leave-timeout)" if self.timeout else "with no limit (--leave-timeout 0)"
        return (
            f"waiting {limit} for the server's next instruction, which this client answers with a request to "
            "forget it (it sends no update), and for the instruction after it, which confirms; the server sends "
            "instructions only while a run goes on"
        )

    def done(self) -> bool:
        """Whether the server has forgotten this client (said, and the marker removed). Says each new request.

        Returns:
            True once the leave marker is there (it and the request note are then removed), else False.

        Raises:
            TimeoutError: past the deadline, saying what did not come (`gave_up`).
        """
        if self.marker.exists():
            say(
                f"{self.client_id}: the server has forgotten this client and its state is deleted "
                f"({self.marker.read_text()}); leaving"
            )
            self.marker.unlink()
            self.note.unlink(missing_ok=True)
            return True
        asked = self._read_note()
        if asked is not None and asked != self.asked:
            self.asked = asked
            say(
                f"{self.client_id}: asked the server to forget this client (federation {asked.get('federation')!r}, "
                f"round {asked.get('round')}); waiting for its confirmation in its next instruction"
            )
        if self.deadline is not None and self.clock() > self.deadline:
            raise TimeoutError(self.gave_up())
        return False

    def gave_up(self) -> str:
        """Why --leave --forget stops waiting: what it asked, or that nothing came to ask.

        Returns:
            The message, with what to do next.
        """
        waited = f"--leave --forget gave up after {self.timeout:.0f} s (--leave-timeout)"
        kept = "this client's state is kept"
        if self.asked is None:
            return (
                f"{waited}: no instruction came from the server, so client {self.client_id!r} could not ask it to "
                "forget it. No run is going on (or the federation ended before this client's turn): run the command "
                f"again while a run goes on, or ask the operator to run `fedbayes forget` for it; {kept}"
            )
        return (
            f"{waited}: client {self.client_id!r} asked the server to forget it (federation "
            f"{self.asked.get('federation')!r}, round {self.asked.get('round')}), and no instruction since has "
            "confirmed it. The server refused (its operator's forget audit log says why: the last remaining client, "
            f"or a strategy with no per-client state), or the run ended first; {kept} (the same command asks again)"
        )

    def _read_note(self) -> dict | None:
        try:
            return json.loads(self.note.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # unreadable now (it is replaced atomically, so not half written): as before
            return self.asked


def sign_off(processes: ProcessGroup, supernode: ManagedProcess) -> None:
    """Stop the SuperNode alone and wait for it: on SIGTERM it deactivates its node at the SuperLink, so the
    key can come back at once. (ProcessGroup's stop signals every process of the group, the SuperNode
    twice; the second signal kills it inside its exit handler before it signs off, and the SuperLink then
    refuses the key for 60 s.) If it does not exit in time, the group's stop takes over.

    Args:
        processes: the group the SuperNode is in.
        supernode: the SuperNode's process.
    """
    processes.stop(supernode)
    try:
        supernode.popen.wait(timeout=SIGN_OFF_TIMEOUT)
    except subprocess.TimeoutExpired:
        say(
            f"the SuperNode did not exit within {SIGN_OFF_TIMEOUT:.0f} s of SIGTERM; killing it (the SuperLink "
            "then holds its node for up to 60 s)"
        )


def make_sure_offline(target: FleetTarget, node_id: int) -> None:
    """Deactivate the node if the SuperLink still holds it online. A SuperNode stopped while its activation is in
    flight knows no node to deactivate, and the SuperLink would refuse this key until the node's heartbeats expire.

    Args:
        target: the SuperLink.
        node_id: this key's node.
    """
    try:
        if release_if_online(target, node_id, timeout=SIGN_OFF_TIMEOUT):
            say(f"signed node {node_id} off at the SuperLink (the SuperNode stopped before it could)")
    except ProbeError as problem:
        say(f"could not sign node {node_id} off at the SuperLink ({problem}); it holds the node for up to 60 s")


def say(message: str) -> None:
    """Print a line of this command's own on stderr, prefixed `fedbayes client: `.

    Args:
        message: the line.
    """
    print(f"fedbayes client: {message}", file=sys.stderr, flush=True)
