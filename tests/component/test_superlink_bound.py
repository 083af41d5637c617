"""`fedbayes superlink --max-message-mb` (deploy/superlink.py) on Flower's own Fleet servicer, Runtime API handler
and in-memory link state: a reply over the limit is refused at the object that passes it, before that object is
stored, what was stored of it is dropped, and an error reply naming the limit stands in for it; a reply under the
limit reaches the ServerApp once all its objects are stored, not before. (Over real gRPC, with a real ServerApp:
tests/integration/test_oversize_reply.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.app.message.message import remove_content_from_message
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.fleet_pb2 import PushMessagesRequest
from flwr.proto.message_pb2 import PushObjectRequest
from flwr.proto.node_pb2 import Node
from flwr.proto.runtime_pb2 import PullAppMessagesRequest
from flwr.server.superlink.fleet.grpc_rere.fleet_servicer import FleetServicer
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree, iterate_object_tree
from flwr.superlink.servicer.runtime import runtime_handlers

from fedbayes.deploy import superlink
from fedbayes.flowerseam import superlink as superlink_patches
from tests.support.linkstate import RUN_ID, simulated_link


class Aborted(Exception):
    pass


class Context:
    """A gRPC servicer context: `abort` raises, as grpc's does."""

    def abort(self, code, details):
        self.code, self.details = code, details
        raise Aborted(details)


@pytest.fixture
def bounded(monkeypatch):
    """Flower's Fleet servicer and Runtime handler bounded at 1 MiB, restored after the test; (bound, a link state
    holding one instruction to one node, that instruction, the servicer)."""
    for name in ("PushMessages", "PushObject"):
        monkeypatch.setattr(FleetServicer, name, getattr(FleetServicer, name))
    monkeypatch.setattr(runtime_handlers, "pull_messages", runtime_handlers.pull_messages)
    bound = superlink_patches.ReplyBound(1.0, stale_seconds=180.0)
    superlink_patches.bounding_replies(bound)
    grid, (node,) = simulated_link(1, [(0, 0.0)])
    (instruction,) = grid.state.get_message_ins(node_id=node, limit=1)
    factory = SimpleNamespace(state=lambda: grid.state)
    return bound, grid.state, instruction, FleetServicer(factory, None, enable_supernode_auth=False)


