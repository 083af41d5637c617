"""Certificates and SuperNode keys for a federation that crosses machines: TLS + node authentication.

    fedbayes pki init --out certs --name fl.example.org          # CA + SuperLink certificate
    fedbayes pki supernode-key --out certs/supernodes hospital-a  # one key pair per client
    fedbayes pki register --superlink 127.0.0.1:9093 --ca certs/ca.crt \
        --registry certs/registry/clients.json --client-id hospital-a certs/supernodes/hospital-a.pub
    fedbayes pki connection --name prod --superlink 127.0.0.1:9093 --ca certs/ca.crt  # for `flwr run . prod`

`init` makes a CA (ca.crt, ca.key) and a SuperLink certificate (server.pem, server.key) signed by it,
valid for the compose service name `superlink`, `localhost`, 127.0.0.1 (the SuperLink's own ServerApp
executor connects there) and every --name/--ip given: the public host name clients dial must be one of
them, or their TLS handshake fails. SuperNode keys are ECDSA P-384 in OpenSSH format, which is what
`flower-supernode --auth-supernode-private-key` and `flwr supernode register` read. `register` tells the
SuperLink (started with --enable-supernode-auth) to accept a public key and prints the node id the
SuperLink bound to it; a key registered before keeps its node id (idempotent), so restarts and re-runs
can register unconditionally. With --registry it also records client id -> node id in the JSON file the
ServerApp reads as run config `client-registry`: a client id is then accepted only from its key's node.

Private keys are written 0600. Nothing is overwritten unless --force: `init` onto a folder that holds a SuperLink
certificate is refused, and with --force issues a new one; a CA whose key is there is kept either way (every
SuperNode trusts it). `supernode-key` keeps an existing key pair (the SuperLink knows a client by its registered
public key) and refuses a lone public key. `connection` refuses an existing $FLWR_HOME/config.toml.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedbayes.flowerseam.constants import PUBLIC_KEY_ALREADY_IN_USE_MESSAGE
from fedbayes.tasks.storage import OUTPUT_MODE, check_new_files, is_safe_name, write_atomically

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
        """The files `init_pki` wrote into `directory`: ca.crt, server.pem and server.key.

        Args:
            directory: the folder `fedbayes pki init --out` wrote.

        Returns:
            Their paths.

        Raises:
            FileNotFoundError: any of the three is not a file there.
        """
        files = cls(directory / "ca.crt", directory / "server.pem", directory / "server.key")
        missing = [str(path) for path in (files.ca_cert, files.server_cert, files.server_key) if not path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"missing TLS files {', '.join(missing)}; run `fedbayes pki init --out {directory}`"
            )
        return files


@dataclass(frozen=True)
class SupernodeKey:
    """A SuperNode's key pair: its private key (OpenSSH, 0600) and its public key (`.pub`, OpenSSH)."""

    private: Path
    public: Path


def init_outputs(directory: Path) -> list[Path]:
    """The files `init_pki` writes into `directory`: the SuperLink's certificate and key, and the CA's unless its key
    is there (then it is kept).

    Args:
        directory: the folder `init_pki` writes into.

    Returns:
        Their paths, the CA's first.
    """
    ca_files = [] if (directory / "ca.key").exists() else [directory / "ca.crt", directory / "ca.key"]
    return [*ca_files, directory / "server.pem", directory / "server.key"]


def init_pki(directory: Path, names: Iterable[str] = (), ips: Iterable[str] = ()) -> TlsFiles:
    """CA (kept if present) + a fresh SuperLink certificate for DEFAULT_SERVER_NAMES/IPS plus `names`/`ips`: the
    files `init_outputs` names, each replaced atomically if there.

    Args:
        directory: where the files go; made if missing.
        names: DNS names the SuperLink certificate is valid for besides DEFAULT_SERVER_NAMES (repeats and empty ones
            are dropped).
        ips: IP addresses it is valid for besides DEFAULT_SERVER_IPS.

    Returns:
        The CA certificate, SuperLink certificate and key in `directory`; certificates are valid for VALID_DAYS days.

    Raises:
        ValueError: an entry of `ips` is not an IP address, or the CA's key file does not hold a PEM key.
        FileNotFoundError: the CA's key is there without its certificate.
    """
    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    if ca_key_path.exists():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    else:
        ca_key = ec.generate_private_key(CURVE())
        ca_cert = _ca_certificate(ca_key)
        _write_private(ca_key_path, _pem_private(ca_key))
        write_atomically(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM), OUTPUT_MODE)
    server_key = ec.generate_private_key(CURVE())
    server_cert = _server_certificate(
        server_key,
        ca_cert,
        ca_key,
        dns_names=_unique([*DEFAULT_SERVER_NAMES, *names]),
        ip_addresses=_unique([*DEFAULT_SERVER_IPS, *ips]),
    )
    _write_private(directory / "server.key", _pem_private(server_key))
    write_atomically(directory / "server.pem", server_cert.public_bytes(serialization.Encoding.PEM), OUTPUT_MODE)
    return TlsFiles.in_directory(directory)


