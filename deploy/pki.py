"""Certificates and SuperNode keys for a federation that crosses machines: TLS + node authentication.

    fedbayes pki init --out certs --name fl.example.org          # CA + SuperLink certificate
    fedbayes pki supernode-key --out certs/supernodes hospital-a  # one key pair per client
    fedbayes pki register --superlink 127.0.0.1:9093 --ca certs/ca.crt certs/supernodes/hospital-a.pub
    fedbayes pki connection --name prod --superlink 127.0.0.1:9093 --ca certs/ca.crt  # for `flwr run . prod`

`init` makes a CA (ca.crt, ca.key) and a SuperLink certificate (server.pem, server.key) signed by it,
valid for the compose service name `superlink`, `localhost`, 127.0.0.1 (the SuperLink's own ServerApp
executor connects there) and every --name/--ip given: the public host name clients dial must be one of
them, or their TLS handshake fails. SuperNode keys are ECDSA P-384 in OpenSSH format, which is what
`flower-supernode --auth-supernode-private-key` and `flwr supernode register` read. `register` tells the
SuperLink (started with --enable-supernode-auth) to accept a public key; a key registered before is
accepted again (idempotent), so restarts and re-runs can register unconditionally.

Private keys are written 0600 and never overwritten: re-running `init` keeps an existing CA.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_SERVER_NAMES = ("superlink", "localhost")
DEFAULT_SERVER_IPS = ("127.0.0.1",)
VALID_DAYS = 365
CURVE = ec.SECP384R1  # a NIST curve: Flower accepts only those for SuperNode keys


@dataclass(frozen=True)
class TlsFiles:
    """What a TLS SuperLink is started with; clients need only `ca_cert`."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def in_directory(cls, directory: Path) -> TlsFiles:
        files = cls(directory / "ca.crt", directory / "server.pem", directory / "server.key")
        missing = [str(path) for path in (files.ca_cert, files.server_cert, files.server_key) if not path.is_file()]
        if missing:
            raise FileNotFoundError(f"missing TLS files {', '.join(missing)}; run `fedbayes pki init --out {directory}`")
        return files


@dataclass(frozen=True)
class SupernodeKey:
    private: Path
    public: Path


def init_pki(directory: Path, names: Iterable[str] = (), ips: Iterable[str] = ()) -> TlsFiles:
    """CA (kept if present) + a fresh SuperLink certificate for DEFAULT_SERVER_NAMES/IPS plus `names`/`ips`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    if ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    else:
        ca_key = ec.generate_private_key(CURVE())
        ca_cert = _ca_certificate(ca_key)
        _write_private(ca_key_path, _pem_private(ca_key))
        ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server_key = ec.generate_private_key(CURVE())
    server_cert = _server_certificate(
        server_key, ca_cert, ca_key,
        dns_names=_unique([*DEFAULT_SERVER_NAMES, *names]),
        ip_addresses=_unique([*DEFAULT_SERVER_IPS, *ips]),
    )
    _write_private(directory / "server.key", _pem_private(server_key))
    (directory / "server.pem").write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    return TlsFiles.in_directory(directory)


def server_certificate_names(cert_path: Path) -> list[str]:
    """The DNS names and IPs a certificate is valid for (what `init` put in its SAN)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))]


