"""A federation in one process: the ServerApp's run_federation (server/app.py) driving the ClientApp's train function
(client/app.py) through an in-process grid. Same run config and same code as `fedbayes local`, without processes,
serialisation over gRPC or polling: its rows equal a `fedbayes local` run's round for round
(tests/integration/test_compare.py), in seconds rather than a minute of start-up.

It lives in deploy because it joins the two halves, which the layers keep apart below it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid

from fedbayes.client.app import train
from fedbayes.flowerseam.executor import identify_as_serverapp_task
from fedbayes.flowerseam.messages import assign_message_id
from fedbayes.server.app import run_federation
from fedbayes.strategies import default_run_config

FIRST_NODE_ID = 1000  # node ids as Flower might number them


class InProcessGrid(Grid):
    """What server/loop.py needs of Flower's Grid, with every client in this process: `push_messages` runs each
    message through the ClientApp's train function at once, with that client's node config, and keeps the reply for
    `pull_messages`. Partition and client id are what `fedbayes local` gives its SuperNodes. The rest of Grid's
    interface the round loop never calls, and it raises."""

    def __init__(self, run_config: dict[str, Any], clients: int, state_dir: Path) -> None:
        """Args:
        run_config: the run config every client's context carries.
        clients: how many clients (partitions 0..clients-1, client ids client-<i>).
        state_dir: the clients' state directory.
        """
        self.contexts = {
            FIRST_NODE_ID + index: Context(
                run_id=1,
                node_id=FIRST_NODE_ID + index,
                state=RecordDict(),
                run_config=run_config,
                node_config={
                    "client-id": f"client-{index}",
                    "state-dir": str(state_dir),
                    "partition-id": index,
                    "num-partitions": clients,
                },
            )
            for index in range(clients)
        }
        self.replies: dict[str, Message] = {}
        self.pushed = 0

    @property
    def run(self):
        """Grid's run; there is none.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("an in-process grid belongs to no Flower run")

    def set_run(self, run: Any) -> None:
        """Grid's hook for its run; there is none to set.

        Args:
            run: unused.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("an in-process grid belongs to no Flower run")

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        """Grid's message factory, which the round loop does not use.

        Args:
            args: unused.
            kwargs: unused.

        Returns:
            Nothing: it raises.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("the round loop builds its messages itself (server/round_core.py)")

    def send_and_receive(self, *args: Any, **kwargs: Any) -> list[Message]:
        """Grid's blocking round trip, which the round loop does not use.

        Args:
            args: unused.
            kwargs: unused.

        Returns:
            Nothing: it raises.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("the round loop pushes and pulls (server/loop.py)")

    def get_node_ids(self) -> list[int]:
        """The clients' node ids.

        Returns:
            FIRST_NODE_ID .. FIRST_NODE_ID + clients - 1, in order.
        """
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Run each message through its client's ClientApp train function now, and keep the reply.

        Args:
            messages: instructions, each addressed to one of `get_node_ids`.

        Returns:
            The ids assigned to them (m1, m2, ... in push order), as the SuperLink would.

        Raises:
            KeyError: a message addressed to an unknown node.
        """
        ids = []
        for message in messages:
            self.pushed += 1
            message_id = f"m{self.pushed}"
            assign_message_id(message, message_id)  # what the SuperLink would assign
            self.replies[message_id] = train(message, self.contexts[message.metadata.dst_node_id])
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies to the messages named, each handed out once.

        Args:
            message_ids: ids `push_messages` returned.

        Returns:
            The replies not pulled yet, in the order of `message_ids`; unknown or pulled ids are skipped.
        """
        return [self.replies.pop(message_id) for message_id in message_ids if message_id in self.replies]


def run_inprocess(
    run_config: dict[str, Any], clients: int, root: Path, pipeline_evaluation: bool = True
) -> list[dict[str, Any]]:
    """Run a federation of `clients` in this process to its last round.

    Args:
        run_config: the run config (the keys a `fedbayes local` run submits; every other key takes its default).
        clients: how many clients.
        root: an existing directory for the server's checkpoints, the clients' state and the results file.
        pipeline_evaluation: as the ServerApp does, evaluate round t while round t+1 trains; False: everything on
            this thread, one step after the other.

    Returns:
        The results rows, one per round.
    """
    identify_as_serverapp_task(run_id=1, node_id=1, task_id=1)
    results = root / "results.jsonl"
    config = {
        **default_run_config(str(run_config["strategy"])),
        **run_config,
        "server-state-dir": str(root / "server-state"),
        "results-path": str(results),
        "client-identity": "reconnect",  # no nodes to bind ids to
    }
    run_federation(
        InProcessGrid(config, clients, root / "client-state"),
        Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config),
        pipeline_evaluation=pipeline_evaluation,
    )
    return [json.loads(line) for line in results.read_text().splitlines()]
