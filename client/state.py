"""Durable per-client state (duals, local particles, optimizer state) that survives restarts.

Flower's Context.state lives in the SuperNode's memory and is lost when it restarts, so each client
keeps what its algorithm needs across rounds under <state-dir>/<federation>/<client-id>/, one file per
round it took part in: round-<r>.safetensors is the state *after* round r. The two newest are kept,
because a server that restarts from its checkpoint may run a round again: a re-run of round r must
start from the state before r (`load(before_round=r)`), not from the one that round already wrote.

Writes are atomic (temp file + fsync + rename): a crash mid-write leaves the previous state intact.
safetensors holds tensors and string metadata only, so loading never unpickles anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_safetensors

from tasks.storage import write_atomically

KEEP_ROUNDS = 2
_STATE_FILE = re.compile(r"round-(\d+)\.safetensors")


class StateCorruptError(RuntimeError):
    """The state file exists but cannot be read; never silently replaced by a fresh state."""


class StaleStateError(RuntimeError):
    """The stored state is from a later round than the server's: another run of the same federation."""


@dataclass
class ClientState:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    round: int = 0  # the round after which this state was saved (set by the store)


class ClientStateStore:
    def __init__(self, root: str | Path, federation: str, client_id: str) -> None:
        for what, name in (("federation", federation), ("client id", client_id)):
            if not name or name in (".", "..") or not all(c.isalnum() or c in "._-" for c in name):
                raise ValueError(f"{what} {name!r} is not a safe directory name ([A-Za-z0-9._-]+)")
        self.federation = federation
        self.directory = Path(root) / federation / client_id

    def path(self, server_round: int) -> Path:
        return self.directory / f"round-{server_round}.safetensors"

    def saved_rounds(self) -> list[int]:
        """Rounds with a saved state, oldest first."""
        if not self.directory.is_dir():
            return []
        matches = (_STATE_FILE.fullmatch(entry.name) for entry in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in matches if match)

    def load(self, before_round: int | None = None) -> ClientState | None:
        """The newest saved state (from a round before `before_round`), or None if this client never
        saved one. States only from round `before_round` on mean another run used this federation name."""
        rounds = self.saved_rounds()
        if not rounds:
            return None
        usable = [r for r in rounds if before_round is None or r < before_round]
        if not usable:
            raise StaleStateError(
                f"client state in {self.directory} is from round {rounds[-1]}, but the server is at round "
                f"{before_round}: it belongs to an earlier run of federation {self.federation!r}; give this run "
                "a new `federation` name or remove that state"
            )
        return self._read(usable[-1])

    def _read(self, server_round: int) -> ClientState:
        path = self.path(server_round)
        try:
            with safe_open(path, framework="pt") as state_file:
                tensors = {name: state_file.get_tensor(name) for name in state_file.keys()}
                metadata = dict(state_file.metadata() or {})
        except (SafetensorError, OSError, ValueError) as error:
            raise StateCorruptError(f"client state {path} is unreadable: {error}") from None
        return ClientState(tensors, metadata, server_round)

    def save(self, state: ClientState, server_round: int) -> None:
        """Store the state after `server_round`; drop states older than the last KEEP_ROUNDS and any
        from later rounds (a future the restarted server has abandoned)."""
        payload = save_safetensors(
            {name: tensor.detach().cpu().contiguous() for name, tensor in state.tensors.items()},
            metadata=state.metadata,
        )
        write_atomically(self.path(server_round), payload)
        state.round = server_round
        rounds = self.saved_rounds()
        kept = [r for r in rounds if r <= server_round][-KEEP_ROUNDS:]
        for old in set(rounds) - set(kept):
            self.path(old).unlink(missing_ok=True)
