"""Many SuperNodes in one process, the SuperLink load harness's load generator (tests/support/superlink_load.py).

Each node is one thread that speaks Flower 1.39's Fleet API through Flower's own SuperNode connection
(`flwr.client.grpc_rere_client.connection.grpc_request_response`: its own gRPC channel, a fresh key pair on P-256 as
`fedbayes supernode` makes it (`--key-curve p384`: Flower's own), every call
signed, RegisterNode and ActivateNode, Flower's heartbeat thread, the retry policy; a TCP connection of its own, as
each SuperNode process has, and no connectivity watch: `own_connections`) and runs the loop of `fedbayes supernode`
(Flower's `start_client_internal` with fedbayes' waits, deploy/supernode.py `polling_time`, `--poll` standing for its
FEDBAYES_SUPERNODE_POLL):

  PullMessages                  idle: again after 0.2 s, backing off x1.5 up to 1 s
  GetRun, GetFab                once per run, as a SuperNode does for a run it does not know
  PullObject per object         the message's object tree, Flower's `pull_objects` (first retry after 50 ms)
  ConfirmMessageReceived        the message taken
  (the "ClientApp")             decode the instruction with fedbayes' codec, wait `--compute-seconds`, answer with
                                a valid fedbayes Reply: its header echoes the instruction's (nonce included), its
                                weights are the received ones plus N(0, `--noise`^2) noise; found by the node's
                                reply check every 0.2 s, as the SuperNode finds its ClientApp's reply
  PushMessages, PushObject      the reply's tree, then the objects the SuperLink asks for

Only FedAvg and FedProx instructions are answered (a FedAvgReply); another body is an error of that node.

`--processes` processes share the nodes: this one and its forks, made before any thread or channel starts, so that
they share its imports. What process i did goes to `--output`: nodes-<i>.jsonl, one JSON line a second
(time.monotonic(), which every process of this machine shares: nodes connected and failed, and per Fleet method the
calls and their seconds), and replies-<i>.jsonl, one line per reply sent (run, round, node id, client id, compute
seconds). SIGTERM stops the nodes (each signs off, as a SuperNode does on its way out) and writes a last stats line.

    python tests/support/fleet_nodes.py --superlink 127.0.0.1:9092 --nodes 1000 --processes 4 --output DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

# What fedbayes.deploy.processes gives every Flower process, set before Flower is imported (a value the caller set is
# kept).
FLOWER_ENV = {
    "OMP_NUM_THREADS": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}
for name, value in FLOWER_ENV.items():
    os.environ.setdefault(name, value)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the checkout's fedbayes

# isort: split

import grpc
import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.app.message import remove_content_from_message
from flwr.client.grpc_rere_client import connection
from flwr.client.grpc_rere_client.connection import grpc_request_response
from flwr.proto.fleet_pb2_grpc import FleetStub
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree, iterate_object_tree
from flwr.supercore.inflatable.inflatable_utils import (
    inflate_object_from_contents,
    pull_objects,
    push_object_contents_from_iterable,
)
from flwr.supercore.retry import make_simple_grpc_retry_invoker

from fedbayes.deploy.processes import name_this_process
from fedbayes.deploy.supernode import DEFAULT_POLL
from fedbayes.flowerseam.object_pulls import shorten_pull_backoff
from fedbayes.flowerseam.supernode import FLOWER_WAITS, polling_time, signing_with_p256
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import TIMINGS_KEY, decode, encode, reply_header

IDLE_WAIT, REPLY_WAIT = FLOWER_WAITS  # the waits of Flower's SuperNode loop, as `polling_time` maps them
FLEET_METHODS = (
    "RegisterNode",
    "ActivateNode",
    "DeactivateNode",
    "UnregisterNode",
    "SendNodeHeartbeat",
    "PullMessages",
    "PushMessages",
    "GetRun",
    "GetFab",
    "PushObject",
    "PullObject",
    "ConfirmMessageReceived",
)
STATS_INTERVAL = 1.0  # seconds between stats lines
JOIN_TIMEOUT = 30.0  # seconds the nodes get to sign off after SIGTERM


class Counters:
    """What this process's nodes did, shared by their threads: nodes connected and failed, per Fleet method the calls
    made and the seconds they took, and each reply sent."""

    def __init__(self, replies: Path) -> None:
        self.lock = threading.Lock()
        self.connected = 0
        self.failed: list[str] = []  # one line per node that stopped by an error (a real SuperNode would exit)
        self.calls = {method: [0, 0.0] for method in FLEET_METHODS}
        self.errors = {method: 0 for method in FLEET_METHODS}
        self.replies = replies.open("a")

    def timed(self, method: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return call(*args, **kwargs)
            except Exception:
                with self.lock:
                    self.errors[method] += 1
                raise
            finally:
                with self.lock:
                    entry = self.calls[method]
                    entry[0] += 1
                    entry[1] += time.monotonic() - started

        return timed_call

    def reply_sent(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.replies.write(json.dumps(record) + "\n")
            self.replies.flush()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "t": time.monotonic(),
                "connected": self.connected,
                "failed": list(self.failed),
                "calls": {method: list(entry) for method, entry in self.calls.items()},
                "errors": dict(self.errors),
            }


def counting_stub(counters: Counters) -> Callable[[Any], FleetStub]:
    """A FleetStub class for `grpc_request_response` (its `adapter_cls`) whose every method counts and times its calls;
    Flower wraps each with its retry policy after, so a retried call counts each try."""

    def make(channel: Any) -> FleetStub:
        stub = FleetStub(channel)
        for method in FLEET_METHODS:
            setattr(stub, method, counters.timed(method, getattr(stub, method)))
        return stub

    return make


def answer(instruction: Message, client_id: str, compute_seconds: float, noise: float, rng: np.random.Generator):
    """The reply content a FedAvg client would send to `instruction`: the received weights plus noise, its header the
    instruction's answer (`reply_header`: round, federation, nonce), its timings the simulated compute."""
    payload = decode(
        instruction.content,
        pb.Instruction,
        pb.FedAvgInstruction,
        lambda body: {"weights": {spec.name: tuple(spec.shape) for spec in body.weights.tensors}},
        sender="server",
    )
    weights = {
        name: (value + rng.normal(0.0, noise, value.shape)).astype(np.float32)
        for name, value in payload.tensors["weights"].items()
    }
    envelope = pb.Reply(
        header=reply_header(payload.header, client_id),
        num_examples=100,
        train_loss=1.0,
        compute_seconds=compute_seconds,
        resumed_from_round=0,
    )
    content = encode(envelope, pb.FedAvgReply(), {"weights": weights, "buffers": payload.tensors["buffers"]})
    content[TIMINGS_KEY] = ConfigRecord({"update": compute_seconds})
    return content, payload.header.server_round


