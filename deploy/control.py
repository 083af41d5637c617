"""What the `flwr` CLI knows but does not print: the node id a SuperLink holds for a public key.

    python -m fedbayes.deploy.control node-id <connection> <public key file>     # prints the node id, or exits 1

`flwr supernode list` shows node ids without their keys, and `flwr supernode register` answers a key it
knows already with an error instead of its node id. deploy/pki.py needs that node id to register keys
idempotently (a SuperLink restarted with its database keeps every key), so it runs this module, as a
process on the server's host like the `flwr` CLI itself (the Control API listens on that host's loopback).
The connection is read from $FLWR_HOME/config.toml, as `flwr` reads it.
"""

from __future__ import annotations

import sys
from pathlib import Path


def node_id_of_key(public_key: Path, connection: str) -> int | None:
    """The node the SuperLink bound to this public key, or None if it holds no (live) node for it.

    Args:
        public_key: the public key file (OpenSSH), as `flwr supernode register` was given it.
        connection: the connection's name in $FLWR_HOME/config.toml.

    Returns:
        The first such node's id, or None.
    """
    from fedbayes.flowerseam.control import public_key_bytes

    key = public_key_bytes(public_key)  # the bytes `flwr supernode register` sent for this file
    matches = [
        node.node_id for node in list_nodes(connection) if node.public_key == key and node.status != "unregistered"
    ]
    return matches[0] if matches else None


def list_nodes(connection: str) -> list:
    """Every node the SuperLink knows (Flower's NodeInfo: node_id, status, public_key, ...).

    Args:
        connection: the connection's name in $FLWR_HOME/config.toml.

    Returns:
        Flower's NodeInfo messages.
    """
    from fedbayes.flowerseam import control

    client = control.connect(connection)
    try:
        return control.list_nodes(client)
    finally:
        client.close()


def main(argv: list[str]) -> int:
    """`python -m fedbayes.deploy.control node-id <connection> <public key file>`: print the node id.

    Args:
        argv: the arguments after the module.

    Returns:
        0 with the node id printed; 1 where the SuperLink holds no node for the key; 2 for a usage error.
    """
    if len(argv) != 3 or argv[0] != "node-id":
        print("usage: python -m fedbayes.deploy.control node-id <connection> <public key file>", file=sys.stderr)
        return 2
    node_id = node_id_of_key(Path(argv[2]), argv[1])
    if node_id is None:
        print(f"the SuperLink holds no node for {argv[2]}", file=sys.stderr)
        return 1
    print(node_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
