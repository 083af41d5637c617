"""Every patch in the seam, with the Flower code it was read in: a source digest per piece of Flower code the patch
replaces, wraps or relies on, recorded on Flower `version.PATCHED_FLOWER`. tests/unit/test_flower_patches.py
recomputes them: a digest that differs names the patch and the Flower code to re-read before the pin moves.
docs/reference/flower-patches.md has each patch's section (`Patch.doc`): what Flower does, why fedbayes changes it,
and the upstream change that would make the patch unnecessary."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Patch:
    """One patch: the seam function that applies it, and the Flower code it rests on.

    Attributes:
        name: the function in fedbayes.flowerseam that applies it ("supernode.polling_time").
        doc: its section's anchor in docs/reference/flower-patches.md.
        flower: "module:qualified.name" (or "module" for a whole module) of each piece of Flower code; its digest
            when the patch was read is FLOWER_DIGESTS[target].
    """

    name: str
    doc: str
    flower: tuple[str, ...]


def flower_source(target: str) -> str:
    """The source text of Flower's `target` ("module:qualified.name", or "module"), read from its file, not from the
    live object, so that a patch applied in this process does not change it.

    Args:
        target: what to read.

    Returns:
        The module's text, or the definition's (a function, class or assignment).

    Raises:
        LookupError: Flower has no such module, or its module no such definition, any more.
    """
    module_name, _, qualified = target.partition(":")
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise LookupError(f"Flower has no module {module_name}")
    text = Path(spec.origin).read_text()
    node: ast.AST | None = ast.parse(text)
    for name in qualified.split(".") if qualified else ():
        node = next((child for child in getattr(node, "body", []) if name in _defined(child)), None)
        if node is None:
            raise LookupError(f"{module_name} defines no {qualified}")
    return text if node is None or not qualified else ast.get_source_segment(text, node) or ""


def _defined(node: ast.AST) -> set[str]:
    """The names a module's or class's statement `node` defines."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {target.id for target in targets if isinstance(target, ast.Name)}


def flower_digest(target: str) -> str:
    """The first 16 hex digits of the SHA-256 of `flower_source(target)`.

    Args:
        target: `module` or `module:qualified.name`, as `flower_source` takes it.

    Returns:
        The digest of the installed Flower's source for it.

    Raises:
        LookupError: Flower has no such module, or its module no such definition, any more.
    """
    return hashlib.sha256(flower_source(target).encode()).hexdigest()[:16]


SUPERNODE = "flwr.supernode.start_client_internal"
INFLATABLE = "flwr.supercore.inflatable.inflatable_utils"
LINKSTATE = "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState"
FLEET_SERVICER = "flwr.server.superlink.fleet.grpc_rere.fleet_servicer:FleetServicer"

PATCHES = (
    Patch(
        "supernode.polling_time",
        "the-supernodes-idle-sleep",
        (f"{SUPERNODE}:start_client_internal", f"{SUPERNODE}:_push_messages"),
    ),
    Patch(
        "supernode.dropping_stopped_runs",
        "a-stopped-runs-message-left-behind",
        (f"{SUPERNODE}:_pull_and_store_message", "flwr.supercore.run:RunNotRunningException"),
    ),
    Patch(
        "supernode.refusing_oversize_instructions",
        "instructions-over-max-message-mb",
        (
            f"{SUPERNODE}:_pull_and_store_message",
            f"{SUPERNODE}:_insert_message",
            f"{INFLATABLE}:pull_objects",
        ),
    ),
    Patch("supernode.bounding_fleet_calls", "instructions-over-max-message-mb", (f"{SUPERNODE}:_init_connection",)),
    Patch("supernode.ringing", "the-executors-doorbell", (f"{SUPERNODE}:_pull_and_store_message",)),
    Patch(
        "supernode.signing_with_p256",
        "the-self-registered-supernodes-key",
        (
            "flwr.client.grpc_rere_client.connection:grpc_request_response",
            "flwr.supercore.primitives.asymmetric:generate_key_pairs",
            "flwr.server.superlink.fleet.grpc_rere.node_auth_server_interceptor:NodeAuthServerInterceptor",
        ),
    ),
    Patch(
        "object_pulls.shorten_pull_backoff",
        "the-object-pulls-first-back-off",
        (f"{INFLATABLE}:pull_objects", f"{INFLATABLE}:pull_and_inflate_object_from_tree"),
    ),
    Patch(
        "object_pulls.bound_reply_pulls",
        "replies-over-max-payload-mb-in-the-serverapp",
        (
            "flwr.superlink.grid.http_grid:HttpGrid.pull_messages",
            "flwr.superlink.grid.http_grid:HttpGrid._runtime_client",
            f"{INFLATABLE}:pull_objects",
        ),
    ),
    Patch(
        "superlink.patch_log_stream_and_database",
        "the-log-streams-interval-and-the-databases-lock-wait",
        (
            "flwr.superlink.servicer.control.control_handlers:_stream_logs",
            "flwr.supercore.sql_mixin:_set_sqlite_pragmas",
            "flwr.supercore.constant:SQLITE_PRAGMAS",
        ),
    ),
    Patch(
        "superlink.bounding_fleet_calls",
        "replies-over-max-message-mb-on-the-superlink",
        ("flwr.superlink.cli.flower_superlink:_run_fleet_api_grpc_rere",),
    ),
    Patch(
        "superlink.bounding_replies",
        "replies-over-max-message-mb-on-the-superlink",
        (
            f"{FLEET_SERVICER}.PushMessages",
            f"{FLEET_SERVICER}.PushObject",
            "flwr.superlink.servicer.runtime.runtime_handlers:pull_messages",
            "flwr.supercore.corestate.corestate:CoreState._store_generated_message",
        ),
    ),
    Patch(
        "superlink.index_instructions_by_node",
        "instruction-polls-that-walk-every-message",
        (f"{LINKSTATE}.__init__", f"{LINKSTATE}.get_message_ins", f"{LINKSTATE}._check_stored_messages"),
    ),
    Patch(
        "simulation_polls.check_only_own_messages",
        "instruction-polls-that-walk-every-message",
        (
            f"{LINKSTATE}.get_message_ins",
            "flwr.superlink.grid.inmemory_grid:InMemoryGrid.__init__",
        ),
    ),
    Patch(
        "superlink.passing_runtime_requests_through",
        "the-control-apis-middlewares-on-runtime-requests",
        ("flwr.superlink.routers.control.middlewares",),
    ),
    Patch(
        "superlink.queueing_pending_calls",
        "grpcs-pending-call-limits",
        ("flwr.supercore.grpc:generic_create_grpc_server",),
    ),
    Patch("flwr_cli.be_patient", "the-local-superlinks-timeouts", ("flwr.cli.local_superlink",)),
    Patch(
        "flwr_cli.bundle_quickly",
        "listing-a-project-for-its-fab",
        (
            "flwr.cli.utils:collect_files",
            "flwr.supercore.constant:APP_PUBLISH_EXCLUDE_PATTERNS",
            "flwr.cli.build:build_fab_from_disk",
        ),
    ),
    Patch(
        "executor.flush_logs_exactly",
        "the-serverapps-last-log-flush",
        (
            "flwr.supercore.logger:flush_logs",
            "flwr.supercore.logger:start_log_uploader",
            "flwr.superlink.runtime.run_serverapp:run_serverapp",
        ),
    ),
)


