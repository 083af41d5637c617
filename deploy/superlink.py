"""`fedbayes superlink`: Flower's own SuperLink, whose log stream ends sooner after its run, whose database waits
longer for its lock, and which refuses a reply over `--max-message-mb` before it stores it.

`flwr run --stream` (what `fedbayes run` and so `fedbayes local` wait on) ends when the SuperLink ends the run's log
stream, and Flower 1.39's SuperLink looks for new log lines and for the run's end every 0.5 s
(`LOG_STREAM_INTERVAL`, flwr/superlink/servicer/control/control_handlers.py): every run's command waited 0-0.5 s
after its ServerApp had ended. This entry point runs the same `flower-superlink` (same arguments and behaviour)
with that interval at `STREAM_INTERVAL`; a look is two reads of the SuperLink's state, only while a log is
streamed. Once Flower has stopped its servers the process ends without the interpreter's teardown
(`exit_without_teardown`).

A SuperLink with `--database FILE` (TLS deployments, compose) keeps its state in SQLite, whose requests wait at most
5 s for the database's write lock (Flower's `busy_timeout` pragma); past that the request fails with "database is
locked", which Flower's SuperLink answers as a 500 (HTTP) or INTERNAL (gRPC). No Flower client retries those: the
ServerApp's poll that got it ended the run (seen in a compose federation on a loaded machine), the ServerApp's
log uploader thread ends (the run's later lines never reach `flwr log`), and a SuperNode drops the instruction it was
receiving. Here requests wait up to `BUSY_TIMEOUT_MS` instead: a slow disk or a starved process delays the
federation rather than breaking it (tests/integration/test_superlink_busy.py holds the lock 8 s).

Flower 1.39 moves a reply as a tree of content-addressed objects: the SuperNode registers the reply and its object
tree (Fleet `PushMessages`, which stores the reply and answers with the objects to push), then pushes each object
(`PushObject`, one call per object; an array is cut into 5 MiB chunks), and the SuperLink stores every one it is sent
(in memory, or in its SQLite file). The tree names no sizes, and the Fleet API takes calls of up to 2 GiB - 1
(`GRPC_MAX_MESSAGE_LENGTH`), so a reply of any size was stored whole before the ServerApp could refuse it: a 200 MiB
pad under `max-payload-mb=1` took the SuperLink to 0.55 GB with --database (benchmarks/oversize_reply.py). With
`--max-message-mb MB` (default: max-payload-mb's default) this SuperLink
- takes Fleet calls of at most `call_bytes_limit(MB)` (MB or one array chunk, plus framing), refused by gRPC before
  they are read (`bounding_fleet_calls`);
- counts each reply's objects as they arrive and refuses the object that would take them past
  `message_bytes_limit(MB)` before storing it (`ReplyBound`, `counting_reply_objects`). The refused reply is dropped
  with what was stored of it, the SuperNode's push fails with RESOURCE_EXHAUSTED naming the limit, and an error reply
  naming it stands in for it (`refuse_reply`), which the ServerApp takes as that node's refusal;
- hands the ServerApp a reply only once all its objects are stored (`holding_back_unfinished_replies`), so the
  ServerApp never starts pulling a reply that is then refused (nor waits on the objects of one a SuperNode stopped
  pushing: that node is late, as one that never replied).
`fedbayes local` sets MB to its run's max-payload-mb; a deployment passes it (docker-compose.yml).

The patches live in fedbayes.flowerseam.superlink, tied to the code they were read in: any Flower but the one
fedbayes.flowerseam.version names is refused rather than patched blindly.
"""

from __future__ import annotations

import argparse

from fedbayes.deploy.processes import exit_without_teardown
from fedbayes.flowerseam.superlink import (
    bound_messages,
    index_instructions_by_node,
    passing_runtime_requests_through,
    patch_log_stream_and_database,
    queueing_pending_calls,
    run_flower_superlink,
)
from fedbayes.tasks.message_limits import MAX_MESSAGE_OPTION, max_message_option

STREAM_INTERVAL = 0.1  # seconds between a streamed log's looks for new lines and for the run's end (Flower: 0.5)
BUSY_TIMEOUT_MS = 60_000  # how long a request waits for the SQLite database's lock (Flower: 5000)
# calls the Fleet API holds for a busy server before gRPC drops some, and before it drops all (gRPC: 1000, 3000)
PENDING_CALLS = (20_000, 40_000)


def check_fleet_api_type(argv: list[str]) -> None:
    """The reply bound is on Flower's gRPC request-response Fleet API (its default); refuse another.

    Args:
        argv: `flower-superlink`'s arguments.

    Raises:
        SystemExit: --fleet-api-type is not grpc-rere.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--fleet-api-type", default="grpc-rere")
    fleet_api_type = parser.parse_known_args(argv)[0].fleet_api_type
    if fleet_api_type != "grpc-rere":
        raise SystemExit(
            f"fedbayes superlink bounds replies ({MAX_MESSAGE_OPTION}) on the grpc-rere Fleet API only, "
            f"not --fleet-api-type {fleet_api_type}; use `flower-superlink` for that"
        )


def main(argv: list[str]) -> int:
    """Run `flower-superlink` with `argv`, less our --max-message-mb, as its arguments; the process ends with it
    (`exit_without_teardown`).

    Args:
        argv: `fedbayes superlink`'s arguments: `flower-superlink`'s, and ours (--max-message-mb).

    Returns:
        Nothing: the process ends with the SuperLink.

    Raises:
        SystemExit: a bad --max-message-mb, a Fleet API other than grpc-rere, or a Flower other than the one patched.
    """
    max_message_mb, flower_argv = max_message_option(argv)
    check_fleet_api_type(flower_argv)
    patch_log_stream_and_database(STREAM_INTERVAL, BUSY_TIMEOUT_MS)
    bound_messages(max_message_mb)
    entry = run_flower_superlink(flower_argv)
    index_instructions_by_node()
    passing_runtime_requests_through()
    queueing_pending_calls(*PENDING_CALLS)
    exit_without_teardown(entry)
