"""The exported posterior's file: safetensors, whose metadata is a JSON header, checked in full when read.

Metadata (all strings, as safetensors holds them):
  format          "fedbayes-posterior"
  format_version  FORMAT_VERSION; a reader refuses a newer one
  header          JSON, `Header`: strategy, what the posterior is, the model spec, input shape, classes,
                  preprocessing, round, federation, seed, how the server evaluated the round, fedbayes' version
  checksum        SHA-256 over every tensor and the other metadata but the signature (tasks/storage.py `checksum`, as
                  server checkpoints): catches corruption, not tampering (whoever edits the file can recompute it)
  signature       optional (`fedbayes export --sign KEY`): Ed25519 over SIGNED_PREFIX + the checksum, base64; checked
                  against a public key the reader names (`verify`), it says who made the file and that nobody changed it
Every size in the header that decides memory is bounded before it is believed (`PosteriorLimits`), the safetensors
header's length before safetensors reads it; the tensors' own sizes are the file's (safetensors checks them against
its length), and the header's layout must be exactly theirs.
Tensors, by posterior kind (parameters are the model's, in the order `Header.parameters` lists them):
  every kind          mean/<parameter>       the global model as the server evaluates it (DSVGD: the particle mean)
                      buffer/<buffer>        the model's buffers (BatchNorm statistics), averaged by the round core
  gaussian-diagonal   precision/<parameter>  per-entry precision (inverse variance) of N(mean, diag(precision)^-1)
  gaussian-full       precision_matrix       (P, P) precision over the parameters flattened in that order
  particles           particles/<parameter>  (N, *shape): particle i is every tensor's entry i
  point               nothing more: the global model is all the strategy holds
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from fedbayes.tasks.storage import checksum, safetensors_header_problem, write_atomically

if TYPE_CHECKING:  # cryptography is imported when a file is signed or verified, not by every command's parser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

FORMAT = "fedbayes-posterior"
FORMAT_VERSION = 1
KINDS = ("point", "gaussian-diagonal", "gaussian-full", "particles")
MEAN, BUFFER, PRECISION, PARTICLES = "mean/", "buffer/", "precision/", "particles/"
PRECISION_MATRIX = "precision_matrix"
SIGNATURE_KEY = "signature"
SIGNED_PREFIX = b"fedbayes-posterior signature 1\n"  # what a signature covers: this, then the checksum in hex
MAX_INPUT_RANK = 8  # dimensions of one example: a bound on what even a meta-device dry run makes of them
LIMIT_HINT = (
    ": if you trust the file, raise it (fedbayes predict --max-header-mb, "
    "load(..., limits=PosteriorLimits(header_bytes=...)))"
)
MAX_KEY_FILE_BYTES = 64 * 2**10  # an Ed25519 key file, PEM or OpenSSH, is well under 1 KiB
Layout = dict[str, tuple[int, ...]]  # tensor name -> shape, in the model's order


@dataclass(frozen=True)
class PosteriorLimits:
    """How large a posterior file may claim to be before it is believed: each bounds memory the reader would spend on
    the header's word alone. Raise one to read a file you trust that is over it (`load(FILE,
    limits=PosteriorLimits(classes=...))`, `fedbayes predict --max-classes ...`)."""

    header_bytes: int = 2**20  # the safetensors header (the tensors' index and the metadata), read before it is parsed
    input_values: int = 2**24  # values in one example: a model is built, and run, for that input shape
    classes: int = 100_000  # a user model is built for that many
    ensemble_samples: int = 1024  # the draws a prediction makes by default, each as large as the model


DEFAULT_LIMITS = PosteriorLimits()


class PosteriorFileError(ValueError):
    """An exported posterior cannot be read or used; the message names the file and the problem."""


@dataclass(frozen=True)
class ModelSpec:
    """What tasks/models.py build_model needs besides the data's shape and classes."""

    model: str
    hidden: tuple[int, ...]
    activation: str
    pool: int


@dataclass(frozen=True)
class Header:
    strategy: str
    kind: str  # one of KINDS
    note: str  # what the strategy's posterior is, in one line (strategies/base.py GlobalPosterior)
    model: ModelSpec
    input_shape: tuple[int, ...]  # of one example
    num_classes: int
    # The model's inputs are x * pixel_scale * input_scale, pixel_scale following x's dtype (uint8: 1/255, float: 1);
    # `pixel_scale` here is that of the data the run evaluated on.
    input_scale: float
    pixel_scale: float
    dataset: str
    round: int
    federation: str
    seed: int
    # How the server evaluated this round: ensemble of `ensemble_samples` draws seeded with round_seed(seed, round),
    # batches of `eval_batch_size` (the batch size changes float rounding, not the model).
    ensemble_samples: int
    eval_batch_size: int
    parameters: Layout
    buffers: Layout
    particles: int  # N for the particles kind, else 0
    fedbayes_version: str

    def to_json(self) -> str:
        """The header as the JSON the file's "header" metadata holds.

        Returns:
            A JSON object of every field; the layouts as lists of [name, shape] pairs, so that their order is kept.
        """
        fields = asdict(self)
        fields["parameters"] = [[name, list(shape)] for name, shape in self.parameters.items()]
        fields["buffers"] = [[name, list(shape)] for name, shape in self.buffers.items()]
        return json.dumps(fields)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a file with this header holds, and its shape.

        Returns:
            Tensor name ("mean/...", "buffer/...", "precision/...", "particles/..." or "precision_matrix") -> shape, as
            the header's kind and layouts imply them.
        """
        shapes = {f"{MEAN}{name}": shape for name, shape in self.parameters.items()}
        shapes |= {f"{BUFFER}{name}": shape for name, shape in self.buffers.items()}
        if self.kind == "gaussian-diagonal":
            shapes |= {f"{PRECISION}{name}": shape for name, shape in self.parameters.items()}
        elif self.kind == "gaussian-full":
            size = sum(math.prod(shape) for shape in self.parameters.values())
            shapes[PRECISION_MATRIX] = (size, size)
        elif self.kind == "particles":
            shapes |= {f"{PARTICLES}{name}": (self.particles, *shape) for name, shape in self.parameters.items()}
        return shapes


def write_posterior_file(
    path: Path, header: Header, tensors: dict[str, np.ndarray], signing_key: Ed25519PrivateKey | None = None
) -> None:
    """Write a posterior file atomically (a crash leaves no torn file) after checking `tensors` against `header`.

    Args:
        path: the .safetensors file to write; replaced if it exists.
        header: what the posterior is; its kind and layouts say which tensors the file holds (Header.tensor_shapes).
        tensors: tensor name -> array, exactly those of `header.tensor_shapes()`, in those shapes, finite, floating
            point (buffers may be integers); precisions > 0.
        signing_key: an Ed25519 private key (read_signing_key) to sign the checksum with; None: unsigned.

    Raises:
        ValueError: a tensor is missing, extra, of another shape or dtype, non-finite, or a precision is not > 0 (or
            the precision matrix not symmetric positive definite); the message names it.
    """
    _check_tensors(tensors, header, lambda field, problem: ValueError(f"not writing {path}: '{field}' {problem}"))
    tensors = {name: np.require(value, requirements="C") for name, value in tensors.items()}
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "header": header.to_json()}
    metadata["checksum"] = checksum(tensors, metadata)
    if signing_key is not None:
        signature = signing_key.sign(SIGNED_PREFIX + metadata["checksum"].encode())
        metadata[SIGNATURE_KEY] = base64.b64encode(signature).decode()
    write_atomically(path, save(tensors, metadata=metadata))


def read_posterior_file(
    path: Path, limits: PosteriorLimits = DEFAULT_LIMITS, verify: Path | None = None
) -> tuple[Header, dict[str, np.ndarray]]:
    """The header and tensors of an exported posterior, checked in full.

    Args:
        path: the posterior file `fedbayes export` wrote.
        limits: the largest sizes the header may claim (safetensors header bytes, input values, classes, ensemble
            samples) before it is believed.
        verify: a public key file (read_verify_key) the file's signature must verify with; None: the signature, if
            any, is not checked.

    Returns:
        The parsed header and tensor name -> array, the tensors exactly those the header implies.

    Raises:
        PosteriorFileError: the file is unreadable, of another format or a newer version, claims sizes over `limits`,
            changed since it was written (checksum), is unsigned or not signed by `verify`'s key, or is inconsistent
            with its header (tensors, shapes, finiteness, precisions not positive or not positive definite).
        ValueError: `verify` is not an Ed25519 public key file; checked before the file is read.
    """

    def damaged(field: str, problem: str) -> PosteriorFileError:
        return PosteriorFileError(f"exported posterior {path} is damaged: '{field}' {problem}")

    public_key = read_verify_key(verify) if verify is not None else None  # a bad key file before the file is read
    _check_header_length(path, limits.header_bytes)
    try:
        with safe_open(path, framework="np") as posterior_file:
            tensors = {name: posterior_file.get_tensor(name) for name in posterior_file.keys()}
            metadata = posterior_file.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise PosteriorFileError(
            f"exported posterior {path} is unreadable (truncated, or not a safetensors file): {error}"
        ) from None
    if metadata.get("format") != FORMAT:
        raise PosteriorFileError(
            f"{path} is not a fedbayes posterior export (its metadata 'format' is "
            f"{metadata.get('format')!r}, not {FORMAT!r}); `fedbayes export` writes them"
        )
    _check_version(path, metadata.get("format_version", ""), damaged)
    if "checksum" not in metadata:
        raise damaged("checksum", "is missing")
    digest = checksum(tensors, {key: value for key, value in metadata.items() if key != SIGNATURE_KEY})
    if metadata["checksum"] != digest:
        raise damaged("checksum", "does not match the file's contents (changed or corrupted after it was written)")
    if verify is not None and public_key is not None:
        _check_signature(path, metadata.get(SIGNATURE_KEY), digest, public_key, verify)
    header = _parse_header(metadata.get("header", ""), damaged, _over_limit(path, limits))
    _check_tensors(tensors, header, damaged)
    return header, tensors


def _check_header_length(path: Path, limit: int) -> None:
    """A file whose safetensors header length (its first 8 bytes) is over the rest of the file or over `limit` is
    refused before safetensors reads and parses the header."""
    try:
        problem = safetensors_header_problem(path, limit, raise_hint=LIMIT_HINT)
    except OSError as error:
        raise PosteriorFileError(f"exported posterior {path} is unreadable: {error.strerror or error}") from None
    if problem:
        raise PosteriorFileError(f"exported posterior {path} is unreadable: its safetensors header length {problem}")


def _over_limit(path: Path, limits: PosteriorLimits) -> Callable[[str, int, str], None]:
    """The check of one of the header's sizes against `limits`, refusing with how to raise the limit."""
    options = {
        "input_values": "--max-input-values",
        "classes": "--max-classes",
        "ensemble_samples": "--max-ensemble-samples",
    }

    def check(field: str, value: int, limit_name: str) -> None:
        limit = getattr(limits, limit_name)
        if value > limit:
            raise PosteriorFileError(
                f"exported posterior {path}: header.{field} claims {value:,}, over the limit of {limit:,} "
                f"{limit_name.replace('_', ' ')}: if you trust the file, raise it (fedbayes predict "
                f"{options[limit_name]}, load(..., limits=PosteriorLimits({limit_name}=...)))"
            )

    return check


def read_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in `path`.

    Args:
        path: a key file, unencrypted: PEM (PKCS #8, as `openssl genpkey -algorithm ed25519` writes it) or OpenSSH (as
            `ssh-keygen -t ed25519` does); at most 64 KiB.

    Returns:
        The private key, to sign posterior files with (write_posterior_file).

    Raises:
        ValueError: the file is unreadable, over 64 KiB, not an unencrypted PEM or OpenSSH private key, or holds a key
            of another algorithm; the message names the file.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _key_bytes(path)
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
            key: Any = serialization.load_ssh_private_key(data, password=None)
        else:
            key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:  # not a key, an encrypted one, an unsupported format
        raise ValueError(f"signing key {path}: not an unencrypted PEM or OpenSSH private key ({error})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"signing key {path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def read_verify_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in `path`.

    Args:
        path: a key file: PEM (as `openssl pkey -pubout` writes it) or OpenSSH's one line (as in `ssh-keygen`'s .pub);
            at most 64 KiB.

    Returns:
        The public key, to verify posterior files' signatures with (read_posterior_file).

    Raises:
        ValueError: the file is unreadable, over 64 KiB, holds a private key, is not a PEM or OpenSSH public key, or
            holds a key of another algorithm; the message names the file.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = _key_bytes(path)
    if b"PRIVATE KEY" in data:
        raise ValueError(f"verification key {path} holds a private key: verify with the public key that goes with it")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key: Any = serialization.load_pem_public_key(data)
        else:
            key = serialization.load_ssh_public_key(data)
    except (ValueError, TypeError) as error:
        raise ValueError(f"verification key {path}: not a PEM or OpenSSH public key ({error})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"verification key {path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def _key_bytes(path: Path) -> bytes:
    try:
        with open(path, "rb") as key_file:
            data = key_file.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as error:
        raise ValueError(f"key file {path}: {error.strerror or error}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ValueError(f"key file {path} is over {MAX_KEY_FILE_BYTES // 2**10} KiB: not a key")
    return data


def _check_signature(path: Path, signature: str | None, digest: str, key: Ed25519PublicKey, key_path: Path) -> None:
    """The file's signature is `key`'s over SIGNED_PREFIX + `digest`, the checksum recomputed from its contents."""
    from cryptography.exceptions import InvalidSignature

    if signature is None:
        raise PosteriorFileError(f"exported posterior {path} is not signed, and {key_path} was to verify it")
    try:
        key.verify(base64.b64decode(signature, validate=True), SIGNED_PREFIX + digest.encode())
    except (InvalidSignature, ValueError):  # ValueError: not base64 (binascii.Error)
        raise PosteriorFileError(
            f"exported posterior {path}: its signature does not verify with {key_path} (signed with another "
            "key, or changed after it was signed)"
        ) from None


def _check_version(path: Path, text: str, damaged) -> None:
    if not text.isdigit() or int(text) < 1:
        raise damaged("format_version", f"is {text!r}, not a version number")
    if int(text) > FORMAT_VERSION:
        raise PosteriorFileError(
            f"{path} has posterior format version {text}, written by a newer fedbayes; this one "
            f"reads version {FORMAT_VERSION} and older: upgrade fedbayes to read it"
        )


def _parse_header(text: str, damaged, over_limit) -> Header:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise damaged("header", f"is not valid JSON ({error})") from None
    if not isinstance(fields, dict):
        raise damaged("header", "is not a JSON object")

    def take(name: str, kind: type, container: dict[str, Any] = fields, prefix: str = "") -> Any:
        value = container.get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise damaged(f"header.{prefix}{name}", f"is {value!r}, not a {kind.__name__}")
        return value

    model = take("model", dict)
    spec = ModelSpec(
        take("model", str, model, "model."),
        _shape(take("hidden", list, model, "model."), "model.hidden", damaged),
        take("activation", str, model, "model."),
        take("pool", int, model, "model."),
    )
    header = Header(
        strategy=take("strategy", str),
        kind=take("kind", str),
        note=take("note", str),
        model=spec,
        input_shape=_shape(take("input_shape", list), "input_shape", damaged),
        num_classes=take("num_classes", int),
        input_scale=take("input_scale", float),
        pixel_scale=take("pixel_scale", float),
        dataset=take("dataset", str),
        round=take("round", int),
        federation=take("federation", str),
        seed=take("seed", int),
        ensemble_samples=take("ensemble_samples", int),
        eval_batch_size=take("eval_batch_size", int),
        parameters=_layout(take("parameters", list), "parameters", damaged),
        buffers=_layout(take("buffers", list), "buffers", damaged),
        particles=take("particles", int),
        fedbayes_version=take("fedbayes_version", str),
    )
    if header.kind not in KINDS:
        raise damaged("header.kind", f"is {header.kind!r}, not one of {', '.join(KINDS)}")
    if (header.kind == "particles") != (header.particles > 0):
        raise damaged("header.particles", f"is {header.particles} for a posterior of kind {header.kind!r}")
    if header.eval_batch_size < 1 or header.ensemble_samples < 0 or header.num_classes < 2:
        raise damaged(
            "header", "has an evaluation batch size below 1, negative ensemble samples or fewer than 2 classes"
        )
    if not 1 <= len(header.input_shape) <= MAX_INPUT_RANK or 0 in header.input_shape:
        raise damaged("header.input_shape", f"is {list(header.input_shape)[:16]}: 1 to {MAX_INPUT_RANK} sizes >= 1")
    over_limit("input_shape", math.prod(header.input_shape), "input_values")
    over_limit("num_classes", header.num_classes, "classes")
    over_limit("ensemble_samples", header.ensemble_samples, "ensemble_samples")
    return header


def _shape(value: list, field: str, damaged) -> tuple[int, ...]:
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in value):
        raise damaged(f"header.{field}", f"is {value!r}, not a list of sizes")
    return tuple(value)


def _layout(entries: list, field: str, damaged) -> Layout:
    if not all(isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) for entry in entries):
        raise damaged(f"header.{field}", "is not a list of [name, shape] pairs")
    layout = {name: _shape(shape, f"{field}.{name}", damaged) for name, shape in entries}
    if len(layout) != len(entries):
        raise damaged(f"header.{field}", "names a tensor twice")
    return layout


def _check_tensors(tensors: dict[str, np.ndarray], header: Header, damaged) -> None:
    """The tensors are exactly those the header implies, in its shapes, finite, and floating point (buffers may be
    integers: BatchNorm counts its batches)."""
    expected = header.tensor_shapes()
    for name in sorted(expected.keys() | tensors.keys()):
        if name not in tensors:
            raise damaged(name, f"is missing (a {header.kind} posterior holds it)")
        if name not in expected:
            raise damaged(name, f"is not a tensor of a {header.kind} posterior of this model")
        value = tensors[name]
        if value.shape != expected[name]:
            raise damaged(name, f"has shape {value.shape}, the header says {expected[name]}")
        if not (np.issubdtype(value.dtype, np.floating) or name.startswith(BUFFER)):
            raise damaged(name, f"has dtype {value.dtype}, not floating point")
        if np.issubdtype(value.dtype, np.inexact) and not np.isfinite(value).all():
            raise damaged(name, "holds NaN or Inf")
        if name.startswith(PRECISION) and not (value > 0).all():
            raise damaged(
                name, f"holds {np.count_nonzero(value <= 0):,} precisions that are not > 0 (inverse variances)"
            )
    if header.kind == "gaussian-full":
        _check_positive_definite(tensors[PRECISION_MATRIX], damaged)


def _check_positive_definite(matrix: np.ndarray, damaged) -> None:
    """A precision matrix is symmetric, and positive definite: its Cholesky factor exists (the sampler needs it)."""
    if not np.array_equal(matrix, matrix.T):
        raise damaged(PRECISION_MATRIX, "is not symmetric")
    try:
        np.linalg.cholesky(matrix.astype(np.float64))
    except np.linalg.LinAlgError:
        raise damaged(PRECISION_MATRIX, "is not positive definite (its Cholesky factorisation fails)") from None
