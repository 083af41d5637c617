"""Throughput of a large model update through our wire codec and through Flower 1.39's own wire path.

What is measured (median of `--repeats` runs, reported in MB/s of float32 payload, 1 MB = 1e6 bytes):

  codec encode          protos.codec.encode(Reply, FedAvgReply, {"weights": ...}) -> RecordDict
  codec decode          protos.codec.decode(...) -> Payload, incl. schema/shape/finiteness checks
  codec encode+decode   both, timed together
  flower deflate        what Grid.push_messages / the SuperNode do before sending: compute every
                        object id (sha256 of each deflated object) and deflate the Message tree
                        (Message -> RecordDict -> ArrayRecord -> Array -> 5 MiB ArrayChunks)
  superlink verify      what the SuperLink's object store does with every pushed object:
                        re-hash it and validate its header
  grpc framing          PushObjectRequest(object_content=...) serialize + parse, the protobuf the
                        bytes actually ride in over gRPC (once per object)
  flower inflate        inflate_object_from_contents: bytes -> Message on the receiving side
  flower deflate+inflate  one hop's (de)serialization, timed together
  legacy serde          flwr.common.serde recorddict_to_proto -> bytes -> recorddict_from_proto.
                        For reference only: in 1.39 message content does NOT travel this way (the
                        link state stores messages without content; content goes through the
                        inflatable object store above).

"faults" is the median number of minor page faults per run (4 KiB pages touched for the first time):
at these sizes the cost is dominated by copying into freshly allocated memory, so timings move with
the allocator's state and with other load on the machine; compare stages within one run.

The payload is a FedAvgReply whose "weights" group holds `--tensors` random float32 tensors totalling
`--megabytes` MB (random data, so nothing compresses or deduplicates; Flower dedups identical chunks).
No Flower run context or network is needed; everything runs in this process.

Run:  python benchmarks/payload_codec.py [--megabytes 50 --tensors 5 --repeats 7]
Writes benchmarks/results/payload_codec.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python benchmarks/payload_codec.py` from a source checkout

from flwr.app import Message, MessageType, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.message_pb2 import PushObjectRequest
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_id,
    no_object_id_recompute,
)
from flwr.supercore.inflatable.inflatable_utils import (
    inflate_object_from_contents,
    validate_object_content,
)

from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import decode, encode, new_header

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "payload_codec.json"
BYTES_PER_MB = 1_000_000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=50.0, help="total float32 payload in MB (1e6 bytes)")
    parser.add_argument("--tensors", type=int, default=5, help="number of tensors the payload is split into")
    parser.add_argument("--repeats", type=int, default=7, help="timed repetitions per stage (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    return parser.parse_args()


def make_weights(megabytes: float, count: int, seed: int) -> dict[str, np.ndarray]:
    """Random (incompressible, chunk-unique) float32 tensors totalling `megabytes` MB."""
    floats_each = int(megabytes * BYTES_PER_MB / 4 / count)
    rng = np.random.default_rng(seed)
    return {f"layer{i}": rng.standard_normal(floats_each, dtype=np.float32) for i in range(count)}


def make_reply() -> pb.Reply:
    return pb.Reply(
        header=new_header("benchmark", server_round=1, client_id="client-0"),
        num_examples=6000,
        train_loss=0.5,
        compute_seconds=1.0,
    )


def encode_reply(weights: dict[str, np.ndarray]) -> RecordDict:
    return encode(make_reply(), pb.FedAvgReply(), {"weights": weights})


def decode_reply(content: RecordDict, layout: dict[str, tuple[int, ...]]) -> None:
    decode(content, pb.Reply, pb.FedAvgReply, {"weights": layout}, sender="client-0")


def new_message(content: RecordDict) -> Message:
    """A reply Message as a SuperNode sends it; explicit Metadata needs no Flower run context.

    Build a fresh one for every timing: Flower caches object ids and chunks on the objects.
    """
    metadata = Metadata(
        run_id=1,
        message_id="",
        src_node_id=2,
        dst_node_id=1,
        reply_to_message_id="0" * 64,
        group_id="1",
        created_at=time.time(),
        ttl=3600.0,
        message_type=MessageType.TRAIN,
    )
    return make_message(metadata=metadata, content=content)


def deflate_message(message: Message) -> tuple[str, dict[str, bytes]]:
    """Mirror Grid.push_messages: message id first (hashes the whole tree), then deflate every object."""
    with no_object_id_recompute():
        message_id = message.object_id
        objects = get_all_nested_objects(message)
        return message_id, {object_id: obj.deflate() for object_id, obj in objects.items()}


def verify_objects(contents: dict[str, bytes]) -> None:
    """What the SuperLink's object store checks for every object it receives."""
    for object_id, content in contents.items():
        if get_object_id(content) != object_id:
            raise AssertionError(f"object {object_id} does not hash to its id")
        validate_object_content(content)


