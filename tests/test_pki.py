"""deploy/pki.py: what it writes is what Flower's TLS and node authentication accept."""

import stat
import tomllib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.cli.supernode.register import try_load_public_key

from deploy.launcher import Host, LocalFederation
from deploy.pki import connection_config, init_pki, make_supernode_key, server_certificate_names


def test_server_certificate_is_signed_by_the_ca_for_every_name_clients_use(tmp_path):
    files = init_pki(tmp_path, names=["fl.example.org"], ips=["10.1.2.3"])
    assert server_certificate_names(files.server_cert) == [
        "superlink", "localhost", "fl.example.org", "127.0.0.1", "10.1.2.3"
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


def test_an_insecure_federation_stays_on_loopback(tmp_path):
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation(tmp_path / "fed", server=Host("10.77.1.10", "some-netns"))
    with pytest.raises(ValueError, match="needs TLS"):
        LocalFederation(tmp_path / "fed", node_auth=True)