def serve(index: int, args: argparse.Namespace, counters: Counters, stop: threading.Event) -> None:
    """One node until `stop` is set: Flower's connection, fedbayes supernode's loop (module docstring). An error that
    Flower's retries do not cover stops the node (a SuperNode exits then) and is counted as its failure; one while it
    connects ends this process, as it ends a SuperNode (Flower's `flwr_exit`)."""
    client_id = f"load-{index}"
    rng = np.random.default_rng(index)
    clock = polling_time(args.poll)
    known_runs: set[int] = set()
    with grpc_request_response(
        args.superlink,
        True,
        make_simple_grpc_retry_invoker(),
        adapter_cls=counting_stub(counters),  # type: ignore[arg-type]
    ) as (node_id, receive, send, get_run, get_fab, pull_object, push_object, confirm_received):
        with counters.lock:
            counters.connected += 1
        try:
            while not stop.is_set():
                received = receive()
                if received is None:
                    clock.sleep(IDLE_WAIT)
                    continue
                message, tree = received
                run_id = message.metadata.run_id
                if run_id not in known_runs:
                    run = get_run(run_id)
                    get_fab(run.fab_hash, run_id)
                    known_runs.add(run_id)
                contents = pull_objects(
                    [subtree.object_id for subtree in iterate_object_tree(tree)], partial(pull_object, run_id)
                )
                confirm_received(run_id, message.metadata.message_id)
                instruction = inflate_object_from_contents(tree.object_id, contents)
                assert isinstance(instruction, Message)
                instruction.metadata.__dict__["_message_id"] = tree.object_id  # as Flower's ClientApp sets it
                started = time.monotonic()
                content, server_round = answer(instruction, client_id, args.compute_seconds, args.noise, rng)
                reply = Message(content, reply_to=instruction)
                reply.metadata.__dict__["_message_id"] = reply.object_id
                while time.monotonic() < started + args.compute_seconds:  # the SuperNode's look for the reply
                    clock.sleep(REPLY_WAIT)
                objects = get_all_nested_objects(reply)
                wanted, session = send(
                    remove_content_from_message(reply), get_object_tree(reply), time.monotonic() - started
                )
                push_object_contents_from_iterable(
                    ((object_id, obj.deflate()) for object_id, obj in objects.items() if object_id in wanted),
                    partial(push_object, run_id, session),
                )
                counters.reply_sent(
                    {
                        "run_id": run_id,
                        "round": server_round,
                        "node_id": node_id,
                        "client_id": client_id,
                        "compute_seconds": args.compute_seconds,
                        "t": time.monotonic(),
                    }
                )
        except Exception as error:  # recorded: the node stops, as a SuperNode would
            with counters.lock:
                counters.failed.append(f"node {index}: {type(error).__name__}: {error}"[:500])
        finally:
            with counters.lock:
                counters.connected -= 1