# What `flower_digest` gave for each target on Flower PATCHED_FLOWER (tests/unit/test_flower_patches.py checks them)
FLOWER_DIGESTS = {
    "flwr.client.grpc_rere_client.connection:grpc_request_response": "5c708e16264f125b",
    "flwr.supercore.primitives.asymmetric:generate_key_pairs": "93c4133c96e889b3",
    "flwr.server.superlink.fleet.grpc_rere.node_auth_server_interceptor:NodeAuthServerInterceptor": "3ccea147c5e50412",
    "flwr.cli.build:build_fab_from_disk": "18b4d7d20642bb50",
    "flwr.cli.local_superlink": "4ebade30eb06eb74",
    "flwr.cli.utils:collect_files": "67f9a21cdce322d8",
    "flwr.server.superlink.fleet.grpc_rere.fleet_servicer:FleetServicer.PushMessages": "1a09b32476cff67c",
    "flwr.server.superlink.fleet.grpc_rere.fleet_servicer:FleetServicer.PushObject": "8015efdea4abb613",
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.__init__": "dce055db10356815",
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState._check_stored_messages": "9702ffbd8c4c51fd",
    "flwr.server.superlink.linkstate.in_memory_linkstate:InMemoryLinkState.get_message_ins": "ebd0eddf4d9d8d30",
    "flwr.supercore.constant:APP_PUBLISH_EXCLUDE_PATTERNS": "026edd0d8dade5c9",
    "flwr.supercore.constant:SQLITE_PRAGMAS": "c9aa94367c881f79",
    "flwr.supercore.corestate.corestate:CoreState._store_generated_message": "5c397794717c0c35",
    "flwr.supercore.grpc:generic_create_grpc_server": "858c3179ebce8ebc",
    "flwr.supercore.inflatable.inflatable_utils:pull_and_inflate_object_from_tree": "977cb8a15932e73e",
    "flwr.supercore.inflatable.inflatable_utils:pull_objects": "0f5b6d34fcd4fd2d",
    "flwr.supercore.logger:flush_logs": "2f39da4c12c9ade6",
    "flwr.supercore.logger:start_log_uploader": "d5cac4d1881902bc",
    "flwr.supercore.run:RunNotRunningException": "f46a6dc0c0ca77a2",
    "flwr.supercore.sql_mixin:_set_sqlite_pragmas": "be86301a48b6be69",
    "flwr.superlink.cli.flower_superlink:_run_fleet_api_grpc_rere": "502e052859e111bc",
    "flwr.superlink.grid.http_grid:HttpGrid._runtime_client": "b691e6710df3488f",
    "flwr.superlink.grid.http_grid:HttpGrid.pull_messages": "5455e7b98a374324",
    "flwr.superlink.grid.inmemory_grid:InMemoryGrid.__init__": "11956834f55cb8f1",
    "flwr.superlink.routers.control.middlewares": "679b8f95787dd840",
    "flwr.superlink.runtime.run_serverapp:run_serverapp": "f11f1b60804cfef4",
    "flwr.superlink.servicer.control.control_handlers:_stream_logs": "07ba59bcf973fa19",
    "flwr.superlink.servicer.runtime.runtime_handlers:pull_messages": "d54bb17d5ba96f5c",
    "flwr.supernode.start_client_internal:_init_connection": "69fdbe7c8d6a7701",
    "flwr.supernode.start_client_internal:_insert_message": "39e7f57f9c916532",
    "flwr.supernode.start_client_internal:_pull_and_store_message": "234b741865b0adf4",
    "flwr.supernode.start_client_internal:_push_messages": "de42aae222c91a6c",
    "flwr.supernode.start_client_internal:start_client_internal": "0d9fa1443a58b122",
}