def server_certificate_names(cert_path: Path) -> list[str]:
    """The DNS names and IPs a certificate file is valid for (what `init` put in its SAN).

    Args:
        cert_path: a PEM certificate file.

    Returns:
        The DNS names, then the IPs as text; empty for a certificate without a SAN.

    Raises:
        ValueError: the file is not a PEM certificate.
    """
    return certificate_names(x509.load_pem_x509_certificate(cert_path.read_bytes()))


def certificate_names(certificate: x509.Certificate) -> list[str]:
    """The DNS names and IPs a certificate is valid for (its SAN).

    Args:
        certificate: the certificate.

    Returns:
        The DNS names, then the IPs as text; empty without a SAN.
    """
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))]


def make_supernode_key(directory: Path, client_id: str) -> SupernodeKey:
    """`<directory>/<client_id>` (private, OpenSSH, 0600) and `<client_id>.pub`; an existing pair is kept,
    because the SuperLink knows a client by its registered public key.

    Args:
        directory: where the pair goes; made if missing.
        client_id: the client's id, the files' name; the public key's comment.

    Returns:
        The pair's paths.
    """
    key = supernode_key_files(directory, client_id)
    if key.private.exists():
        return key
    private = ec.generate_private_key(CURVE())
    _write_private(
        key.private,
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    write_atomically(key.public, public + f" {client_id}\n".encode(), OUTPUT_MODE)
    return key


def supernode_key_files(directory: Path, client_id: str) -> SupernodeKey:
    """Where `make_supernode_key` keeps `client_id`'s pair.

    Args:
        directory: the folder of SuperNode keys.
        client_id: the client's id.

    Returns:
        `<directory>/<client_id>` and `<directory>/<client_id>.pub`; neither needs to exist.
    """
    return SupernodeKey(directory / client_id, directory / f"{client_id}.pub")


def connection_config(name: str, control_address: str, ca_cert: Path | None) -> str:
    """A `flwr` CLI connection ($FLWR_HOME/config.toml) to a SuperLink's Control API, TLS unless `ca_cert`
    is None (loopback development only).

    Args:
        name: the connection's name (`flwr run <app> <name>`), also made the default one.
        control_address: the Control API's host:port.
        ca_cert: the federation's CA certificate, written as an absolute path; None: insecure.

    Returns:
        The TOML text.
    """
    transport = f'root-certificates = "{ca_cert.resolve()}"' if ca_cert is not None else "insecure = true"
    return f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{control_address}"\n{transport}\n'


def register_supernode(
    public_key: Path,
    connection: str,
    env: Mapping[str, str],
    command_prefix: Iterable[str] = (),
    flwr: str = "flwr",
    timeout: float = 60.0,
) -> int:
    """`flwr supernode register` through the connection named `connection` in env's FLWR_HOME; the node id
    the SuperLink bound to the key. A key it holds already keeps its node id, which is looked up and
    returned: registering is idempotent, so a SuperLink restarted with its database (compose `down` +
    `up` with the volumes kept) lets every registration run again. `command_prefix` runs both commands
    on the server's host (e.g. `ip netns exec <ns>`).

    Args:
        public_key: the SuperNode's public key file (OpenSSH).
        connection: the connection's name in env's FLWR_HOME/config.toml.
        env: the environment both commands run in (its FLWR_HOME).
        command_prefix: what runs the commands on the server's host; empty: here.
        flwr: the `flwr` executable.
        timeout: the most seconds each command may take.

    Returns:
        The node id.

    Raises:
        RuntimeError: a command failed or printed no JSON, the SuperLink refused the key for another reason, or it
            names no node for a key it holds.
        subprocess.TimeoutExpired: a command took longer than `timeout`.
    """
    command = [*command_prefix, flwr, "supernode", "register", str(public_key), connection, "--format", "json"]
    reply = _run_json(command, env, timeout, what=f"registering {public_key}")
    if reply.get("success"):
        return int(reply["node-id"])
    # With --format json the CLI reports a refusal as {"success": false, ...} and exits 0.
    error = str(reply.get("error-message", reply))
    if PUBLIC_KEY_ALREADY_IN_USE_MESSAGE not in error:
        raise RuntimeError(f"registering {public_key} failed: {error.strip()}")
    return _node_id_of_registered_key(public_key, connection, env, command_prefix, timeout)


def _node_id_of_registered_key(
    public_key: Path, connection: str, env: Mapping[str, str], command_prefix: Iterable[str], timeout: float
) -> int:
    result = subprocess.run(
        [*command_prefix, sys.executable, "-m", "fedbayes.deploy.control", "node-id", connection, str(public_key)],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"the SuperLink says {public_key} is in use but names no node for it:\n{result.stdout}{result.stderr}"
        )
    return int(result.stdout.split()[-1])


def _run_json(command: list[str], env: Mapping[str, str], timeout: float, what: str) -> dict:
    result = subprocess.run(command, env=dict(env), capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0 or "{" not in result.stdout:
        raise RuntimeError(f"{what} failed (exit code {result.returncode}):\n{result.stdout}{result.stderr}")
    return json.loads(result.stdout[result.stdout.index("{") :])


# ---- client registry: which node may present which client id ---------------------------------------
def read_client_registry(registry: Path) -> dict[str, int]:
    """The registry file `{"<client-id>": <node-id>, ...}`; a missing file is an empty registry.

    Args:
        registry: the registry file (JSON).

    Returns:
        Client id -> node id.

    Raises:
        ValueError: the file is not JSON, or not an object of string keys and integer values.
    """
    if not registry.exists():
        return {}
    try:
        entries = json.loads(registry.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"client registry {registry} is not valid JSON ({error}); fix or move it") from None
    if not isinstance(entries, dict) or not all(
        isinstance(client_id, str) and type(node_id) is int for client_id, node_id in entries.items()
    ):
        raise ValueError(f'client registry {registry} must be a JSON object {{"<client-id>": <node-id>, ...}}')
    return entries


def record_client(registry: Path, client_id: str, node_id: int) -> bool:
    """Bind `client_id` to `node_id` in the registry file; True if the pair is new, False if it was there.

    Refuses, naming both, a client id bound to another node and a node bound to another client id: one
    key is one node is one client.

    Args:
        registry: the registry file (JSON); made, with its folder, if missing.
        client_id: the client's id, [A-Za-z0-9._-]+.
        node_id: the node id its key was registered under (`register_supernode`).

    Returns:
        Whether the file was written.

    Raises:
        ValueError: a bad client id, a client id bound to another node, a node bound to another client id, or a
            registry `read_client_registry` refuses.
    """
    if not is_safe_name(client_id):
        raise ValueError(f"client id {client_id!r} must match [A-Za-z0-9._-]+")
    with _locked(registry) as entries:
        if entries.get(client_id) == node_id:
            return False
        if client_id in entries:
            raise ValueError(
                f"client id {client_id!r} is bound to node {entries[client_id]} in {registry}, not to "
                f"node {node_id}; to move it to the new key, `fedbayes pki forget` it first"
            )
        holders = [other for other, node in entries.items() if node == node_id]
        if holders:
            raise ValueError(
                f"node {node_id} already presents client id {holders[0]!r} in {registry}; "
                f"a key (node) stands for one client id"
            )
        _write_registry(registry, {**entries, client_id: node_id})
        return True


def forget_client(registry: Path, client_id: str) -> int:
    """Remove `client_id` from the registry (a client that left, or that moves to a new key); its node id.

    Args:
        registry: the registry file (JSON).
        client_id: the client id to remove.

    Returns:
        The node id it was bound to.

    Raises:
        ValueError: `client_id` is not in the registry, or the registry is not one `read_client_registry` reads.
    """
    with _locked(registry) as entries:
        if client_id not in entries:
            raise ValueError(
                f"client id {client_id!r} is not in {registry} (it has {', '.join(sorted(entries)) or 'none'})"
            )
        node_id = entries.pop(client_id)
        _write_registry(registry, entries)
        return node_id


@contextmanager
def _locked(registry: Path) -> Iterator[dict[str, int]]:
    """The registry's entries, read under an exclusive lock on its directory (held until the block ends), so
    concurrent registrations do not lose each other's entries."""
    registry.parent.mkdir(parents=True, exist_ok=True)
    directory = os.open(registry.parent, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        yield read_client_registry(registry)
    finally:
        os.close(directory)  # releases the lock


def _write_registry(registry: Path, entries: dict[str, int]) -> None:
    """Replaced atomically: a reader (the ServerApp re-reads it every round) sees the old or the new file."""
    write_atomically(registry, (json.dumps(entries, indent=2, sort_keys=True) + "\n").encode(), mode=0o644)


def list_supernodes(
    connection: str, env: Mapping[str, str], command_prefix: Iterable[str] = (), flwr: str = "flwr"
) -> list[dict]:
    """`flwr supernode list --format json`: one dict per registered node ("node-id", "status", ...).

    Args:
        connection: the connection's name in env's FLWR_HOME/config.toml.
        env: the environment the command runs in.
        command_prefix: what runs the command on the server's host; empty: here.
        flwr: the `flwr` executable.

    Returns:
        The "nodes" of the command's JSON answer.

    Raises:
        RuntimeError: the command exited non-zero.
        subprocess.TimeoutExpired: it took longer than 60 s.
    """
    result = subprocess.run(
        [*command_prefix, flwr, "supernode", "list", connection, "--format", "json"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"flwr supernode list failed:\n{result.stdout}{result.stderr}")
    return json.loads(result.stdout)["nodes"]


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedbayes federation CA")])
    return (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA384())
    )


def _server_certificate(
    key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, ca_key, dns_names: list[str], ip_addresses: list[str]
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])])
    alternative_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alternative_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    return (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
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
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write_private(path: Path, payload: bytes) -> None:
    """Created 0600 from the start: never world-readable, not even briefly."""
    write_atomically(path, payload)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


# ---- command line -------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`fedbayes pki`'s subcommands (init, supernode-key, register, forget, connection) and their options.

    Args:
        parser: the `pki` parser; each subcommand sets `handler`, which `run` calls.
    """
    commands = parser.add_subparsers(dest="pki_command", required=True)
    init = commands.add_parser("init", help="CA (kept if present) + SuperLink certificate")
    init.add_argument("--out", type=Path, required=True)
    init.add_argument(
        "--force", action="store_true", help="--out holds a SuperLink certificate: issue a new one (the CA is kept)"
    )
    init.add_argument("--name", action="append", default=[], help="extra DNS name clients use (repeatable)")
    init.add_argument("--ip", action="append", default=[], help="extra IP address clients use (repeatable)")
    init.set_defaults(handler=_init)
    key = commands.add_parser("supernode-key", help="ECDSA key pair per client id (kept if present)")
    key.add_argument("--out", type=Path, required=True)
    key.add_argument(
        "--force", action="store_true", help="replace a public key that has no private key beside it (a pair is kept)"
    )
    key.add_argument("client_ids", nargs="+")
    key.set_defaults(handler=_keys)
    register = commands.add_parser("register", help="register SuperNode public keys with a running SuperLink")
    register.add_argument("--superlink", required=True, help="the SuperLink's Control API, host:port")
    register.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate")
    register.add_argument(
        "--registry",
        type=Path,
        help="client registry (JSON client id -> node id) the ServerApp reads as `client-registry`",
    )
    register.add_argument(
        "--client-id",
        action="append",
        default=[],
        dest="client_ids",
        metavar="CLIENT_ID",
        help="the client id each key stands for, in the order of the keys (with --registry)",
    )
    register.add_argument("public_keys", nargs="+", type=Path)
    register.set_defaults(handler=_register)
    forget = commands.add_parser("forget", help="remove client ids from a client registry (the keys stay registered)")
    forget.add_argument("--registry", type=Path, required=True)
    forget.add_argument("client_ids", nargs="+")
    forget.set_defaults(handler=_forget)
    connect = commands.add_parser("connection", help="write a TLS `flwr` connection into $FLWR_HOME/config.toml")
    connect.add_argument("--name", required=True, help="connection name for `flwr run <app> <name>`")
    connect.add_argument("--superlink", required=True, help="the SuperLink's Control API, host:port")
    connect.add_argument("--ca", type=Path, required=True, help="the federation's CA certificate")
    connect.add_argument("--force", action="store_true", help="replace an existing $FLWR_HOME/config.toml")
    connect.set_defaults(handler=_connection)


def run(args: argparse.Namespace) -> int:
    """Run the parsed `fedbayes pki` subcommand.

    Args:
        args: the command line as `add_arguments`' parser parsed it.

    Returns:
        0; a failure raises.

    Raises:
        ValueError: a bad client id, a --client-id without --registry or not one per key, a registry refused, or an
            output file that exists without --force (OutputExists).
        RuntimeError: the SuperLink refused a registration or a listing.
    """
    return args.handler(args)


def _init(args: argparse.Namespace) -> int:
    check_new_files(init_outputs(args.out), args.force)
    files = init_pki(args.out, args.name, args.ip)
    print(
        f"CA {files.ca_cert}; SuperLink certificate {files.server_cert} for "
        f"{', '.join(server_certificate_names(files.server_cert))}"
    )
    return 0


def _keys(args: argparse.Namespace) -> int:
    for client_id in args.client_ids:
        if not is_safe_name(client_id):
            raise ValueError(f"client id {client_id!r} must match [A-Za-z0-9._-]+")
    pairs = [supernode_key_files(args.out, client_id) for client_id in args.client_ids]
    check_new_files([pair.public for pair in pairs if not pair.private.exists()], args.force)
    for client_id in args.client_ids:
        key = make_supernode_key(args.out, client_id)
        print(f"{client_id}: private {key.private} (give to that client only), public {key.public} (register it)")
    return 0


def _connection(args: argparse.Namespace) -> int:
    config = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr")) / "config.toml"
    check_new_files([config], args.force)
    write_atomically(config, connection_config(args.name, args.superlink, args.ca).encode(), OUTPUT_MODE)
    return 0


def _register(args: argparse.Namespace) -> int:
    from fedbayes.deploy.launcher import console_script  # deploy.launcher imports this module

    client_ids = _client_ids_for_keys(args)
    flwr = console_script("flwr")
    with tempfile.TemporaryDirectory() as flwr_home:
        Path(flwr_home, "config.toml").write_text(connection_config("fedbayes-admin", args.superlink, args.ca))
        env = {**os.environ, "FLWR_HOME": flwr_home, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
        for public_key, client_id in zip(args.public_keys, client_ids):
            node_id = register_supernode(public_key, "fedbayes-admin", env, flwr=flwr)
            print(f"{public_key}: node {node_id}")
            if client_id is not None:
                new = record_client(args.registry, client_id, node_id)
                print(
                    f"  client id {client_id!r} -> node {node_id} "
                    + ("recorded in" if new else "was already in")
                    + f" {args.registry}"
                )
        for node in list_supernodes("fedbayes-admin", env, flwr=flwr):
            print(f"node {node['node-id']}: {node['status']}")
    return 0


def _forget(args: argparse.Namespace) -> int:
    for client_id in args.client_ids:
        print(f"client id {client_id!r} (node {forget_client(args.registry, client_id)}) removed from {args.registry}")
    return 0


def _client_ids_for_keys(args: argparse.Namespace) -> list[str | None]:
    """One client id per key with --registry; checked before anything is registered."""
    if args.registry is None:
        if args.client_ids:
            raise ValueError("--client-id needs --registry: the registry file is where the binding is kept")
        return [None] * len(args.public_keys)
    if len(args.client_ids) != len(args.public_keys):
        raise ValueError(
            f"--registry needs one --client-id per public key, in the same order; got "
            f"{len(args.client_ids)} client id(s) for {len(args.public_keys)} key(s)"
        )
    for client_id in args.client_ids:
        if not is_safe_name(client_id):
            raise ValueError(f"client id {client_id!r} must match [A-Za-z0-9._-]+")
    read_client_registry(args.registry)  # a broken registry file is reported before any key is registered
    return list(args.client_ids)
