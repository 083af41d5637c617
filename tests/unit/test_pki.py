"""deploy/pki.py: what it writes is what Flower's TLS and node authentication accept."""

import json
import multiprocessing
import stat
import tomllib
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key

from fedbayes.deploy.pki import (
    connection_config,
    init_pki,
    make_supernode_key,
    read_client_registry,
    record_client,
    server_certificate_names,
)


def test_server_certificate_is_signed_by_the_ca_for_every_name_clients_use(tmp_path):
    files = init_pki(tmp_path, names=["fl.example.org"], ips=["10.1.2.3"])
    assert server_certificate_names(files.server_cert) == [
        "superlink",
        "localhost",
        "fl.example.org",
        "127.0.0.1",
        "10.1.2.3",
    ]
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for private in (tmp_path / "ca.key", files.server_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_init_again_keeps_the_ca_and_reissues_the_server_certificate(tmp_path):
    first = init_pki(tmp_path)
    ca_before, server_before = first.ca_cert.read_bytes(), first.server_cert.read_bytes()
    second = init_pki(tmp_path, names=["other.example.org"])
    assert second.ca_cert.read_bytes() == ca_before and second.server_cert.read_bytes() != server_before
    assert "other.example.org" in server_certificate_names(second.server_cert)


def test_supernode_keys_are_what_flower_reads_and_are_kept(tmp_path):
    key = make_supernode_key(tmp_path, "hospital-a")
    private = load_ssh_private_key(key.private.read_bytes(), None)  # as flower-supernode loads it
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert stat.S_IMODE(key.private.stat().st_mode) == 0o600
    assert try_load_public_key(key.public)  # as `flwr supernode register` loads it
    assert make_supernode_key(tmp_path, "hospital-a").private.read_bytes() == key.private.read_bytes()


def test_connection_config_is_tls_unless_told_otherwise(tmp_path):
    tls = tomllib.loads(connection_config("prod", "10.0.0.1:9093", tmp_path / "ca.crt"))
    assert tls["superlink"]["default"] == "prod"
    assert tls["superlink"]["prod"] == {"address": "10.0.0.1:9093", "root-certificates": str(tmp_path / "ca.crt")}
    assert tomllib.loads(connection_config("dev", "127.0.0.1:1", None))["superlink"]["dev"]["insecure"] is True


# ---- client registry (client id -> node id) ----------------------------------------------------------
def test_the_registry_records_a_pair_once_and_keeps_other_entries(tmp_path):
    registry = tmp_path / "registry" / "clients.json"
    assert record_client(registry, "hospital-a", 11) is True
    assert record_client(registry, "hospital-b", 2**64 - 5) is True  # node ids are uint64
    assert record_client(registry, "hospital-a", 11) is False  # the same pair again: nothing changes
    assert read_client_registry(registry) == {"hospital-a": 11, "hospital-b": 2**64 - 5}
    assert json.loads(registry.read_text()) == {"hospital-a": 11, "hospital-b": 2**64 - 5}
    assert stat.S_IMODE(registry.stat().st_mode) == 0o644
    assert sorted(path.name for path in registry.parent.iterdir()) == ["clients.json"]  # no temporary files left


def test_the_registry_refuses_to_rebind_an_id_or_a_node(tmp_path):
    registry = tmp_path / "clients.json"
    record_client(registry, "hospital-a", 11)
    before = registry.read_bytes()
    with pytest.raises(ValueError, match=r"'hospital-a' is bound to node 11 .* not to node 12"):
        record_client(registry, "hospital-a", 12)
    with pytest.raises(ValueError, match=r"node 11 already presents client id 'hospital-a'"):
        record_client(registry, "hospital-z", 11)
    with pytest.raises(ValueError, match=r"must match"):
        record_client(registry, "../etc", 13)
    assert registry.read_bytes() == before


def test_a_broken_registry_is_named_and_left_alone(tmp_path):
    registry = tmp_path / "clients.json"
    for text, problem in (
        ("{not json", "not valid JSON"),
        ('["a", 1]', "must be a JSON object"),
        ('{"a": "12"}', "must be a JSON object"),
    ):
        registry.write_text(text)
        with pytest.raises(ValueError, match=problem):
            record_client(registry, "hospital-a", 11)
        assert registry.read_text() == text


def _record_many(registry: Path, prefix: str) -> None:
    for index in range(25):
        record_client(registry, f"{prefix}-{index}", hash((prefix, index)) % 2**63)


def test_concurrent_registrations_lose_no_entry(tmp_path):
    registry = tmp_path / "clients.json"
    writers = [multiprocessing.Process(target=_record_many, args=(registry, f"site{n}")) for n in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0
    assert len(read_client_registry(registry)) == 4 * 25