def frame_objects(contents: dict[str, bytes]) -> None:
    """Serialize and parse the gRPC request each object is pushed in."""
    for object_id, content in contents.items():
        wire = PushObjectRequest(object_id=object_id, object_content=content).SerializeToString()
        PushObjectRequest.FromString(wire)


def inflate_message(message_id: str, contents: dict[str, bytes]) -> Message:
    return inflate_object_from_contents(message_id, dict(contents))  # it consumes the dict it is given


def legacy_serde_round_trip(content: RecordDict) -> RecordDict:
    wire = recorddict_to_proto(content).SerializeToString()
    return recorddict_from_proto(ProtoRecordDict.FromString(wire))


def minor_page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_stage(
    repeats: int, prepare: Callable[[], object], stage: Callable[[object], object]
) -> tuple[list[float], list[int]]:
    """Time `stage(prepare())` `repeats` times; `prepare` is untimed (fresh inputs each run).

    Also counts minor page faults: at these sizes fresh memory from the OS (page faults) is a large,
    noisy part of the cost, which explains most of the spread between repetitions.
    """
    seconds, faults = [], []
    for _ in range(repeats):
        argument = prepare()
        gc.collect()  # keep a previous run's garbage from being collected inside this timing
        faults_before = minor_page_faults()
        started = time.perf_counter()
        stage(argument)
        seconds.append(time.perf_counter() - started)
        faults.append(minor_page_faults() - faults_before)
        del argument
    return seconds, faults


def run_stages(weights: dict[str, np.ndarray], repeats: int) -> dict[str, tuple[list[float], list[int]]]:
    layout = {name: value.shape for name, value in weights.items()}
    encoded = encode_reply(weights)
    message_id, contents = deflate_message(new_message(encode_reply(weights)))
    stages: dict[str, tuple[Callable[[], object], Callable[[object], object]]] = {
        "codec encode": (lambda: weights, encode_reply),
        "codec decode": (lambda: encode_reply(weights), lambda content: decode_reply(content, layout)),
        "codec encode+decode": (lambda: weights, lambda w: decode_reply(encode_reply(w), layout)),
        "flower deflate": (lambda: new_message(encode_reply(weights)), deflate_message),
        "superlink verify": (lambda: contents, verify_objects),
        "grpc framing": (lambda: contents, frame_objects),
        "flower inflate": (lambda: contents, lambda c: inflate_message(message_id, c)),
        "flower deflate+inflate": (
            lambda: new_message(encode_reply(weights)),
            lambda message: inflate_message(*deflate_message(message)),
        ),
        "legacy serde round trip": (lambda: encoded, legacy_serde_round_trip),
    }
    return {name: time_stage(repeats, prepare, stage) for name, (prepare, stage) in stages.items()}


def check_round_trip(weights: dict[str, np.ndarray]) -> int:
    """Decode what went through codec + one Flower hop and compare bit for bit; returns object count."""
    message_id, contents = deflate_message(new_message(encode_reply(weights)))
    received = inflate_message(message_id, contents)
    layout = {name: value.shape for name, value in weights.items()}
    payload = decode(received.content, pb.Reply, pb.FedAvgReply, {"weights": layout}, sender="client-0")
    for name, value in weights.items():
        if not np.array_equal(payload.tensors["weights"][name], value):
            raise AssertionError(f"{name} changed in transit")
    return len(contents)


def summarize(timings: dict[str, tuple[list[float], list[int]]], payload_mb: float) -> dict[str, dict[str, float]]:
    summary = {}
    for name, (seconds, faults) in timings.items():
        median = statistics.median(seconds)
        summary[name] = {
            "median_seconds": median,
            "min_seconds": min(seconds),
            "mb_per_second": payload_mb / median,
            "median_minor_page_faults": statistics.median(faults),
            "seconds": seconds,
        }
    return summary


def format_table(summary: dict[str, dict[str, float]], payload_mb: float) -> str:
    lines = [f"{'stage':<26} {'median ms':>10} {'min ms':>9} {'MB/s':>9} {'faults':>8}   ({payload_mb:.1f} MB float32)"]
    for name, row in summary.items():
        lines.append(
            f"{name:<26} {row['median_seconds'] * 1e3:>10.1f} {row['min_seconds'] * 1e3:>9.1f}"
            f" {row['mb_per_second']:>9.0f} {row['median_minor_page_faults']:>8.0f}"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    load_at_start = os.getloadavg()
    weights = make_weights(args.megabytes, args.tensors, args.seed)
    payload_mb = sum(value.nbytes for value in weights.values()) / BYTES_PER_MB
    objects = check_round_trip(weights)
    summary = summarize(run_stages(weights, args.repeats), payload_mb)
    print(format_table(summary, payload_mb))
    print(f"\n{objects} Flower objects per message; load average at start {load_at_start[0]:.2f}")
    result = {
        "benchmark": "payload_codec",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_at_start": load_at_start,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "payload_mb": payload_mb,
        "tensors": args.tensors,
        "repeats": args.repeats,
        "flower_objects_per_message": objects,
        "stages": summary,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
