"""Can this machine join the federation? Name, network, TLS, clock and key, checked one at a time
against the SuperLink's Fleet API, each failure named with what to do about it.

    fedbayes client --check --superlink fl.example.org:9092 --ca ca.crt --key keys/hospital-d

The last step asks the SuperLink to activate this key's node and deactivates it at once: the Fleet API
has no other call that tells whether it accepts a key (every other call needs the node id that only
activation returns). The probe pulls no message, so it never takes part in a run; the node is online
for the milliseconds between the two calls, and announces the shortest heartbeat interval Flower allows,
so a probe cut off between them leaves the node online for 20 s, not a SuperNode's 60 s.

The SuperLink refuses activation with one error (code 2004) for two different reasons it does not tell
apart: the key was never registered, or its node is still online, from a running client or from one that
died without signing off and whose heartbeat has not yet lapsed (2 x 30 s). `fedbayes client` therefore
retries a refusal (and an unreachable SuperLink) for a while before it gives up.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from fedbayes.deploy.pki import certificate_names

CONNECT_TIMEOUT = 10.0
RPC_TIMEOUT = 30.0
ACTIVATION_REFUSED = 2004  # Flower's ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED
DEACTIVATION_REFUSED = 2005  # Flower's ApiErrorCode.FLEET_NODE_DEACTIVATION_FAILED: the node is not online


class ProbeError(RuntimeError):
    """A step failed; the message says what is wrong and what to do. `retryable`: a later attempt can
    succeed without anyone changing anything (the SuperLink is down, or still holds this key's node)."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class FleetTarget:
    """A SuperLink's Fleet API as one client sees it: its address, the CA it trusts, its own key."""

    host: str
    port: int
    ca_cert: Path
    private_key: Path

    @classmethod
    def from_address(cls, superlink: str, ca_cert: Path, private_key: Path) -> FleetTarget:
        """The target `--superlink`, `--ca` and `--key` name; nothing is read or dialled yet.

        Args:
            superlink: the Fleet API's host:port (an IPv6 host in brackets).
            ca_cert: the federation's CA certificate.
            private_key: this client's private key (OpenSSH).

        Returns:
            The target, its host without brackets.

        Raises:
            ProbeError: `superlink` is not host:port with a numeric port.
        """
        host, separator, port = superlink.rpartition(":")
        if not separator or not host or not port.isdigit():
            raise ProbeError(f"--superlink {superlink!r} must be host:port, e.g. fl.example.org:9092")
        return cls(host.strip("[]"), int(port), ca_cert, private_key)

    @property
    def address(self) -> str:
        """host:port to dial, an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def check(target: FleetTarget, say: Callable[[str], None]) -> int:
    """Every step in order, one line each; the node id the SuperLink holds for this key.

    Args:
        target: the SuperLink and this client's files.
        say: called with each step's line once it passed.

    Returns:
        The node id.

    Raises:
        ProbeError: the first step that failed (key, name, network, TLS, node authentication), saying what to do;
            `retryable` where it may pass by itself.
    """
    key = load_private_key(target.private_key)
    say(f"key          {target.private_key}: ECDSA {key.curve.name}")
    addresses = resolve(target.host)
    say(f"name         {target.host} -> {', '.join(addresses)}")
    milliseconds = connect(target, addresses[0])
    say(f"network      {addresses[0]}:{target.port} accepts connections ({milliseconds:.0f} ms)")
    certificate = verify_tls(target)
    say(
        f"TLS          the SuperLink's certificate is signed by {target.ca_cert} and valid for {target.host}"
        f" (names: {', '.join(certificate_names(certificate))}; until {certificate.not_valid_after_utc:%Y-%m-%d})"
    )
    node_id = activate_and_release(target, key)
    say(f"node auth    the SuperLink accepts this key as node {node_id} (clock within its tolerance)")
    return node_id


def load_private_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """This client's private key, as the SuperNode will load it.

    Args:
        path: --key, an unencrypted OpenSSH private key file.

    Returns:
        The key.

    Raises:
        ProbeError: the file does not exist, is not an unencrypted OpenSSH private key, or not an ECDSA one.
        OSError: it cannot be read for another reason.
    """
    try:
        key = load_ssh_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise ProbeError(f"--key {path} does not exist") from None
    except (ValueError, TypeError) as error:
        raise ProbeError(
            f"--key {path} is not an unencrypted OpenSSH private key ({error}); make a key pair with "
            "`fedbayes pki supernode-key` and pass the file without .pub"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ProbeError(
            f"--key {path} is a {type(key).__name__}; the SuperLink accepts ECDSA keys on a NIST curve "
            "(`fedbayes pki supernode-key` makes P-384 ones)"
        )
    return key


def resolve(host: str) -> list[str]:
    """The addresses `host` resolves to, as a client's gRPC would dial them.

    Args:
        host: a host name or IP address.

    Returns:
        Its addresses, in the resolver's order, without repeats.

    Raises:
        ProbeError: it does not resolve.
    """
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ProbeError(
            f"cannot resolve {host!r} ({error.strerror}): put the SuperLink's name in DNS or in /etc/hosts "
            f"(e.g. `<server IP> {host}`), or, for a server known only by its IP, dial the IP and ask the operator "
            "for a certificate made with `fedbayes pki init --ip <server IP>`"
        ) from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))  # the address of an AF_INET or AF_INET6 sockaddr


def connect(target: FleetTarget, ip: str) -> float:
    """Milliseconds a TCP connection to the Fleet port took.

    Args:
        target: the SuperLink: its port.
        ip: the address to dial (`resolve`).

    Returns:
        The milliseconds.

    Raises:
        ProbeError: no connection within CONNECT_TIMEOUT seconds (retryable).
    """
    started = time.monotonic()
    try:
        socket.create_connection((ip, target.port), timeout=CONNECT_TIMEOUT).close()
    except OSError as error:
        raise ProbeError(
            f"no connection to the SuperLink at {ip}:{target.port} ({error.strerror or error}): is it running, and "
            f"does the server's firewall let this machine reach port {target.port}?",
            retryable=True,
        ) from None
    return (time.monotonic() - started) * 1000


def verify_tls(target: FleetTarget) -> x509.Certificate:
    """The SuperLink's certificate, verified against the CA for the name dialled (what gRPC checks too).

    Args:
        target: the SuperLink: its host and port, and the CA file.

    Returns:
        The certificate it presented.

    Raises:
        ProbeError: the CA file does not exist, the certificate is not valid for the name, out of date or not signed by
            the CA (each explained), or the handshake failed (retryable where the connection broke).
    """
    context = ssl.create_default_context(cafile=str(_readable(target.ca_cert, "--ca")))
    context.set_alpn_protocols(["h2"])  # gRPC's protocol; the Fleet API offers no other
    try:
        with socket.create_connection((target.host, target.port), timeout=CONNECT_TIMEOUT) as raw:
            with context.wrap_socket(raw, server_hostname=target.host) as tls:
                certificate = tls.getpeercert(binary_form=True)
                if certificate is None:  # not after a verified handshake; mypy cannot know that
                    raise ProbeError(f"{target.host}:{target.port} sent no certificate")
                return x509.load_der_x509_certificate(certificate)
    except ssl.SSLCertVerificationError as error:
        raise ProbeError(_explain_certificate_failure(target, error.verify_message)) from None
    except (ssl.SSLError, OSError) as error:
        raise ProbeError(
            f"TLS handshake with {target.address} failed ({error}): is {target.port} the SuperLink's "
            "Fleet API port (9092 by default)?",
            retryable=isinstance(error, ConnectionError),
        ) from None


def _explain_certificate_failure(target: FleetTarget, reason: str) -> str:
    presented = x509.load_pem_x509_certificate(ssl.get_server_certificate((target.host, target.port)).encode())
    names = ", ".join(certificate_names(presented))
    valid = f"{presented.not_valid_before_utc:%Y-%m-%d %H:%M} to {presented.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    now = datetime.datetime.now(datetime.UTC)
    if "Hostname mismatch" in reason or "IP address mismatch" in reason:
        option = "--ip" if is_ip(target.host) else "--name"
        return (
            f"the SuperLink's certificate is valid for {names}, not for {target.host!r}: dial one of those names "
            f"(DNS or /etc/hosts), or ask the operator to add yours (`fedbayes pki init {option} {target.host}`, "
            "then restart the SuperLink)"
        )
    if "expired" in reason or "not yet valid" in reason:
        return (
            f"the SuperLink's certificate is valid {valid}, and this machine's clock says {now:%Y-%m-%d %H:%M} "
            f"UTC ({reason}): set the clock (NTP), or, if the certificate has really expired, ask the operator "
            "for a new one"
        )
    return (
        f"the SuperLink's certificate (for {names}) is not signed by {target.ca_cert} ({reason}): use the "
        "ca.crt of this federation, from its operator"
    )


def activate_and_release(target: FleetTarget, key: ec.EllipticCurvePrivateKey) -> int:
    """Activate this key's node and deactivate it at once; its node id.

    Args:
        target: the SuperLink.
        key: this client's private key.

    Returns:
        The node id.

    Raises:
        ProbeError: the SuperLink refused the key, the clock, or is unavailable (`activate`, `deactivate`).
    """
    from fedbayes.flowerseam.constants import HEARTBEAT_MIN_INTERVAL

    with fleet_stub(target, key) as stub:
        node_id = activate(stub, key, HEARTBEAT_MIN_INTERVAL)
        deactivate(stub, node_id)
    return node_id


@contextmanager
def fleet_stub(target: FleetTarget, key: ec.EllipticCurvePrivateKey) -> Iterator:
    """A Fleet API stub over TLS that signs every call with the client's key, as a SuperNode's does.

    Args:
        target: the SuperLink: its address and the CA file.
        key: this client's private key.

    Yields:
        The stub; its channel is closed when the block ends.

    Raises:
        ProbeError: the CA file does not exist.
    """
    from fedbayes.flowerseam.fleet import signed_fleet_stub

    credentials = grpc.ssl_channel_credentials(_readable(target.ca_cert, "--ca").read_bytes())
    channel = grpc.secure_channel(target.address, credentials)
    try:
        yield signed_fleet_stub(channel, key)
    finally:
        channel.close()


def activate(stub, key: ec.EllipticCurvePrivateKey, heartbeat_interval: float) -> int:
    """ActivateNode for this key, promising a heartbeat every `heartbeat_interval` s; the node id.

    Args:
        stub: a signed Fleet API stub (`fleet_stub`).
        key: this client's private key.
        heartbeat_interval: seconds between the heartbeats promised.

    Returns:
        The node id.

    Raises:
        ProbeError: the call failed, explained: the key refused (retryable), the clock, the SuperLink unavailable
            (retryable), or what it answered.
    """
    from fedbayes.flowerseam.fleet import activate_node_request

    request = activate_node_request(key, heartbeat_interval)
    try:
        return stub.ActivateNode(request, timeout=RPC_TIMEOUT).node_id
    except grpc.RpcError as error:
        raise _explain_rpc_failure(error) from None


def deactivate(stub, node_id: int) -> None:
    """DeactivateNode: the node goes offline at once, so that the key can be used again.

    Args:
        stub: a signed Fleet API stub (`fleet_stub`).
        node_id: the node `activate` returned.

    Raises:
        ProbeError: the call failed, explained as for `activate`.
    """
    from fedbayes.flowerseam.fleet import deactivate_node_request

    try:
        stub.DeactivateNode(deactivate_node_request(node_id), timeout=RPC_TIMEOUT)
    except grpc.RpcError as error:
        raise _explain_rpc_failure(error) from None


def release_if_online(target: FleetTarget, node_id: int, timeout: float = RPC_TIMEOUT) -> bool:
    """Deactivate this key's node if the SuperLink still holds it online; a node already offline is left as it is.

    Args:
        target: the SuperLink and this client's files.
        node_id: the node the SuperLink holds for this key.
        timeout: seconds the call may take.

    Returns:
        True if the node was online and is now offline, False if it was offline already.

    Raises:
        ProbeError: the call failed for another reason (the SuperLink unreachable, the key refused).
    """
    from fedbayes.flowerseam.fleet import deactivate_node_request, flower_error

    with fleet_stub(target, load_private_key(target.private_key)) as stub:
        try:
            stub.DeactivateNode(deactivate_node_request(node_id), timeout=timeout)
        except grpc.RpcError as error:
            refused = flower_error(error.details() or "")
            if refused is not None and refused.code == DEACTIVATION_REFUSED:
                return False
            raise _explain_rpc_failure(error) from None
    return True


def _explain_rpc_failure(error: grpc.RpcError) -> ProbeError:
    from fedbayes.flowerseam.fleet import flower_error as flower_error_in

    details = error.details() or ""
    flower_error = flower_error_in(details)
    if flower_error is not None and flower_error.code == ACTIVATION_REFUSED:
        return ProbeError(
            "the SuperLink refuses this key (Flower code 2004). Either it is not registered (send the .pub file to the "
            "operator: `fedbayes pki register ... --client-id <id> <key>.pub`), or its node is still online: a client "
            "with this key is running (here or elsewhere), or one stopped without signing off less than 60 s ago",
            retryable=True,
        )
    if error.code() == grpc.StatusCode.UNAUTHENTICATED and "timestamp" in details:
        now = datetime.datetime.now(datetime.UTC)
        return ProbeError(
            f"the SuperLink rejects this machine's clock ({now:%Y-%m-%d %H:%M:%S} UTC): signed requests "
            "may be at most 5 s ahead of the server's clock or 300 s behind; set the clock (NTP)"
        )
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return ProbeError(f"the SuperLink is unavailable ({details})", retryable=True)
    message = f"[code: {flower_error.code}] {flower_error.message}" if flower_error is not None else details
    return ProbeError(f"the SuperLink answered {error.code().name}: {message}")


def is_ip(host: str) -> bool:
    """Whether `host` is an IP address (a certificate lists it with --ip), not a name.

    Args:
        host: a host name or address, without brackets.

    Returns:
        True for an IPv4 or IPv6 address.
    """
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _readable(path: Path, option: str) -> Path:
    if not path.is_file():
        raise ProbeError(f"{option} {path} does not exist")
    return path
