"""deploy/pki.py: what it writes is what Flower's TLS and node authentication accept."""

import pytest

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.deploy.launcher import Host, LocalFederation
from fedbayes.deploy.pki import (
    forget_client,
    init_pki,
    make_supernode_key,
    read_client_registry,
    record_client,
)


def test_an_insecure_federation_stays_on_loopback(tmp_path):
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation(tmp_path / "fed", server=Host("10.77.1.10", "some-netns"))
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation(tmp_path / "fed", node_auth=True)


# ---- client registry (client id -> node id) ----------------------------------------------------------


def test_forgetting_a_client_frees_its_id_for_a_new_key(tmp_path):
    registry = tmp_path / "clients.json"
    record_client(registry, "hospital-a", 11)
    record_client(registry, "hospital-b", 12)
    assert fedbayes(["pki", "forget", "--registry", str(registry), "hospital-a"]) == 0
    assert read_client_registry(registry) == {"hospital-b": 12}
    assert record_client(registry, "hospital-a", 13) is True  # e.g. the client's new key
    with pytest.raises(ValueError, match=r"'hospital-z' is not in .* \(it has hospital-a, hospital-b\)"):
        forget_client(registry, "hospital-z")


def test_register_is_idempotent_and_records_the_client_id(tmp_path):
    """Against a real SuperLink (TLS + node auth, loopback): the second registration of a key (a compose
    `up` after `down` with the database kept) returns the node id of the first instead of failing, and
    `fedbayes pki register --registry` binds the client id to exactly that node."""
    tls = init_pki(tmp_path / "pki")
    key = make_supernode_key(tmp_path / "pki" / "supernodes", "hospital-a")
    registry = tmp_path / "registry" / "clients.json"
    with LocalFederation(tmp_path / "fed", tls=tls, node_auth=True) as federation:
        node_id = federation.register(key.public)
        assert federation.register(key.public) == node_id
        command = [
            "pki",
            "register",
            "--superlink",
            f"127.0.0.1:{federation.control_port}",
            "--ca",
            str(tls.ca_cert),
            "--registry",
            str(registry),
            "--client-id",
            "hospital-a",
            str(key.public),
        ]
        assert fedbayes(command) == 0 and fedbayes(command) == 0
        assert read_client_registry(registry) == {"hospital-a": node_id}
        other = make_supernode_key(tmp_path / "pki" / "supernodes", "hospital-b")
        assert fedbayes([*command[:-1], str(other.public)]) == 1  # hospital-a is bound to the first key's node
        assert read_client_registry(registry) == {"hospital-a": node_id}
