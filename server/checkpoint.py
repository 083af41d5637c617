"""Server checkpoints: a restarted ServerApp resumes its federation after the last finished round.

After every round the loop writes <server-state-dir>/<federation>/checkpoint.safetensors: the global
arrays, the strategy's `state_dict()` (duals, running sums, particles, ...), the round, the wall time
so far and the run config the federation was started with. Writes are atomic (temp file + fsync +
rename); safetensors never unpickles. A ServerApp started for a federation that has a checkpoint
continues from it; settings that would change the algorithm mid-run (strategy, data, model,
hyperparameters) must match the checkpoint's, or the resume is refused with the keys that differ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from fedbayes.strategies.base import ServerState
from fedbayes.tasks.storage import write_atomically

CHECKPOINT_FILE = "checkpoint.safetensors"
FORMAT_VERSION = "3"  # 2: bound client ids and accepted rounds; 3: per-client records, model buffers
# Run-config keys a resumed run may change: how long to run and wait, where to log, what hardware.
RESUMABLE_KEYS = frozenset({
    "num-server-rounds", "results-path", "server-state-dir", "round-timeout", "poll-interval",
    "wait-for-clients", "wait-for-clients-timeout", "min-clients", "eval-batch-size", "device", "data-root",
    "download", "max-payload-mb", "max-failed-rounds", "max-clients", "max-client-examples", "client-identity",
    "client-registry", "screen-ratio", "robust-aggregation", "clip-ratio", "trim-fraction", "max-client-rejections",
    "quarantine-rounds", "straggler-wait", "results-exists", "keep-checkpoints", "resume-from-round",
})
_GLOBAL, _STRATEGY = "global/", "strategy/"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read, or does not belong to this run's settings."""


@dataclass
class Checkpoint:
    server_round: int  # the last finished round
    arrays: dict[str, np.ndarray]  # the global model after that round
    strategy_state: ServerState
    wall_seconds: float  # run time so far, so a resumed run reports the federation's total


class CheckpointStore:
    def __init__(self, root: str | Path, federation: str, run_config: Mapping[str, Any]) -> None:
        self.path = Path(root) / federation / CHECKPOINT_FILE
        self.run_config = {key: value for key, value in run_config.items() if key not in RESUMABLE_KEYS}

    def save(self, checkpoint: Checkpoint) -> None:
        tensors = {f"{_GLOBAL}{name}": np.ascontiguousarray(value) for name, value in checkpoint.arrays.items()}
        tensors |= {f"{_STRATEGY}{name}": np.ascontiguousarray(value)
                    for name, value in checkpoint.strategy_state.tensors.items()}
        metadata = {
            "format": FORMAT_VERSION,
            "round": str(checkpoint.server_round),
            "wall_seconds": repr(checkpoint.wall_seconds),
            "run_config": json.dumps(self.run_config, sort_keys=True),
            "strategy": json.dumps(checkpoint.strategy_state.metadata, sort_keys=True),
        }
        write_atomically(self.path, save(tensors, metadata=metadata))

    def load(self) -> Checkpoint | None:
        """This federation's checkpoint, or None if it has none; refuses one made with other settings."""
        if not self.path.exists():
            return None
        try:
            with safe_open(self.path, framework="np") as checkpoint_file:
                tensors = {name: checkpoint_file.get_tensor(name) for name in checkpoint_file.keys()}
                metadata = checkpoint_file.metadata() or {}
        except (SafetensorError, OSError, ValueError) as error:
            raise CheckpointError(f"server checkpoint {self.path} is unreadable: {error}") from None
        if metadata.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"server checkpoint {self.path} has format {metadata.get('format')!r}, "
                                  f"this version reads {FORMAT_VERSION!r}")
        self._check_same_run(json.loads(metadata["run_config"]))
        return Checkpoint(
            server_round=int(metadata["round"]),
            arrays={name[len(_GLOBAL):]: value for name, value in tensors.items() if name.startswith(_GLOBAL)},
            strategy_state=ServerState(
                {name[len(_STRATEGY):]: value for name, value in tensors.items() if name.startswith(_STRATEGY)},
                json.loads(metadata["strategy"]),
            ),
            wall_seconds=float(metadata["wall_seconds"]),
        )

    def _check_same_run(self, saved: Mapping[str, Any]) -> None:
        differing = sorted(key for key in saved.keys() | self.run_config.keys()
                           if saved.get(key) != self.run_config.get(key))
        if differing:
            changes = ", ".join(f"{key}: {saved.get(key)!r} -> {self.run_config.get(key)!r}" for key in differing)
            raise CheckpointError(
                f"federation checkpoint {self.path} was made with other settings ({changes}); resume with the "
                "same settings, or start a new federation (another `federation` name or `server-state-dir`)"
            )
