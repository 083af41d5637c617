"""The Fleet API as a SuperNode calls it (flwr.proto.fleet_pb2, flwr.client's signing interceptor), for
`fedbayes client`'s check that the SuperLink takes its key (deploy/fleet_probe.py). Each function imports Flower
where it is called."""

from __future__ import annotations

from typing import Any


def signed_fleet_stub(channel: Any, key: Any) -> Any:
    """A Fleet API stub on `channel` that signs every call with `key`, as a SuperNode's does.

    Args:
        channel: a gRPC channel to the Fleet API.
        key: the node's private key (cryptography's EllipticCurvePrivateKey).

    Returns:
        Flower's FleetStub.
    """
    import grpc
    from flwr.client.grpc_rere_client.node_auth_client_interceptor import NodeAuthClientInterceptor
    from flwr.proto.fleet_pb2_grpc import FleetStub

    return FleetStub(grpc.intercept_channel(channel, NodeAuthClientInterceptor(key, key.public_key())))


def activate_node_request(key: Any, heartbeat_interval: float) -> Any:
    """Flower's ActivateNodeRequest for `key`'s node, promising a heartbeat every `heartbeat_interval` seconds.

    Args:
        key: the node's private key.
        heartbeat_interval: seconds between the node's heartbeats.

    Returns:
        The request.
    """
    from flwr.proto.fleet_pb2 import ActivateNodeRequest  # pylint: disable=no-name-in-module
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    return ActivateNodeRequest(public_key=public_key_to_bytes(key.public_key()), heartbeat_interval=heartbeat_interval)


def deactivate_node_request(node_id: int) -> Any:
    """Flower's DeactivateNodeRequest for node `node_id`.

    Args:
        node_id: the node to sign off.

    Returns:
        The request.
    """
    from flwr.proto.fleet_pb2 import DeactivateNodeRequest  # pylint: disable=no-name-in-module

    return DeactivateNodeRequest(node_id=node_id)


def flower_error(details: str) -> Any:
    """The FlowerError (code, message) a SuperLink's gRPC error details carry, if they carry one.

    Args:
        details: the RpcError's details.

    Returns:
        Flower's FlowerError, or None.
    """
    from flwr.supercore.error import FlowerError

    return FlowerError.from_json(details)
