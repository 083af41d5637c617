"""Crash-safe file writes and links, shared by the client state store and the server checkpoints; the checks every
command makes before it writes an output (nothing it did not write in this call is overwritten unless --force); the
checksum of a safetensors file's tensors and metadata (server checkpoints, exported posteriors); and bounded reads:
a file that may come from someone else is read only as far as its bound, which is checked before anything is
allocated (`read_bounded`, `complete_lines`, `safetensors_header_problem`)."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHECKSUM_KEY = "checksum"  # the metadata entry that holds the file's `checksum`
MAX_CLIENT_ID_LENGTH = 128  # the server refuses every reply from a longer client id
OUTPUT_MODE = 0o644  # a command's output (a report, predictions, a certificate): what the usual umask gives a new file
LISTED = 4  # names a refusal lists before it counts the rest
MAX_RECORD_BYTES = 64 * 2**10  # a one-object JSON file of ours (a forget request, a start record): ids, a path, times
# The longest line read back from a JSON-lines file (results rows, the forget audit log): a results row holds one
# reason (at most 400 characters) per refused client, so this is over 25,000 of them, beyond max-clients' default.
MAX_LINE_BYTES = 16 * 2**20
# The longest header the safetensors library parses (its MAX_HEADER_SIZE): the format's own bound, which no reader
# of the format may raise. The tensors after it are bounded by the file itself: the library refuses a header whose
# tensors do not exactly fill the rest of the file.
SAFETENSORS_MAX_HEADER = 100_000_000
_CHUNK_BYTES = 2**20  # what a file is read by, a line longer than its bound skipped by (not 8 KiB a call)


class FileTooLarge(ValueError):
    """A file holds more than it may; the message names the file, its size and the bound (and why that bound)."""


def write_atomically(path: Path, payload: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `payload` so that a crash at any moment leaves either the old or the new file, never a torn
    one: write a temp file in the same directory (created 0600, so never readable by others, not even briefly; then
    set to `mode`), fsync it, rename it over `path`, fsync the directory.

    Args:
        path: the file to write; its parent folders are created.
        payload: the file's whole contents.
        mode: the file's permission bits once written (OUTPUT_MODE for a command's output).

    Raises:
        OSError: the folder or file cannot be written; the temp file is removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
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


def _temp_prefix(path: Path) -> str:
    return f".{path.name}-"


def remove_torn_writes(path: Path) -> list[Path]:
    """Delete the temp files that `write_atomically(path, ...)` calls killed before their rename left beside `path`.
    Call it only where no other process is writing `path` at the same time.

    Args:
        path: the file whose torn writes are removed; `path` itself is left alone.

    Returns:
        The temp files removed.
    """
    torn = sorted(path.parent.glob(f"{glob.escape(_temp_prefix(path))}*.tmp"))
    for temp in torn:
        temp.unlink(missing_ok=True)
    return torn


class OutputExists(ValueError):
    """A command would write over something it did not write in this call: the message names it and says what
    --force would do."""


def check_new_files(paths: Iterable[Path], force: bool) -> None:
    """Refuse a command that is about to write the files `paths` where something is already, unless `force`, with which
    they are replaced (by `write_atomically`). Even with `force` a folder is not replaced by a file (that would delete
    what it holds), and a path under a file cannot be written at all. Called before the command does any work, so that
    a refusal costs nothing and leaves nothing half-written.

    Args:
        paths: the files the command will write.
        force: replace what is at `paths` (files and links; never folders).

    Raises:
        OutputExists: a path is under a file or is a folder, or, without `force`, something is at a path; the message
            names them and says what --force would do.
    """
    paths = list(paths)
    for path in paths:
        blocking = next((parent for parent in path.parents if os.path.lexists(parent)), None)
        if blocking is not None and not blocking.is_dir():
            raise OutputExists(f"{path} cannot be written: {blocking} is a file, not a folder")
        if path.is_dir() and not path.is_symlink():
            raise OutputExists(f"{path} is a folder: this command writes a file there, and never replaces a folder")
    taken = [path for path in paths if os.path.lexists(path)]
    if taken and not force:
        exist = "exists" if len(taken) == 1 else "exist"
        raise OutputExists(
            f"{listed([str(path) for path in taken])} {exist} already: not overwritten (fedbayes never overwrites "
            f"what it did not write in this call); --force replaces {'it' if len(taken) == 1 else 'them'}"
        )


def check_output_folder(folder: Path, names: Sequence[str], force: bool) -> None:
    """Refuse a command that is about to write the files `names` into `folder`, unless the folder is new or empty, or
    `force`. With `force` only `names` are replaced: whatever else the folder holds (the user's files, another
    command's) stays. Called before the command does any work, as `check_new_files`.

    Args:
        folder: the output folder, which need not exist.
        names: the file names the command writes into it.
        force: write into a folder that holds something, replacing the files of those names.

    Raises:
        OutputExists: `folder` is a file, holds something (without `force`), or a name is a folder there.
    """
    if os.path.lexists(folder) and not folder.is_dir():
        raise OutputExists(f"{folder} is a file, not a folder: this command writes {listed(names)} into a folder")
    held = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
    if held and not force:
        raise OutputExists(
            f"{folder} is not empty (it holds {listed(held)}): fedbayes writes only into a new or empty folder; "
            f"--force writes {listed(names)} there, replacing those of the same names and keeping everything else"
        )
    check_new_files([folder / name for name in names], force=True)


def listed(names: Sequence[str]) -> str:
    """`names` joined with commas, the first LISTED of them and how many more.

    Args:
        names: what a message lists, in the order shown.

    Returns:
        "a, b, c, d and 3 more", or all of them when there are at most LISTED.
    """
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def link_atomically(link: Path, target_name: str) -> None:
    """Make `link` a symbolic link to `target_name` (a file next to it) so that a crash at any moment leaves either the
    old or the new link: create it under a temp name, rename it over `link`, fsync the directory.

    Args:
        link: the link to create or replace.
        target_name: what it points to, relative to the link's folder.

    Raises:
        OSError: the link cannot be made; its temp link is removed.
    """
    temp_link = link.with_name(f".{link.name}-{os.getpid()}-{os.urandom(4).hex()}.tmp")
    os.symlink(target_name, temp_link)
    try:
        os.replace(temp_link, link)
    except BaseException:
        temp_link.unlink(missing_ok=True)
        raise
    fsync_directory(link.parent)


def fsync_directory(directory: Path) -> None:
    """Make the renames and deletions in `directory` durable.

    Args:
        directory: an existing folder.

    Raises:
        OSError: it cannot be opened or synced.
    """
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def is_safe_name(name: str) -> bool:
    """Whether `name` may name a directory or file of ours (a federation, a client id), so that it can neither climb
    out of the folder it is put in nor hide in it.

    Args:
        name: the name to check.

    Returns:
        True for a non-empty ASCII [A-Za-z0-9._-]+ that is not "." or "..".
    """
    return bool(name) and name.isascii() and all(c.isalnum() or c in "._-" for c in name) and name not in (".", "..")


def checksum(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and values and every metadata entry but the checksum.

    Args:
        tensors: tensor name -> array, as the file holds them; the values are hashed little-endian, C order.
        metadata: the file's metadata; its CHECKSUM_KEY entry, if any, is left out.

    Returns:
        The digest in hex; the same for the same contents whatever the order of the mappings.
    """
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


def read_bounded(path: Path, limit: int, bound: str) -> bytes:
    """The bytes of `path`, refused before they are read when there are more than `limit`: a file's size decides what
    reading it costs. Something that is no regular file (a device, a pipe) is read no further than `limit` + 1 bytes.

    Args:
        path: the file.
        limit: the most bytes it may hold.
        bound: what the limit is, for the message ("a forget request").

    Returns:
        The file's contents, at most `limit` bytes.

    Raises:
        FileTooLarge: naming the file, its size and `limit`.
        OSError: it cannot be read.
    """
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        data = b"" if size > limit else file.read(limit + 1)
    if size > limit or len(data) > limit:
        held = f"is {size} bytes, over" if size > limit else "holds more than"
        raise FileTooLarge(f"{path} {held} the {limit} bytes {bound} may take")
    return data


@dataclass(frozen=True)
class Line:
    """One complete line of a file: its number (from 1), the offset just after its newline, and its bytes without
    the newline; None for a line longer than the bound it was read with (never read into memory)."""

    number: int
    end: int
    text: bytes | None


def complete_lines(path: Path, max_line_bytes: int = MAX_LINE_BYTES, start: int = 0) -> Iterator[Line]:
    """Every line of `path` that ends in a newline, in order, none read past `max_line_bytes`: whatever the file
    holds, memory stays bounded by the longest line allowed. The piece after the last newline (a line still being
    written, or cut short by a crash) is no line.

    Args:
        path: the file.
        max_line_bytes: the longest line read into memory; a longer one is a Line without text.
        start: the byte to begin at, 0 or a line's start (an earlier Line's `end`, for a file that grows); lines are
            numbered from there.

    Yields:
        Each complete line's number (from 1 at `start`), the offset just after its newline, and its bytes without the
        newline (None for a line over `max_line_bytes`).

    Raises:
        OSError: the file cannot be read.
    """
    with path.open("rb", buffering=_CHUNK_BYTES) as file:
        file.seek(start)
        number, end = 0, start
        while piece := file.readline(max_line_bytes + 1):
            length, ended = len(piece), piece.endswith(b"\n")
            text = piece[:-1] if ended else None
            if not ended and length <= max_line_bytes:  # the end of the file, not of a line
                return
            while not ended and (rest := file.readline(_CHUNK_BYTES)):  # too long: the rest is skipped, unread
                length, ended = length + len(rest), rest.endswith(b"\n")
            if not ended:
                return
            number, end = number + 1, end + length
            yield Line(number, end, text)


def safetensors_header_problem(path: Path, limit: int = SAFETENSORS_MAX_HEADER, raise_hint: str = "") -> str | None:
    """What is wrong with the header length of the safetensors file `path` (its first 8 bytes, little-endian). Checked
    before the library reads the header, which it parses in full, into memory.

    Args:
        path: the safetensors file.
        limit: the longest header to accept, in bytes.
        raise_hint: how a reader's user raises `limit`, appended to the problem of a header over it.

    Returns:
        None when the length is fine, else the problem in words: the 8 bytes are missing, or the length is over the
        rest of the file or over `limit`.

    Raises:
        OSError: the file cannot be read.
    """
    with path.open("rb") as file:
        prefix = file.read(8)
        size = os.fstat(file.fileno()).st_size
    if len(prefix) < 8:
        return f"is missing: the file is {len(prefix)} bytes, a safetensors file begins with 8"
    (declared,) = struct.unpack("<Q", prefix)
    if declared > size - 8:
        return f"declares {declared} bytes, more than the {size - 8} bytes after it"
    if declared > limit:
        return f"declares {declared} bytes, over the limit of {limit}{raise_hint}"
    return None
