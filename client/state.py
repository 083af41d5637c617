"""Durable per-client state (duals, local particles, optimizer state) that survives restarts.

Flower's Context.state lives in the SuperNode's memory and is lost when it restarts, so each client
keeps what its algorithm needs across rounds in <state-dir>/<federation>/<client-id>/state.safetensors.
Writes are atomic (temp file + fsync + rename): a crash mid-write leaves the previous state intact.
safetensors holds tensors and string metadata only, so loading never unpickles anything.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_safetensors

STATE_FILE = "state.safetensors"


class StateCorruptError(RuntimeError):
    """The state file exists but cannot be read; never silently replaced by a fresh state."""


@dataclass
class ClientState:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)


class ClientStateStore:
    def __init__(self, root: str | Path, federation: str, client_id: str) -> None:
        for what, name in (("federation", federation), ("client id", client_id)):
            if not name or name in (".", "..") or not all(c.isalnum() or c in "._-" for c in name):
                raise ValueError(f"{what} {name!r} is not a safe directory name ([A-Za-z0-9._-]+)")
        self.directory = Path(root) / federation / client_id
        self.path = self.directory / STATE_FILE

    def load(self) -> ClientState | None:
        """The last saved state, or None if this client never saved one."""
        if not self.path.exists():
            return None
        try:
            with safe_open(self.path, framework="pt") as state_file:
                tensors = {name: state_file.get_tensor(name) for name in state_file.keys()}
                metadata = dict(state_file.metadata() or {})
        except (SafetensorError, OSError, ValueError) as error:
            raise StateCorruptError(f"client state {self.path} is unreadable: {error}") from None
        return ClientState(tensors, metadata)

    def save(self, state: ClientState) -> None:
        payload = save_safetensors(
            {name: tensor.detach().cpu().contiguous() for name, tensor in state.tensors.items()},
            metadata=state.metadata,
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, temp_name = tempfile.mkstemp(dir=self.directory, prefix=".state-", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as temp_file:
                temp_file.write(payload)
                temp_file.flush()
                os.fsync(temp_file.fileno())
            os.replace(temp_name, self.path)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        _fsync_directory(self.directory)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