def reply_to(instruction: Message, padding_mb: float) -> tuple[Message, dict[str, bytes]]:
    """A reply padded with `padding_mb` MiB of random float32 (5 MiB chunks), and its objects by id."""
    padding = np.random.default_rng(0).standard_normal(int(padding_mb * 2**20) // 4, dtype=np.float32)
    reply = Message(RecordDict({"pad": ArrayRecord({"x": Array(padding)})}), reply_to=instruction)
    reply.metadata.__dict__["_message_id"] = reply.object_id
    return reply, {object_id: item.deflate() for object_id, item in get_all_nested_objects(reply).items()}


def register(servicer: FleetServicer, reply: Message):
    """What the SuperNode does first (Fleet PushMessages): the reply without its content, and its object tree."""
    request = PushMessagesRequest(
        node=Node(node_id=reply.metadata.src_node_id),
        messages_list=[message_to_proto(remove_content_from_message(reply))],
        message_object_trees=[get_object_tree(reply)],
    )
    return servicer.PushMessages(request, Context())


def push(servicer: FleetServicer, reply: Message, session_id: str, object_id: str, content: bytes):
    request = PushObjectRequest(
        node=Node(node_id=reply.metadata.src_node_id),
        run_id=RUN_ID,
        object_id=object_id,
        object_content=content,
        session_id=session_id,
    )
    return servicer.PushObject(request, Context())


def pull(state, instruction: Message) -> list[Message]:
    """The ServerApp's ask for the reply to `instruction` (Runtime API PullMessages)."""
    request = PullAppMessagesRequest(message_ids=[instruction.metadata.message_id])
    response = runtime_handlers.pull_messages(request, state, SimpleNamespace(run_id=RUN_ID))
    return [message_from_proto(proto) for proto in response.messages_list]


def test_a_reply_over_the_limit_is_refused_before_it_is_stored_and_an_error_stands_in(bounded):
    bound, state, instruction, servicer = bounded
    reply, objects = reply_to(instruction, padding_mb=20)  # 4 chunks of 5 MiB
    session = register(servicer, reply).session_id
    assert pull(state, instruction) == []  # the ServerApp does not see a reply still being pushed
    pushed = []
    with pytest.raises(Aborted) as refused:
        for tree in iterate_object_tree(get_object_tree(reply)):  # children first, as Flower's SuperNode pushes
            pushed.append(push(servicer, reply, session, tree.object_id, objects[tree.object_id]))
    assert pushed == []  # the first chunk (5 MiB) is already over 1 MiB + framing
    assert "is over --max-message-mb=1 (5.0 MiB of its objects sent, the rest not taken)" in str(refused.value)
    assert all(not state.object_store.get(object_id) for object_id in objects)  # nothing of the reply is kept
    with pytest.raises(Aborted):  # its later objects are refused at once
        push(servicer, reply, session, *next(iter(objects.items())))

    (error_reply,) = pull(state, instruction)
    assert error_reply.has_error() and error_reply.metadata.reply_to_message_id == instruction.metadata.message_id
    assert "the SuperLink refused the reply of node" in error_reply.error.reason
    assert error_reply.metadata.src_node_id == reply.metadata.src_node_id
    assert state.object_store.get(error_reply.metadata.message_id)  # the ServerApp pulls it like any reply
    # handed out once: asked again (the ServerApp does not), Flower answers for an instruction it no longer holds
    assert all("refused the reply" not in again.error.reason for again in pull(state, instruction))
    assert bound.by_instruction == {}


def test_a_reply_under_the_limit_reaches_the_serverapp_once_whole(bounded):
    _, state, instruction, servicer = bounded
    reply, objects = reply_to(instruction, padding_mb=0.5)
    session = register(servicer, reply).session_id
    trees = list(iterate_object_tree(get_object_tree(reply)))
    for tree in trees[:-1]:
        assert push(servicer, reply, session, tree.object_id, objects[tree.object_id]).stored
        assert pull(state, instruction) == []
    assert push(servicer, reply, session, trees[-1].object_id, objects[trees[-1].object_id]).stored
    (pulled,) = pull(state, instruction)
    assert not pulled.has_error() and pulled.metadata.message_id == reply.metadata.message_id


def test_the_bound_forgets_a_push_abandoned_past_flowers_session_lifetime(bounded):
    """A SuperNode that stops pushing: once Flower's push session is over, the ServerApp is shown the reply (and
    Flower's own pull reports its objects missing), instead of waiting on it until the run ends."""
    bound, state, instruction, servicer = bounded
    bound.stale_seconds = 0.0
    reply, _ = reply_to(instruction, padding_mb=0.5)
    register(servicer, reply)
    assert bound.sort([instruction.metadata.message_id], RUN_ID) == ([instruction.metadata.message_id], [])
    assert bound.by_session == {}


def test_the_fleet_api_takes_calls_of_the_limit_or_one_array_chunk(monkeypatch):
    import importlib

    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

    from fedbayes.flowerseam.object_pulls import call_bytes_limit
    from fedbayes.tasks.message_limits import OBJECT_OVERHEAD_BYTES

    flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")
    monkeypatch.setattr(flower_superlink, "GRPC_MAX_MESSAGE_LENGTH", flower_superlink.GRPC_MAX_MESSAGE_LENGTH)
    superlink_patches.bounding_fleet_calls(100.0)
    assert flower_superlink.GRPC_MAX_MESSAGE_LENGTH == 100 * 2**20 + OBJECT_OVERHEAD_BYTES
    assert call_bytes_limit(1.0) == FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE + OBJECT_OVERHEAD_BYTES  # a chunk gets through
    assert call_bytes_limit(4096.0) == 2**31 - 1  # gRPC's own: a larger message travels as several objects


def test_the_option_is_taken_out_of_flowers_arguments_and_checked():
    from fedbayes.tasks.message_limits import max_message_option

    assert max_message_option(["--insecure", "--max-message-mb", "3.5", "--database", "x"]) == (
        3.5,
        ["--insecure", "--database", "x"],
    )
    assert max_message_option(["--insecure"]) == (512.0, ["--insecure"])  # max-payload-mb's default
    for bad in ("0", "-1", "nan", "inf", "lots"):
        with pytest.raises(SystemExit, match="--max-message-mb must be a finite number of MiB > 0"):
            max_message_option(["--max-message-mb", bad])
    with pytest.raises(SystemExit, match="grpc-rere Fleet API only"):
        superlink.check_fleet_api_type(["--fleet-api-type", "grpc-adapter"])
    assert grpc.StatusCode.RESOURCE_EXHAUSTED  # what the refused SuperNode is told


def test_flower_stores_a_registration_and_answers_an_ask_only_while_holding_the_handover(monkeypatch):
    """Else the ServerApp's ask, once past the bound's check, could be handed a reply registered meanwhile, still
    being pushed (Flower's SQLite state made that race visible: the refused reply had been handed out)."""
    held = []
    push_messages, pull_messages = FleetServicer.PushMessages, runtime_handlers.pull_messages
    bound = superlink_patches.ReplyBound(1.0, stale_seconds=180.0)

    def pushing(servicer, request, context):
        held.append(("push", bound.handover.locked()))
        return push_messages(servicer, request, context)

    def pulling(request, state, task):
        held.append(("pull", bound.handover.locked()))
        return pull_messages(request, state, task)

    monkeypatch.setattr(FleetServicer, "PushMessages", pushing)
    monkeypatch.setattr(FleetServicer, "PushObject", FleetServicer.PushObject)
    monkeypatch.setattr(runtime_handlers, "pull_messages", pulling)
    superlink_patches.bounding_replies(bound)
    grid, (node,) = simulated_link(1, [(0, 0.0)])
    (instruction,) = grid.state.get_message_ins(node_id=node, limit=1)
    servicer = FleetServicer(SimpleNamespace(state=lambda: grid.state), None, enable_supernode_auth=False)
    register(servicer, reply_to(instruction, padding_mb=0.5)[0])
    pull(grid.state, instruction)
    assert held == [("push", True), ("pull", True)]
