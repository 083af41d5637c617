"""`fedbayes supernode`: Flower's SuperNode loop with its fixed waits shortened, and nothing else changed; Flower's
object pulls with a short first back-off (fedbayes.flowerseam.object_pulls)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedbayes.deploy import supernode
from fedbayes.flowerseam import supernode as supernode_patches


def test_the_supernode_loop_polls_instead_of_sleeping_3_s(monkeypatch):
    slept = []
    monkeypatch.setattr(supernode_patches.time, "sleep", slept.append)
    patched = supernode_patches.polling_time(0.2)
    for seconds in (3, 0.5, 1.0, 10):
        patched.sleep(seconds)
    assert slept == [0.2, 0.2, 1.0, 10]


def test_idle_polls_back_off_to_a_second_and_a_message_resets_them(monkeypatch):
    slept = []
    monkeypatch.setattr(supernode_patches.time, "sleep", slept.append)
    patched = supernode_patches.polling_time(0.2)
    for seconds in (3,) * 7 + (0.5, 3, 3):  # idle polls, a message (waiting for its reply), idle again
        patched.sleep(seconds)
    assert slept == pytest.approx([0.2, 0.3, 0.45, 0.675, 1.0, 1.0, 1.0, 0.2, 0.2, 0.3])
    assert patched.time is supernode_patches.time.time and patched.monotonic is supernode_patches.time.monotonic


def test_it_patches_only_the_flower_it_was_read_in(monkeypatch):
    import flwr
    from flwr.supernode import start_client_internal

    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)  # restored after the test
    pull_and_store = start_client_internal._pull_and_store_message
    monkeypatch.setattr(start_client_internal, "_pull_and_store_message", pull_and_store)
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "1")  # Flower's own object-pull back-off, unchanged
    supernode.patch_flower(0.1, runtime_port=9123)
    assert start_client_internal.time.sleep is not supernode_patches.time.sleep
    assert start_client_internal._pull_and_store_message is not pull_and_store
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    with pytest.raises(SystemExit, match="Flower 1.40.0 is installed"):
        supernode.patch_flower(0.1)


@pytest.mark.parametrize("value", ["fast", "0", "5"])
def test_a_bad_poll_interval_is_refused(monkeypatch, value):
    monkeypatch.setenv("FEDBAYES_SUPERNODE_POLL", value)
    with pytest.raises(SystemExit, match="FEDBAYES_SUPERNODE_POLL"):
        supernode.poll_interval()


def test_object_pulls_retry_after_the_configured_backoff_not_1_s(monkeypatch, pull_defaults):
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    from fedbayes.flowerseam import object_pulls

    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "0.01")
    assert object_pulls.shorten_pull_backoff()
    assert [function.__kwdefaults__["initial_backoff"] for function in pull_defaults] == [0.01, 0.01]
    attempts = []

    def pull(object_id):  # unavailable twice, as while its sender still uploads it
        attempts.append(object_id)
        if len(attempts) < 3:
            raise ObjectUnavailableError(object_id)
        return b"content"

    pull_objects = pull_defaults[0]
    assert pull_objects(["a"], pull) == {"a": b"content"} and attempts == ["a"] * 3


def test_object_pulls_are_left_alone_on_another_flower_and_a_bad_backoff_is_refused(monkeypatch, pull_defaults):
    import flwr

    from fedbayes.flowerseam import object_pulls

    before = [function.__kwdefaults__["initial_backoff"] for function in pull_defaults]
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "0.01")
    assert not object_pulls.shorten_pull_backoff()
    assert [function.__kwdefaults__["initial_backoff"] for function in pull_defaults] == before
    monkeypatch.setenv("FEDBAYES_PULL_BACKOFF", "soon")
    with pytest.raises(ValueError, match="FEDBAYES_PULL_BACKOFF"):
        object_pulls.pull_backoff()


class FakeRuntimeApi:
    """The SuperLink's Runtime API as the ServerApp's HttpGrid sees it, holding one reply and its objects."""

    def __init__(self, message):
        from flwr.common.serde import message_to_proto
        from flwr.proto.runtime_pb2 import PullAppMessagesResponse
        from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

        message.metadata.__dict__["_message_id"] = message.object_id  # as the SuperLink stores it
        self.objects = {object_id: item.deflate() for object_id, item in get_all_nested_objects(message).items()}
        self.response = PullAppMessagesResponse(
            messages_list=[message_to_proto(message)], message_object_trees=[get_object_tree(message)]
        )
        self.pulled_bytes, self.confirmed = 0, []

    def PullMessages(self, request):
        return self.response

    def PullObject(self, request):
        from flwr.proto.message_pb2 import PullObjectResponse

        content = self.objects[request.object_id]
        self.pulled_bytes += len(content)
        return PullObjectResponse(object_found=True, object_available=True, object_content=content)

    def ConfirmMessageReceived(self, request):
        self.confirmed.append(request.message_object_id)


INSTRUCTION_ID = "ab" * 32


def grid_holding_reply(padding_mb: float):
    """Flower's HttpGrid, talking to a fake Runtime API that holds one reply padded with `padding_mb` MiB of random
    float32 (several 5 MiB chunks); (grid, fake API)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, RecordDict
    from flwr.supercore.run import Run
    from flwr.superlink.grid.http_grid import HttpGrid

    instruction = Message(RecordDict(), dst_node_id=5, message_type="train")
    instruction.metadata.__dict__["_message_id"] = INSTRUCTION_ID
    padding = np.random.default_rng(0).standard_normal(int(padding_mb * 2**20) // 4, dtype=np.float32)
    api = FakeRuntimeApi(Message(RecordDict({"pad": ArrayRecord({"x": Array(padding)})}), reply_to=instruction))
    grid = HttpGrid(token="token")
    grid._client = api
    grid.set_run(Run.create_empty(run_id=1))
    return grid, api


def test_the_serverapp_stops_pulling_a_reply_over_the_payload_limit_and_releases_it(grid_pulls):
    from fedbayes.flowerseam import object_pulls

    grid, api = grid_holding_reply(padding_mb=40)
    assert object_pulls.bound_reply_pulls(grid, 1.0)
    assert object_pulls.bound_reply_pulls(grid, 3.0)  # replaces the bound, does not add one
    (reply,) = grid.pull_messages(["ignored"])
    assert reply.has_error() and "the reply is over max-payload-mb=3: " in reply.error.reason, reply.error
    assert reply.metadata.reply_to_message_id == INSTRUCTION_ID  # how the round loop tells whose reply it was
    # pulls stop once past 3 MiB + OBJECT_OVERHEAD_BYTES: the chunk that crossed it and one in flight, not 40 MiB
    assert api.pulled_bytes <= 3 * 2**20 + object_pulls.OBJECT_OVERHEAD_BYTES + 2 * 5 * 2**20 + 4096, api.pulled_bytes
    assert api.confirmed == [api.response.messages_list[0].metadata.message_id]  # the SuperLink may drop it

    grid, api = grid_holding_reply(padding_mb=2.5)  # under the limit: pulled whole, as without the bound
    (reply,) = grid.pull_messages(["ignored"])
    assert not reply.has_error() and len(reply.content["pad"]["x"].data) > 2.5 * 2**20
    assert api.confirmed == [reply.metadata.message_id]


def test_reply_pulls_are_left_alone_on_another_flower_or_grid(monkeypatch, grid_pulls):
    import flwr

    from fedbayes.flowerseam import object_pulls

    pull_objects = grid_pulls.pull_objects
    assert not object_pulls.bound_reply_pulls(object(), 1.0)  # e.g. simulation's in-memory grid
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    assert not object_pulls.bound_reply_pulls(grid_holding_reply(padding_mb=0)[0], 1.0)
    assert grid_pulls.pull_objects is pull_objects


def test_the_doorbell_holds_every_ring_until_answered_and_remembers_that_it_was_heard():
    import select

    from fedbayes.deploy import doorbell

    port = 40000 + os.getpid() % 20000
    bell = doorbell.Doorbell(port, ringer_pid=None, on_stranger=pytest.fail)  # anyone may ring
    assert not bell.answer() and not bell.heard  # nothing rang: the executor polls as Flower does
    doorbell.ring(port)
    doorbell.ring(port)
    ready, _, _ = select.select([bell.socket], [], [], 2.0)
    assert ready == [bell.socket]
    assert bell.answer() and bell.heard  # one ask answers both rings
    assert not bell.listening()  # and the bell goes unheard for RING_INTERVAL
    assert not bell.answer() and bell.heard
    with pytest.raises(OSError):
        doorbell.Doorbell(port, None, pytest.fail)  # one listener per SuperNode
    doorbell.ring(port + 1)  # nobody listens: nothing happens
    bell.socket.close()


def test_the_supernode_rings_when_it_has_taken_a_message_and_reads_its_runtime_port(monkeypatch):
    rung = []
    monkeypatch.setattr(supernode, "ring", rung.append)
    results = iter([None, 7])
    pull_and_store = supernode_patches.ringing(lambda *args, **kwargs: next(results), lambda: supernode.ring(9123))
    assert pull_and_store("anything") is None and rung == []  # nothing for this node
    assert pull_and_store("anything") == 7 and rung == [9123]
    assert supernode.runtime_port(["--insecure", "--port", "23456", "--superlink", "x:1"]) == 23456
    assert supernode.runtime_port(["--insecure"]) == 9094  # Flower's default


def test_a_superlink_is_asked_every_few_seconds_while_its_serverapp_runs_and_at_once_after():
    """A SuperLink hands out one ServerApp task per run and rings no bell: while the ServerApp forked for it runs
    (here a child process standing in for it), the executor asks it every RUNNING_SERVERAPP_POLL seconds; once that
    has ended, every `poll` again. A SuperNode is asked every `poll` whatever tasks it has running."""
    import time

    from flwr.proto.runtime_pb2 import AcquireTaskResponse

    from fedbayes.deploy import warm_executor
    from fedbayes.deploy.processes import free_ports

    def runtime(app: str) -> warm_executor.ServedRuntime:
        # nobody listens on the port: AcquireTask is replaced by an empty answer (no task to hand out)
        (port,) = free_ports(1)
        node = warm_executor.ServedRuntime(
            f"127.0.0.1:{port}", None, insecure=True, root_certificates=None, poll=0.2, app=app
        )
        node.client.AcquireTask = lambda request: AcquireTaskResponse()
        return node

    def seconds_to_next_ask(node: warm_executor.ServedRuntime) -> float:
        node.ask()
        return node.next_ask - time.monotonic()

    superlink, supernode = runtime("serverapp"), runtime("clientapp")
    assert seconds_to_next_ask(superlink) <= 0.2  # no ServerApp: a run's task is taken within `poll`
    serverapp = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    clientapp = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    superlink.executor.children.add(serverapp.pid)
    supernode.executor.children.add(clientapp.pid)
    try:
        assert 1.5 < seconds_to_next_ask(superlink) <= warm_executor.RUNNING_SERVERAPP_POLL
        assert seconds_to_next_ask(supernode) <= 0.2
    finally:
        serverapp.stdin.close()
        clientapp.stdin.close()
    deadline = time.monotonic() + 10.0
    while superlink.executor.children and time.monotonic() < deadline:  # `ask` reaps it, as in the executor's loop
        superlink.ask()
        time.sleep(0.05)
    assert not superlink.executor.children
    assert seconds_to_next_ask(superlink) <= 0.2
    supernode.close(timeout=5.0)
    superlink.close()


def test_a_supernode_that_hangs_delays_the_executor_loop_by_one_timeout_only(monkeypatch, capsys):
    """A Runtime API that accepts the connection and never answers (a stopped SuperNode): the ask gives up after
    ASK_TIMEOUT, and the loop asks again only after UNREACHABLE_RETRY, so the other SuperNodes are still served."""
    import socket
    import time

    from fedbayes.deploy import warm_executor

    monkeypatch.setattr(warm_executor, "ASK_TIMEOUT", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        node = warm_executor.ServedRuntime(address, None, insecure=True, root_certificates=None, poll=0.2)
        started = time.monotonic()
        node.ask()
        assert 0.4 < time.monotonic() - started < 2.0
        assert node.unreachable and node.next_ask - time.monotonic() > 0.5
        node.close()
    assert f"the SuperNode at {address} does not answer" in capsys.readouterr().err


def test_the_supernodes_named_on_stdin_are_served_as_their_lines_complete(capsys):
    """`fedbayes local` names the shared executor's SuperNodes on its stdin: a line counts once it is complete (a pipe
    may deliver half of one), a line that names no SuperNode is reported and skipped, and the list ends with the
    pipe."""
    import os

    from fedbayes.deploy import warm_executor
    from fedbayes.deploy.processes import free_ports

    first, second = free_ports(2)
    reading, writing = os.pipe()
    more = warm_executor.SuperNodeList(reading, poll=0.2)
    os.write(writing, f"127.0.0.1:{first} {os.getpid()}\n127.0.0.1:{second} ".encode())
    served = more.read()
    assert [node.address for node in served] == [f"127.0.0.1:{first}"] and not more.ended
    os.write(writing, f"{os.getpid()}\nno supernode here\n127.0.0.1:{first} 0".encode())
    os.close(writing)
    served += more.read()
    assert [node.address for node in served] == [f"127.0.0.1:{first}", f"127.0.0.1:{second}"]
    served += more.read()  # the pipe's end, after a last line without its newline (pid 0: no such process)
    assert more.ended and len(served) == 2
    for node in served:
        assert node.executor.task_type == "flwr-clientapp" and node.process is not None  # watched: our own process
        node.close()
    os.close(reading)
    log = capsys.readouterr().err
    assert log.count("fedbayes superexec: serving the SuperNode at") == 2
    assert "not serving b'no supernode here' from stdin: ValueError" in log
    assert f"not serving b'127.0.0.1:{first} 0' from stdin" in log


def test_the_forked_serverapps_last_log_flush_waits_for_the_uploads_not_a_second(monkeypatch):
    """Flower's flush sleeps 1 s after the queue empties; ours ends its uploader and waits for the thread, which
    uploads every line first: each line reaches the SuperLink (here a recording client that takes 0.1 s a call),
    sooner."""
    import importlib
    import time
    from queue import Queue

    from fedbayes.flowerseam.executor import flush_logs_exactly

    runtime = importlib.import_module("flwr.superlink.runtime.run_serverapp")
    for name in ("start_log_uploader", "flush_logs"):  # restored after the test: the patch is meant for a fork
        monkeypatch.setattr(runtime, name, getattr(runtime, name))
    assert flush_logs_exactly()

    class RecordingClient:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def PushLogs(self, request) -> None:  # noqa: N802 - Flower's name
            time.sleep(0.1)
            self.lines += request.logs

    client, log_queue = RecordingClient(), Queue()
    uploader = runtime.start_log_uploader(log_queue, 1, 2, client)
    for index in range(50):
        log_queue.put(f"line {index}\n")
        if index == 25:
            time.sleep(0.3)  # an upload is under way when the flush begins
    started = time.monotonic()
    assert runtime.flush_logs(log_queue)
    assert time.monotonic() - started < 0.9
    assert client.lines == [f"line {index}\n" for index in range(50)] and not uploader.is_alive()
    runtime.stop_log_uploader(log_queue, uploader)  # what Flower calls after the outcome: returns at once


def test_a_second_sigterm_does_not_interrupt_the_executors_exit():
    """`fedbayes local` TERMs the warm executor twice; the second arrives while the interpreter exits (torch's atexit
    finalisers). It must not raise SystemExit there: that was a traceback in every run's superexec log."""
    import subprocess
    import sys

    script = (
        "import atexit, os, signal, time\n"
        "from fedbayes.deploy.warm_executor import exit_on_term\n"
        "def slow_finaliser():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    print('finaliser done', flush=True)\n"
        "atexit.register(slow_finaliser)\n"
        "signal.signal(signal.SIGTERM, exit_on_term)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "time.sleep(30)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "finaliser done" in result.stdout
    assert "Exception ignored" not in result.stderr and "SystemExit" not in result.stderr, result.stderr


STOPPED_RUN, NEW_RUN, NODE = 6868, 731, 1642


def instruction(run_id: int, server_round: int):
    """A train instruction as the SuperLink hands it to a SuperNode: (the message without its content, its object
    tree, its objects by id)."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    message = Message(
        RecordDict({"config": ConfigRecord({"server-round": server_round})}),
        dst_node_id=NODE,
        message_type="train",
        group_id=str(server_round),
    )
    message.metadata.__dict__.update(_run_id=run_id, _src_node_id=1)  # as the SuperLink sets them
    message.metadata.__dict__["_message_id"] = message.object_id
    objects = {object_id: item.deflate() for object_id, item in get_all_nested_objects(message).items()}
    return message_from_proto(message_to_proto(remove_content_from_message(message))), get_object_tree(message), objects


def take(loop, state, message, confirm) -> int | None:
    """The SuperNode's `_pull_and_store_message` (as patched) taking `message` from the SuperLink; its run is known
    from earlier rounds, and `confirm` answers the confirmation of its receipt."""
    taken, tree, objects = message
    return loop._pull_and_store_message(
        state=state,
        object_store=state.object_store,
        node_config={},
        receive=lambda: (taken, tree),
        get_run=pytest.fail,
        get_fab=pytest.fail,
        pull_object=lambda run_id, object_id: objects[object_id],
        confirm_message_received=confirm,
        trusted_entities=None,
    )


def run_clientapps(state) -> list[str]:
    """What the executor and its ClientApps do to the SuperNode's state, without processes: claim every pending
    ClientApp task, take its run's instruction, store a reply; the ids of the instructions answered."""
    from flwr.app import Message, RecordDict
    from flwr.common.constant import Status, SubStatus
    from flwr.supernode.start_client_internal import _insert_message

    answered = []
    for task in state.get_tasks(statuses=[Status.PENDING]):
        assert state.claim_task(task.task_id) and state.activate_task(task.task_id)
        (message,) = state.get_messages(run_ids=[task.run_id], is_reply=False, limit=1)
        state.record_message_processing_start(message.metadata.message_id)
        reply = Message(RecordDict(), reply_to=message)
        state.record_message_processing_end(message.metadata.message_id)
        _insert_message(reply, state, state.object_store)
        assert state.finish_task(task.task_id, SubStatus.COMPLETED, "")
        answered.append(message.metadata.message_id)
    return answered


@pytest.fixture
def supernode_loop(monkeypatch, pull_defaults):
    """Flower's SuperNode loop module as `fedbayes supernode` patches it, restored after the test."""
    from flwr.supernode import start_client_internal

    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)
    monkeypatch.setattr(start_client_internal, "_pull_and_store_message", start_client_internal._pull_and_store_message)
    supernode.patch_flower(0.01)
    return start_client_internal


@pytest.mark.parametrize("clientapp", ["not started", "running", "replied"])
def test_a_message_whose_run_stops_while_the_supernode_takes_it_leaves_nothing_to_answer(supernode_loop, clientapp):
    """A server machine dies as a SuperNode takes round 3's instruction; the operator starts the SuperLink again and
    stops the dead run (`flwr stop`) before the SuperNode's confirmation of that instruction gets through, which the
    SuperLink then refuses (RunNotRunningException). Flower 1.39 kept the instruction and its ClientApp task: the
    executor answered it, and that reply was the one the SuperNode pushed after the resumed run's next instruction,
    whose own reply then waited for the instruction after it. Each reply one instruction late, the server dropped
    the client from every round of the resumed run for round-timeout (seen in the netns system test
    test_a_dead_server_machine_resumes_and_loses_nothing). Whatever the ClientApp had done by then (`clientapp`),
    nothing of the stopped run may be left to answer or to push, and the next reply pushed answers the next
    instruction."""
    from flwr.common.constant import Status
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run, RunNotRunningException
    from flwr.supernode.nodestate import NodeStateFactory

    state = NodeStateFactory(ObjectStoreFactory()).state()
    state.set_node_id(NODE)
    for run_id in (STOPPED_RUN, NEW_RUN):
        state.store_run(Run.create_empty(run_id))
    tokens, answered = [], []

    def confirm_refused(run_id, message_id):  # the SuperLink, started again, has the run stopped
        if clientapp == "running":  # the executor took the task while the SuperNode still pulled the objects
            (task,) = state.get_tasks(run_ids=[STOPPED_RUN], statuses=[Status.PENDING])
            tokens.append(state.claim_task(task.task_id))
            state.activate_task(task.task_id)
            answered.extend(state.get_messages(run_ids=[STOPPED_RUN], is_reply=False))  # the ClientApp pulled it
        elif clientapp == "replied":  # ... and answered it, before the SuperNode heard that the run had stopped
            answered.extend(run_clientapps(state))
        raise RunNotRunningException

    assert take(supernode_loop, state, instruction(STOPPED_RUN, 3), confirm_refused) is None
    assert len(answered) == (clientapp != "not started") and all(tokens)  # the ClientApp got that far
    assert run_clientapps(state) == []  # no ClientApp for the stopped run
    assert all(task.status.status == Status.FINISHED for task in state.get_tasks(run_ids=[STOPPED_RUN]))
    assert all(state.get_task_by_token(token) is None for token in tokens)  # a running ClientApp can push nothing

    resumed = instruction(NEW_RUN, 2)
    assert take(supernode_loop, state, resumed, lambda run_id, message_id: None) == NEW_RUN
    assert run_clientapps(state) == [resumed[0].metadata.message_id]
    pushed = []

    def send(message, object_tree, clientapp_runtime):
        pushed.append(message.metadata.reply_to_message_id)
        if message.metadata.run_id == STOPPED_RUN:
            raise RunNotRunningException
        return set(), "session"

    supernode_loop._push_messages(state=state, object_store=state.object_store, send=send, push_object=pytest.fail)
    assert pushed == [resumed[0].metadata.message_id]  # the reply to the resumed run's instruction, and only it
    assert not state.get_messages()


EXIT_SCRIPT = """
import sys, threading, time
from fedbayes.deploy.processes import exit_without_teardown

class Finalized:
    def __del__(self):
        print("torn down", flush=True)  # runs only in the interpreter's teardown

kept = Finalized()

def late_writer():
    time.sleep(0.3)
    print("thread done", flush=True)

def entry():
    threading.Thread(target=late_writer).start()  # not a daemon: Python would wait for it
    print("entry ran")  # buffered: the pipe is no terminal
    {ending}

exit_without_teardown(entry)
print("not reached")
"""


@pytest.mark.parametrize(
    "ending, status, stderr",
    [
        ("return", 0, ""),
        ("return 4", 4, ""),  # `fedbayes local`'s status
        ("raise SystemExit(3)", 3, ""),
        ("sys.exit('refused: no key')", 1, "refused: no key\n"),
    ],
)
def test_the_supernode_exits_with_its_status_after_its_threads_without_the_interpreters_teardown(
    ending, status, stderr
):
    result = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT.format(ending=ending)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == status, result.stderr
    assert result.stdout == "entry ran\nthread done\n"  # flushed, the thread joined, no teardown, nothing after
    assert result.stderr == stderr


def test_an_exception_in_the_supernode_takes_pythons_usual_exit():
    script = EXIT_SCRIPT.format(ending="raise RuntimeError('broken')").replace("late_writer).start()", "print)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "RuntimeError: broken" in result.stderr
    assert "entry ran" in result.stdout and "torn down" in result.stdout  # the interpreter tore down as usual


@pytest.mark.parametrize(
    "argv, module",
    [
        (["supernode", "--help"], "fedbayes.deploy.supernode"),
        (["supernode-forkserver"], "flwr.supernode.cli.flower_supernode"),  # its imports, then no request: it exits
        (["superlink", "--help"], "fedbayes.deploy.superlink"),
        (["run", "--help"], "fedbayes.deploy.flwr_run"),
        (["client", "--help"], "fedbayes.deploy.client"),  # its process supervises the client's SuperNode and executor
    ],
)
def test_the_supernode_client_and_run_commands_import_neither_torch_nor_the_launcher(argv, module):
    """Every client runs a `fedbayes supernode` process, or a fork of the fork server's (and, joining with `fedbayes
    client`, a supervising one): torch in each cost about 2 CPU-s of start-up and 500 MB."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fedbayes.deploy.cli", *argv],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")
    }
    assert module in imported  # the trace is there
    assert "torch" not in imported and "fedbayes.deploy.launcher" not in imported


def test_an_instruction_over_max_message_mb_is_refused_while_pulled_and_answered_with_an_error(
    monkeypatch, pull_defaults
):
    """`fedbayes supernode --max-message-mb 1`: an instruction padded with 20 MiB (four 5 MiB chunks) is dropped at the
    first chunk past the limit, pulled no further, and answered with an error reply naming the limit, which Flower's
    loop pushes next; no ClientApp is asked to run it. It is not confirmed to the SuperLink: the ServerApp may still
    be pushing its objects, which a confirmation drops (that failed the ServerApp's push, and its run)."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, Message, RecordDict
    from flwr.app.message import remove_content_from_message
    from flwr.common.constant import Status
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supernode import start_client_internal as loop
    from flwr.supernode.nodestate import NodeStateFactory

    from fedbayes.tasks.message_limits import OBJECT_OVERHEAD_BYTES

    monkeypatch.setattr(loop, "time", loop.time)
    monkeypatch.setattr(loop, "_pull_and_store_message", loop._pull_and_store_message)
    monkeypatch.setattr(loop, "GRPC_MAX_MESSAGE_LENGTH", loop.GRPC_MAX_MESSAGE_LENGTH)
    supernode.patch_flower(0.01, max_message_mb=1.0)
    assert loop.GRPC_MAX_MESSAGE_LENGTH == 5 * 2**20 + OBJECT_OVERHEAD_BYTES  # one array chunk gets to the count

    padding = np.random.default_rng(0).standard_normal(5 * 2**20, dtype=np.float32)
    message = Message(RecordDict({"pad": ArrayRecord({"x": Array(padding)})}), dst_node_id=NODE, message_type="train")
    message.metadata.__dict__.update(_run_id=NEW_RUN, _src_node_id=1)
    message.metadata.__dict__["_message_id"] = message.object_id
    objects = {object_id: item.deflate() for object_id, item in get_all_nested_objects(message).items()}
    taken = message_from_proto(message_to_proto(remove_content_from_message(message)))
    state = NodeStateFactory(ObjectStoreFactory()).state()
    state.set_node_id(NODE)
    state.store_run(Run.create_empty(NEW_RUN))
    pulled, confirmed = [], []

    def pull_object(run_id, object_id):
        pulled.append(len(objects[object_id]))
        return objects[object_id]

    run_id = loop._pull_and_store_message(
        state=state,
        object_store=state.object_store,
        node_config={},
        receive=lambda: (taken, get_object_tree(message)),
        get_run=pytest.fail,
        get_fab=pytest.fail,
        pull_object=pull_object,
        confirm_message_received=lambda run_id, message_id: confirmed.append(message_id),
        trusted_entities=None,
    )
    assert run_id == NEW_RUN and confirmed == []
    assert sum(pulled) <= 2 * (5 * 2**20 + 4096)  # the chunk that passed the limit and one in flight, of four
    assert all(task.status.status == Status.FINISHED for task in state.get_tasks(run_ids=[NEW_RUN]))
    assert state.get_messages(is_reply=False) == []
    sent = []

    def send(reply, object_tree, clientapp_runtime):
        sent.append(reply)
        return set(), "session"

    loop._push_messages(state=state, object_store=state.object_store, send=send, push_object=pytest.fail)
    (reply,) = sent
    assert reply.has_error() and reply.metadata.reply_to_message_id == message.metadata.message_id
    assert "the SuperNode refused the instruction: it is over --max-message-mb=1 (" in reply.error.reason
