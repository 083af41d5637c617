"""Durable per-client state (duals, local particles, optimizer state) that survives restarts.

Flower's Context.state lives in the SuperNode's memory and is lost when it restarts, so each client
keeps what its algorithm needs across rounds under <state-dir>/<federation>/<client-id>/, one file per
round it took part in: round-<r>.safetensors is the state *after* round r.

Which state a round starts from is the server's call, not the client's: every instruction carries the last
round whose reply the server accepted from this client (Header.accepted_rounds), and the client continues
from its state after that round. A reply that was lost, late or rejected thus leaves no trace: the server
never used it, and the client rolls back past it. The same covers a server resumed from an older
checkpoint, which runs rounds again. So the store keeps the accepted round's state and every later one
(at most MAX_UNCONFIRMED of them) until the server accepts a newer round, and also the state of the round
the server's newest checkpoint on disk records as accepted (Header.checkpointed_rounds): the server writes
checkpoint t while round t+1 trains, and one killed then resumes from t-1 and names that round again.

Writes are atomic (temp file + fsync + rename): a crash mid-write leaves the previous state intact.
safetensors holds tensors and string metadata only, so loading never unpickles anything.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as save_safetensors

from fedbayes.tasks.storage import is_safe_name, safetensors_header_problem, write_atomically

MAX_UNCONFIRMED = 4  # states after the accepted round kept for the server to accept (or roll back past)
_STATE_FILE = re.compile(r"round-(\d+)\.safetensors")


def left_marker(root: str | Path, client_id: str) -> Path:
    """<state-dir>/left-<client-id>.json: written once the server has forgotten this client at its request and its
    state is deleted (client/app.py); `fedbayes client --leave --forget` stops when it appears.

    Args:
        root: the client's state directory (node config `state-dir`).
        client_id: the client's stable id.

    Returns:
        The marker's path; it need not exist.
    """
    return Path(root) / f"left-{client_id}.json"


def leave_request_note(root: str | Path, client_id: str) -> Path:
    """<state-dir>/leaving-<client-id>.json: the federation and round in which this client last asked the server to
    forget it (client/app.py); `fedbayes client --leave --forget` says so, and names it when it gives up.

    Args:
        root: the client's state directory (node config `state-dir`).
        client_id: the client's stable id.

    Returns:
        The note's path; it need not exist.
    """
    return Path(root) / f"leaving-{client_id}.json"


class StateCorruptError(RuntimeError):
    """The state file exists but cannot be read; never silently replaced by a fresh state."""


class StateLostError(RuntimeError):
    """The server accepted a round from this client whose state the client no longer has."""


@dataclass
class ClientState:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    round: int = 0  # the round after which this state was saved (set by the store)


class ClientStateStore:
    def __init__(self, root: str | Path, federation: str, client_id: str) -> None:
        for what, name in (("federation", federation), ("client id", client_id)):
            if not is_safe_name(name):
                raise ValueError(f"{what} {name!r} is not a safe directory name ([A-Za-z0-9._-]+)")
        self.federation = federation
        self.directory = Path(root) / federation / client_id

    def path(self, server_round: int) -> Path:
        """The file holding this client's state after round `server_round`.

        Args:
            server_round: the round, from 1.

        Returns:
            <directory>/round-<server_round>.safetensors; it need not exist.
        """
        return self.directory / f"round-{server_round}.safetensors"

    def delete_for_leaving(self, server_round: int) -> Path:
        """Delete every state of this client in this federation (the server has forgotten it), then write the leave
        marker saying so. A crash in between leaves the marker unwritten, and the next confirmation deletes the
        rest.

        Args:
            server_round: the round in which the server confirmed it forgot this client; recorded in the marker.

        Returns:
            The marker's path (left_marker).

        Raises:
            OSError: the directory cannot be deleted or the marker written.
        """
        if self.directory.exists():
            shutil.rmtree(self.directory)
        marker = left_marker(self.directory.parent.parent, self.directory.name)
        write_atomically(
            marker,
            json.dumps({"federation": self.federation, "round": server_round, "deleted": str(self.directory)}).encode(),
        )
        return marker

    def saved_rounds(self) -> list[int]:
        """Rounds with a saved state, oldest first.

        Returns:
            The rounds of the directory's round-<r>.safetensors files; empty without the directory.
        """
        if not self.directory.is_dir():
            return []
        matches = (_STATE_FILE.fullmatch(entry.name) for entry in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in matches if match)

    def load(self, accepted_round: int, for_round: int) -> ClientState | None:
        """The state after `accepted_round`, the last round of this client the server accepted (None when it
        accepted none yet), to start round `for_round` from.

        Args:
            accepted_round: the last round whose reply the server accepted from this client; 0 for none.
            for_round: the round about to start; named in the error only.

        Returns:
            The state, its `round` set to `accepted_round`; None when `accepted_round` is 0.

        Raises:
            StateLostError: no state from `accepted_round` is saved.
            StateCorruptError: its file exists but cannot be read.
        """
        if accepted_round == 0:
            return None
        if accepted_round not in self.saved_rounds():
            raise StateLostError(
                f"round {for_round}: the server accepted this client's round {accepted_round}, but {self.directory} "
                f"has no state from it (rounds there: {self.saved_rounds() or 'none'})"
            )
        return self._read(accepted_round)

    def _read(self, server_round: int) -> ClientState:
        path = self.path(server_round)
        try:
            problem = safetensors_header_problem(path)  # bounded before the library reads it; the tensors by the file
            if problem:
                raise StateCorruptError(f"client state {path} is unreadable: 'header length' {problem}")
            with safe_open(path, framework="pt") as state_file:
                tensors = {name: state_file.get_tensor(name) for name in state_file.keys()}
                metadata = dict(state_file.metadata() or {})
        except (SafetensorError, OSError, ValueError) as error:
            raise StateCorruptError(f"client state {path} is unreadable: {error}") from None
        return ClientState(tensors, metadata, server_round)

    def save(self, state: ClientState, server_round: int, accepted_round: int, checkpointed_round: int = 0) -> None:
        """Store the state after `server_round`. Keep the states after `accepted_round` and `checkpointed_round`
        (what the server may roll this client back to) and the newest MAX_UNCONFIRMED after the accepted round;
        drop older ones and any from later rounds (a future that a server resumed from its checkpoint has
        abandoned).

        Args:
            state: the state to store; its `round` is set to `server_round`. Tensors are stored detached, on the CPU.
            server_round: the round this state is the result of.
            accepted_round: the last round whose reply the server accepted from this client; 0 for none.
            checkpointed_round: the client's accepted round in the server's newest checkpoint on disk; 0 for none.

        Raises:
            OSError: the state file cannot be written.
        """
        payload = save_safetensors(
            {name: tensor.detach().cpu().contiguous() for name, tensor in state.tensors.items()},
            metadata=state.metadata,
        )
        write_atomically(self.path(server_round), payload)
        state.round = server_round
        rounds = self.saved_rounds()
        unconfirmed = [r for r in rounds if accepted_round < r <= server_round][-MAX_UNCONFIRMED:]
        kept = set(unconfirmed) | ({accepted_round, checkpointed_round} & set(rounds))
        for old in set(rounds) - kept:
            self.path(old).unlink(missing_ok=True)
