"""Crash-safe file writes and links, shared by the client state store and the server checkpoints, and the checksum
of a safetensors file's tensors and metadata (server checkpoints, exported posteriors)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

CHECKSUM_KEY = "checksum"  # the metadata entry that holds the file's `checksum`
MAX_CLIENT_ID_LENGTH = 128  # the server refuses every reply from a longer client id


def write_atomically(path: Path, payload: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `payload` so that a crash at any moment leaves either the old or the new
    file, never a torn one: write a temp file in the same directory (created 0600, so never readable by others,
    not even briefly; then set to `mode`), fsync it, rename it over `path`, fsync the directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as temp_file:
            temp_file.write(payload)
            os.fchmod(temp_file.fileno(), mode)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def link_atomically(link: Path, target_name: str) -> None:
    """Make `link` a symbolic link to `target_name` (a file next to it) so that a crash at any moment leaves
    either the old or the new link: create it under a temp name, rename it over `link`, fsync the directory."""
    temp_link = link.with_name(f".{link.name}-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    os.symlink(target_name, temp_link)
    try:
        os.replace(temp_link, link)
    except BaseException:
        temp_link.unlink(missing_ok=True)
        raise
    fsync_directory(link.parent)


def fsync_directory(directory: Path) -> None:
    """Make the renames and deletions in `directory` durable."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def is_safe_name(name: str) -> bool:
    """Whether `name` may name a directory or file of ours (a federation, a client id): [A-Za-z0-9._-]+, not "." or
    "..", so it can neither climb out of the folder it is put in nor hide in it."""
    return bool(name) and name.isascii() and all(c.isalnum() or c in "._-" for c in name) and name not in (".", "..")


def checksum(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and values and every metadata entry but the checksum."""
    description = json.dumps(
        {
            "tensors": [[name, tensors[name].dtype.name, list(tensors[name].shape)] for name in sorted(tensors)],
            "metadata": {key: value for key, value in metadata.items() if key != CHECKSUM_KEY},
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(description.encode())
    for name in sorted(tensors):
        value = tensors[name]
        # the bytes as the file holds them: safetensors stores little-endian
        # numpy's stubs give ndarray its buffer protocol (__buffer__) only from Python 3.12 on; it has one here too
        digest.update(np.require(value, value.dtype.newbyteorder("<"), requirements="C"))  # type: ignore[arg-type]
    return digest.hexdigest()
