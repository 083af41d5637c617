"""Flower's Control API client, as the `flwr` CLI makes and uses it (flwr.cli, flwr.proto.control_pb2): what
`fedbayes run` asks for a run's status, `fedbayes status --superlink` for the nodes and runs, and `fedbayes pki` for
the node of a key. Each function imports Flower where it is called, as the CLI's commands did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# what `connect` and `list_runs` import: `fedbayes run` imports them while the run goes (deploy/flwr_run.py)
STATUS_CLIENT_MODULES = ("flwr.cli.flower_config", "flwr.cli.utils", "flwr.common.serde", "flwr.proto.control_pb2")


def connect(connection: str | None) -> Any:
    """A Control API client for a connection of $FLWR_HOME/config.toml, as `flwr ls` makes it.

    Args:
        connection: the connection's name; None for the default one.

    Returns:
        Flower's HTTP client; the caller closes it.
    """
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection

    return init_http_client_from_connection(read_superlink_connection(connection))


def connect_to(name: str, address: str, root_certificates: str | None) -> Any:
    """A Control API client for the SuperLink at `address`, TLS with the CA file `root_certificates` (None:
    insecure).

    Args:
        name: the connection's name, for Flower's messages.
        address: the Control API's host:port.
        root_certificates: the CA certificate's path, or None for plain HTTP.

    Returns:
        Flower's HTTP client; the caller closes it.
    """
    from flwr.cli.typing import SuperLinkConnection
    from flwr.cli.utils import init_http_client_from_connection

    connection = SuperLinkConnection(
        name=name, address=address, root_certificates=root_certificates, insecure=root_certificates is None
    )
    return init_http_client_from_connection(connection)


def list_runs(client: Any, run_id: int | None = None) -> dict[int, Any]:
    """The runs the SuperLink holds (`flwr ls`), or only run `run_id`.

    Args:
        client: a Control API client (`connect`, `connect_to`).
        run_id: the one run to ask for, or None for all.

    Returns:
        Run id -> Flower's Run (run_id, status, pending_at, override_config, ...).
    """
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest  # pylint: disable=no-name-in-module

    request = ListRunsRequest() if run_id is None else ListRunsRequest(run_id=run_id)
    return {key: run_from_proto(run) for key, run in client.ListRuns(request).run_dict.items()}


def list_nodes(client: Any) -> list[Any]:
    """Every node the SuperLink knows (`flwr supernode list`).

    Args:
        client: a Control API client (`connect`, `connect_to`).

    Returns:
        Flower's NodeInfo of each (node_id, status, public_key, last_activated_at, ...).
    """
    from flwr.proto.control_pb2 import ListNodesRequest  # pylint: disable=no-name-in-module

    return list(client.ListNodes(ListNodesRequest()).nodes_info)


def public_key_bytes(public_key: Path) -> bytes:
    """The bytes `flwr supernode register` sends for this public key file.

    Args:
        public_key: the node's public key file.

    Returns:
        What the SuperLink stores as the node's key.
    """
    from flwr.cli.supernode.register import try_load_public_key

    return try_load_public_key(public_key)