def make_supernode_key(directory: Path, client_id: str) -> SupernodeKey:
    """`<directory>/<client_id>` (private, OpenSSH, 0600) and `<client_id>.pub`; an existing pair is kept,
    because the SuperLink knows a client by its registered public key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = SupernodeKey(directory / client_id, directory / f"{client_id}.pub")
    if key.private.exists():
        return key
    private = ec.generate_private_key(CURVE())
    _write_private(key.private, private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ))
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    key.public.write_bytes(public + f" {client_id}\n".encode())
    return key


def connection_config(name: str, control_address: str, ca_cert: Path | None) -> str:
    """A `flwr` CLI connection ($FLWR_HOME/config.toml) to a SuperLink's Control API, TLS unless `ca_cert`
    is None (loopback development only)."""
    transport = f'root-certificates = "{ca_cert.resolve()}"' if ca_cert is not None else "insecure = true"
    return f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{control_address}"\n{transport}\n'


def register_supernode(
    public_key: Path, connection: str, env: Mapping[str, str], command_prefix: Iterable[str] = (),
    flwr: str = "flwr", timeout: float = 60.0,
) -> int | None:
    """`flwr supernode register` through the connection named `connection` in env's FLWR_HOME. Returns the
    node id the SuperLink bound to the key, or None when it knew the key already (that is fine)."""
    result = subprocess.run(
        [*command_prefix, flwr, "supernode", "register", str(public_key), connection, "--format", "json"],
        env=dict(env), capture_output=True, text=True, timeout=timeout,
    )
    if result.returncode != 0:
        if "already in use" in result.stdout + result.stderr:
            return None
        raise RuntimeError(f"registering {public_key} failed:\n{result.stdout}{result.stderr}")
    return int(json.loads(result.stdout[result.stdout.index("{"):])["node-id"])


def list_supernodes(
    connection: str, env: Mapping[str, str], command_prefix: Iterable[str] = (), flwr: str = "flwr"
) -> list[dict]:
    """`flwr supernode list --format json`: one dict per registered node ("node-id", "status", ...)."""
    result = subprocess.run(
        [*command_prefix, flwr, "supernode", "list", connection, "--format", "json"],
        env=dict(env), capture_output=True, text=True, timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"flwr supernode list failed:\n{result.stdout}{result.stderr}")
    return json.loads(result.stdout)["nodes"]


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedbayes federation CA")])
    return (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False,
        ), critical=True)
        .sign(key, hashes.SHA384())
    )


def _server_certificate(
    key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, ca_key, dns_names: list[str], ip_addresses: list[str]
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])])
    alternative_names = [x509.DNSName(name) for name in dns_names]
    alternative_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    return (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew between machines
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _pem_private(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_private(path: Path, payload: bytes) -> None:
    """Created 0600 from the start (never world-readable, not even briefly), then renamed into place."""
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(handle, "wb") as key_file:
        key_file.write(payload)
    os.replace(temp_name, path)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


# ---- command line -------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="pki_command", required=True)
    init = commands.add_parser("init", help="CA (kept if present) + SuperLink certificate")
    init.add_argument("--out", type=Path, required=True)
    init.add_argument("--name", action="append", default=[], help="extra DNS name clients use (repeatable)")
    init.add_argument("--ip", action="append", default=[], help="extra IP address clients use (repeatable)")
    init.set_defaults(handler=_init)
    key = commands.add_parser("supernode-key", help="ECDSA key pair per client id (kept if present)")
    key.add_argument("--out", type=Path, required=True)
    key.add_argument("client_ids", nargs="+")
    key.set_defaults(handler=_keys)
    register = commands.add_parser("register", help="register SuperNode public keys with a running SuperLink")
    register.add_argument("--superlink", required=True, help="the SuperLink's Control API, host:port")
    register.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate")
    register.add_argument("public_keys", nargs="+", type=Path)
    register.set_defaults(handler=_register)
    connect = commands.add_parser("connection", help="write a TLS `flwr` connection into $FLWR_HOME/config.toml")
    connect.add_argument("--name", required=True, help="connection name for `flwr run <app> <name>`")
    connect.add_argument("--superlink", required=True, help="the SuperLink's Control API, host:port")
    connect.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate")
    connect.set_defaults(handler=_connection)


def run(args: argparse.Namespace) -> int:
    return args.handler(args)


def _init(args: argparse.Namespace) -> int:
    files = init_pki(args.out, args.name, args.ip)
    print(f"CA {files.ca_cert}; SuperLink certificate {files.server_cert} for "
          f"{', '.join(server_certificate_names(files.server_cert))}")
    return 0


def _keys(args: argparse.Namespace) -> int:
    for client_id in args.client_ids:
        key = make_supernode_key(args.out, client_id)
        print(f"{client_id}: private {key.private} (give to that client only), public {key.public} (register it)")
    return 0


def _connection(args: argparse.Namespace) -> int:
    flwr_home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(connection_config(args.name, args.superlink, args.ca))
    return 0


def _register(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as flwr_home:
        Path(flwr_home, "config.toml").write_text(connection_config("fedbayes-admin", args.superlink, args.ca))
        env = {**os.environ, "FLWR_HOME": flwr_home, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
        for public_key in args.public_keys:
            node_id = register_supernode(public_key, "fedbayes-admin", env)
            print(f"{public_key}: " + (f"registered as node {node_id}" if node_id else "was registered already"))
        for node in list_supernodes("fedbayes-admin", env):
            print(f"node {node['node-id']}: {node['status']}")
    return 0