def own_connections() -> None:
    """Give each node's channel a TCP connection of its own, as each SuperNode process has one: gRPC shares one
    connection among a process's channels to the same address unless a channel asks for a subchannel pool of its own.
    (Flower's `create_channel` opens its channel through `grpc.insecure_channel`.) And leave out the channel's
    connectivity watch, which Flower's connection subscribes to only to log state changes: it sends nothing, but it is
    a thread per channel that wakes five times a second, and a thousand of them in one process took more CPU than
    the nodes' calls."""
    shared = grpc.insecure_channel

    def insecure_channel_of_its_own(target: str, options=None, compression=None) -> grpc.Channel:
        channel = shared(target, [*(options or ()), ("grpc.use_local_subchannel_pool", 1)], compression)
        channel.subscribe = lambda callback, try_to_connect=False: None  # type: ignore[method-assign]
        return channel

    grpc.insecure_channel = insecure_channel_of_its_own


def write_stats(path: Path, counters: Counters, stop: threading.Event) -> None:
    with path.open("a") as stats:
        while True:
            stats.write(json.dumps(counters.snapshot()) + "\n")
            stats.flush()
            if stop.wait(STATS_INTERVAL):
                stats.write(json.dumps({**counters.snapshot(), "final": True}) + "\n")
                return


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--superlink", required=True, help="the Fleet API's host:port")
    parser.add_argument("--nodes", type=int, required=True, help="nodes in all (client ids load-0, load-1, ...)")
    parser.add_argument("--processes", type=int, default=1, help="processes sharing them (forks of this one)")
    parser.add_argument("--compute-seconds", type=float, default=1.0, help="each reply's simulated compute")
    parser.add_argument(
        "--poll", type=float, default=DEFAULT_POLL, help="fedbayes supernode's FEDBAYES_SUPERNODE_POLL (seconds)"
    )
    parser.add_argument("--noise", type=float, default=0.01, help="sd of the noise added to the received weights")
    parser.add_argument("--connect-rate", type=float, default=100.0, help="nodes started per second, per process")
    parser.add_argument("--output", type=Path, required=True, help="a directory: nodes-<i>.jsonl, replies-<i>.jsonl")
    parser.add_argument(
        "--key-curve",
        choices=("p256", "p384"),
        default="p256",
        help="the curve of each node's self-registered key: fedbayes supernode's (p256) or Flower's (p384)",
    )
    return parser.parse_args(argv)


def run_share(index: int, args: argparse.Namespace) -> None:
    """Process `index`'s share of the nodes, until SIGTERM (or SIGINT)."""
    first, end = index * args.nodes // args.processes, (index + 1) * args.nodes // args.processes
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    counters = Counters(args.output / f"replies-{index}.jsonl")
    stats = threading.Thread(
        target=write_stats, args=(args.output / f"nodes-{index}.jsonl", counters, stop), daemon=True
    )
    stats.start()
    nodes = []
    for node_index in range(first, end):
        if stop.is_set():
            break
        node = threading.Thread(target=serve, args=(node_index, args, counters, stop), daemon=True)
        node.start()
        nodes.append(node)
        stop.wait(1.0 / args.connect_rate)
    stop.wait()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for node in nodes:
        node.join(max(0.0, deadline - time.monotonic()))
    stats.join()


def main(argv: list[str]) -> None:
    """Fork the other processes before anything starts a thread or a gRPC channel: they share this one's imports
    (torch, through the codec) page by page. This process runs share 0; once it is stopped, it stops the others and
    waits for them."""
    args = parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    shorten_pull_backoff()  # as fedbayes supernode does
    if args.key_curve == "p256":
        signing_with_p256(connection)  # as fedbayes supernode does
    own_connections()
    children = []
    for index in range(1, args.processes):
        pid = os.fork()
        if pid == 0:
            name_this_process(f"fleet-nodes-{index}")
            run_share(index, args)
            os._exit(0)  # the nodes' gRPC threads are daemons; nothing is left to tear down
        children.append(pid)
    run_share(0, args)
    for child in children:
        os.kill(child, signal.SIGTERM)
    status = max((os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) for child in children), default=0)
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
