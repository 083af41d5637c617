"""Server checkpoints: a restarted ServerApp resumes its federation after the last finished round.

After every round the loop writes <server-state-dir>/<federation>/checkpoint-<round>.safetensors: the global
arrays, the strategy's `state_dict()` (duals, running sums, particles, ...), the round, the wall time so far,
the run config the federation was started with, and a SHA-256 checksum over all of it. checkpoint.safetensors
next to them is a symbolic link to the newest, for tools; the last `keep-checkpoints` rounds are kept, an older
one is deleted only once the new one is durably on disk. Writes are atomic (temp file + fsync + rename);
safetensors never unpickles.

A ServerApp started for a federation that has checkpoints continues from the newest, or from the kept round
`resume-from-round` names. Whatever it reads is checked first (the header length before the header is parsed,
checksum, metadata fields, the global arrays against the run's initial model, finite tensors): a damaged
checkpoint is refused naming the file and the field, offering the kept rounds that are intact; it never falls
back to another one by itself. Settings that would
change the algorithm mid-run (strategy, data, model, hyperparameters) must match the checkpoint's, or the resume
is refused with the keys that differ. Resuming from an older round abandons the later ones: their checkpoints
are deleted when the resumed run starts, as the results file drops their rows then (server/loop.py), so that a
crash before its first new round cannot resume the abandoned rounds whose rows are gone.

`save` refuses, writing nothing, a state with a non-finite tensor or global arrays unlike the initial model's:
a strategy bug must stop the run rather than become the state every later resume starts from.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import log
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from fedbayes.strategies.base import ServerState
from fedbayes.tasks.storage import (
    CHECKSUM_KEY,
    checksum,
    fsync_directory,
    link_atomically,
    safetensors_header_problem,
    write_atomically,
)

CHECKPOINT_FILE = "checkpoint.safetensors"  # a link to the newest checkpoint-<round>.safetensors
_ROUND_FILE = re.compile(r"checkpoint-([0-9]+)\.safetensors")
FORMAT_VERSION = "4"  # 2: bound client ids and accepted rounds; 3: per-client records, model buffers; 4: checksum
# Run-config keys a resumed run may change: how long to run and wait, where to log, what hardware, when and on what
# share of the test set and against which OOD inputs the server evaluates.
RESUMABLE_KEYS = frozenset(
    {
        "num-server-rounds",
        "results-path",
        "server-state-dir",
        "round-timeout",
        "poll-interval",
        "wait-for-clients",
        "wait-for-clients-timeout",
        "min-clients",
        "eval-batch-size",
        "device",
        "data-root",
        "download",
        "max-payload-mb",
        "max-failed-rounds",
        "max-clients",
        "max-client-examples",
        "client-identity",
        "client-registry",
        "screen-ratio",
        "robust-aggregation",
        "clip-ratio",
        "trim-fraction",
        "max-client-rejections",
        "quarantine-rounds",
        "straggler-wait",
        "results-exists",
        "keep-checkpoints",
        "resume-from-round",
        "tracking",
        "eval-every",
        "eval-fraction",
        "eval-threads",
        "eval-batched",
        "ood-inputs",
    }
)
_GLOBAL, _STRATEGY = "global/", "strategy/"
ArrayLayout = dict[str, tuple[tuple[int, ...], np.dtype]]  # name -> (shape, dtype)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or written, or does not belong to this run's settings."""


class OtherSettings(CheckpointError):
    """The checkpoint is intact but was made with other run settings: resuming from it is refused."""


Damaged = Callable[[str, str], CheckpointError]  # (field, problem) -> the error naming the file


@dataclass
class Checkpoint:
    server_round: int  # the last finished round
    arrays: dict[str, np.ndarray]  # the global model after that round
    strategy_state: ServerState
    wall_seconds: float  # run time so far, so a resumed run reports the federation's total


class CheckpointStore:
    """One federation's checkpoints, as this run reads and writes them.

    `initial_arrays`: the run's initial global arrays; every checkpoint saved or loaded must hold arrays of the
    same names, shapes and dtypes (None: no layout check, for tools and tests that only inspect checkpoints).
    `keep` and `resume_from_round`: the run config's keep-checkpoints and resume-from-round (0 = the newest).
    `defaults`: every run-config key's declared default. A key the checkpoint's settings lack, set at its default,
    is not another setting: keys are added with the default that keeps what the code did before them, so a
    federation checkpointed before an upgrade resumes after it."""

    def __init__(
        self,
        root: str | Path,
        federation: str,
        run_config: Mapping[str, Any],
        *,
        initial_arrays: Mapping[str, np.ndarray] | None = None,
        keep: int = 3,
        resume_from_round: int = 0,
        defaults: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory = Path(root) / federation
        self.path = self.directory / CHECKPOINT_FILE
        self.run_config = {key: value for key, value in run_config.items() if key not in RESUMABLE_KEYS}
        self.layout: ArrayLayout | None = (
            None
            if initial_arrays is None
            else {name: (tuple(np.shape(value)), np.asarray(value).dtype) for name, value in initial_arrays.items()}
        )
        self.keep, self.resume_from_round = keep, resume_from_round
        self.defaults = defaults or {}

    def round_path(self, server_round: int) -> Path:
        """The file of round `server_round`'s checkpoint.

        Args:
            server_round: the round, from 1.

        Returns:
            <directory>/checkpoint-<server_round>.safetensors; it need not exist.
        """
        return self.directory / f"checkpoint-{server_round}.safetensors"

    def kept_rounds(self) -> list[int]:
        """The rounds with a checkpoint on disk, oldest first.

        Returns:
            The rounds of the directory's checkpoint-<round>.safetensors files; empty without the directory.
        """
        if not self.directory.is_dir():
            return []
        matches = (_ROUND_FILE.fullmatch(path.name) for path in self.directory.iterdir())
        return sorted(int(match.group(1)) for match in matches if match)

    # ---- writing ---------------------------------------------------------------------------------------------
    def save(self, checkpoint: Checkpoint) -> None:
        """Write round `checkpoint.server_round`'s checkpoint, make it the newest, then delete the ones beyond
        `keep`.

        Args:
            checkpoint: the state after its round: global arrays, the strategy's state and the wall time so far.

        Raises:
            CheckpointError: writing nothing, when a tensor holds a non-finite value or the global arrays differ from
                the initial ones in names, shapes or dtypes.
            OSError: the file or the link cannot be written, or an old checkpoint deleted.
        """
        tensors = self._tensors_to_save(checkpoint)
        metadata = {
            "format": FORMAT_VERSION,
            "round": str(checkpoint.server_round),
            "wall_seconds": repr(checkpoint.wall_seconds),
            "run_config": json.dumps(self.run_config, sort_keys=True),
            "strategy": json.dumps(checkpoint.strategy_state.metadata, sort_keys=True),
        }
        metadata[CHECKSUM_KEY] = checksum(tensors, metadata)
        write_atomically(self.round_path(checkpoint.server_round), save(tensors, metadata=metadata))
        link_atomically(self.path, self.round_path(checkpoint.server_round).name)
        for server_round in self.kept_rounds()[: -self.keep]:
            self.round_path(server_round).unlink()

    def _tensors_to_save(self, checkpoint: Checkpoint) -> dict[str, np.ndarray]:
        def refuse(field: str, problem: str) -> CheckpointError:
            return CheckpointError(
                f"refusing to write the checkpoint of round {checkpoint.server_round} to "
                f"{self.directory}: '{field}' {problem}; nothing was written"
            )

        if self.layout is not None:
            problem = _layout_problem(checkpoint.arrays, self.layout)
            if problem:
                raise refuse(*problem)
        # require, not ascontiguousarray: that one turns 0-d arrays (BatchNorm's num_batches_tracked) into 1-d
        tensors = {f"{_GLOBAL}{name}": np.require(value, requirements="C") for name, value in checkpoint.arrays.items()}
        tensors |= {
            f"{_STRATEGY}{name}": np.require(value, requirements="C")
            for name, value in checkpoint.strategy_state.tensors.items()
        }
        for name, value in tensors.items():
            if not _all_finite(value):
                raise refuse(name, f"holds non-finite values ({_non_finite_summary(value)})")
        return tensors

    def drop_rounds_after(self, server_round: int) -> None:
        """Resumed from the kept round `server_round`: delete the later checkpoints, whose rounds run again. The
        newest link moves first, then the files go newest first, so a crash midway leaves a consistent newest.

        Args:
            server_round: the kept round resumed from; nothing is deleted when no later round is kept.

        Raises:
            OSError: the link cannot be moved or a file deleted.
        """
        later = [kept for kept in self.kept_rounds() if kept > server_round]
        if not later:
            return
        log(
            WARNING,
            "resume-from-round=%d: deleting the checkpoints of the later rounds %s, which run again",
            server_round,
            ", ".join(map(str, later)),
        )
        link_atomically(self.path, self.round_path(server_round).name)
        for kept in reversed(later):
            self.round_path(kept).unlink()
            fsync_directory(self.directory)

    # ---- reading ---------------------------------------------------------------------------------------------
    def load(self) -> Checkpoint | None:
        """The checkpoint to resume from (the newest, or round `resume_from_round`), or None if the federation
        has none; refuses a damaged one, offering the intact kept rounds, and one made with other settings.

        Returns:
            The checkpoint, or None when the federation has none.

        Raises:
            CheckpointError: `resume_from_round` names a round not kept; the chosen checkpoint is damaged, of another
                format or made with other settings (not only RESUMABLE_KEYS differ).
        """
        chosen = self._chosen_path()
        if chosen is None:
            return None
        try:
            checkpoint, _ = self._read(chosen, same_run=True)
        except OtherSettings as other:  # not damage: no alternatives to offer, and reported as a CheckpointError
            raise CheckpointError(str(other)) from None
        except CheckpointError as damage:
            raise CheckpointError(f"{damage}; {self._intact_alternatives(chosen)}") from None
        return checkpoint

    def read(self, server_round: int = 0) -> tuple[Checkpoint, dict[str, Any]]:
        """For tools (`fedbayes export`): the kept checkpoint of `server_round` (0: the newest) and the run config it
        was made with, every field checked as `load` checks it, without comparing that config to this store's.

        Args:
            server_round: a kept round; 0 for the newest.

        Returns:
            (the checkpoint, the run config it was made with, less RESUMABLE_KEYS).

        Raises:
            CheckpointError: no checkpoint is kept, none of `server_round`, or it is damaged or of another format.
        """
        kept = self.kept_rounds()
        if not kept:
            raise CheckpointError(f"{self.directory} holds no server checkpoint")
        if server_round and server_round not in kept:
            raise CheckpointError(
                f"{self.directory} holds no checkpoint of round {server_round} (kept rounds: "
                f"{', '.join(map(str, kept))}; run config keep-checkpoints says how many are kept)"
            )
        return self._read(self.round_path(server_round or kept[-1]))

    def _chosen_path(self) -> Path | None:
        kept = self.kept_rounds()
        if self.resume_from_round:
            if self.resume_from_round not in kept:
                raise CheckpointError(
                    f"resume-from-round={self.resume_from_round}: {self.directory} holds no checkpoint of that "
                    f"round (kept rounds: {', '.join(map(str, kept)) or 'none'}; 0 resumes from the newest)"
                )
            return self.round_path(self.resume_from_round)
        if kept:
            return self.round_path(kept[-1])
        # A checkpoint of an earlier format has no numbered files: read it, so that it is refused rather than
        # a fresh run replacing it.
        return self.path if self.path.exists() or self.path.is_symlink() else None

    def _intact_alternatives(self, damaged: Path) -> str:
        intact = []
        for server_round in reversed(self.kept_rounds()):
            if self.round_path(server_round) != damaged:
                try:
                    self._read(self.round_path(server_round))
                    intact.append(server_round)
                except CheckpointError:
                    pass
        if not intact:
            return "no other kept checkpoint is intact (another `federation` name starts over)"
        return (
            f"intact kept checkpoints: rounds {', '.join(map(str, intact))}; to resume from round {intact[0]}: "
            f"set resume-from-round={intact[0]} (the rounds after it run again)"
        )

    def _read(self, path: Path, same_run: bool = False) -> tuple[Checkpoint, dict[str, Any]]:
        """The checkpoint at `path` and the run config it was made with, every field checked; with `same_run`, that
        config must be this store's (checked before the arrays: another model is other settings, not damage)."""

        def damaged(field: str, problem: str) -> CheckpointError:
            return CheckpointError(f"server checkpoint {path} is damaged: '{field}' {problem}")

        tensors, metadata = _read_file(path)
        if metadata.get("format") != FORMAT_VERSION:
            raise CheckpointError(
                f"server checkpoint {path} has format {metadata.get('format')!r}, this version reads {FORMAT_VERSION!r}"
            )
        for field in ("round", "wall_seconds", "run_config", "strategy", CHECKSUM_KEY):
            if field not in metadata:
                raise damaged(field, "is missing")
        server_round = _parse_round(metadata["round"], damaged)
        file_round = _ROUND_FILE.fullmatch(path.name)
        if file_round and int(file_round.group(1)) != server_round:
            raise damaged("round", f"is {server_round}, but the file is named for round {file_round.group(1)}")
        wall_seconds = _parse_wall_seconds(metadata["wall_seconds"], damaged)
        run_config = _parse_json_object(metadata["run_config"], "run_config", damaged)
        intact = metadata[CHECKSUM_KEY] == checksum(tensors, metadata)
        if same_run and intact:  # an intact file of another model is other settings, not damage
            self._check_same_run(path, run_config)
        strategy_metadata = _parse_json_object(metadata["strategy"], "strategy", damaged)
        if not all(isinstance(value, str) for value in strategy_metadata.values()):
            raise damaged("strategy", "is not an object of strings")
        arrays = {name[len(_GLOBAL) :]: value for name, value in tensors.items() if name.startswith(_GLOBAL)}
        self._check_tensors(arrays, tensors, damaged)
        # Last: a field that is itself wrong is named above rather than reported as a bare mismatch.
        if not intact:
            raise damaged(
                CHECKSUM_KEY, "does not match the file's contents (changed or corrupted after it was written)"
            )
        strategy_tensors = {
            name[len(_STRATEGY) :]: value for name, value in tensors.items() if name.startswith(_STRATEGY)
        }
        strategy_state = ServerState(strategy_tensors, strategy_metadata)
        return Checkpoint(server_round, arrays, strategy_state, wall_seconds), run_config

    def _check_tensors(
        self, arrays: Mapping[str, np.ndarray], tensors: Mapping[str, np.ndarray], damaged: Damaged
    ) -> None:
        """The global `arrays` laid out like the initial model's; every one of the file's `tensors` finite."""
        if self.layout is not None:
            problem = _layout_problem(arrays, self.layout)
            if problem:
                raise damaged(f"{_GLOBAL}{problem[0]}", problem[1])
        for name, value in tensors.items():
            if not _all_finite(value):
                raise damaged(name, f"holds non-finite values ({_non_finite_summary(value)})")

    def _check_same_run(self, path: Path, saved: Mapping[str, Any]) -> None:
        differing = sorted(
            key
            for key in saved.keys() | self.run_config.keys()
            if saved.get(key, self.defaults.get(key)) != self.run_config.get(key)  # a key added since: its default
        )
        if differing:
            changes = ", ".join(f"{key}: {saved.get(key)!r} -> {self.run_config.get(key)!r}" for key in differing)
            raise OtherSettings(
                f"federation checkpoint {path} was made with other settings ({changes}); resume with the "
                "same settings, or start a new federation (another `federation` name or `server-state-dir`)"
            )


def _read_file(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The file's tensors and metadata. Its header length is bounded first; the tensors, which must fill the rest of
    the file exactly (the library checks), are bounded by the file itself."""
    try:
        problem = safetensors_header_problem(path)
        if problem:
            raise CheckpointError(f"server checkpoint {path} is damaged: 'header length' {problem}")
        with safe_open(path, framework="np") as checkpoint_file:
            tensors = {name: checkpoint_file.get_tensor(name) for name in checkpoint_file.keys()}
            return tensors, checkpoint_file.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(
            f"server checkpoint {path} is unreadable (truncated, or not a checkpoint): {error}"
        ) from None


def _layout_problem(arrays: Mapping[str, np.ndarray], layout: ArrayLayout) -> tuple[str, str] | None:
    """(array name, what is wrong) for the first array unlike `layout`, or None."""
    for name, (shape, dtype) in layout.items():
        if name not in arrays:
            return name, "is missing"
        if tuple(np.shape(arrays[name])) != shape:
            return name, f"has shape {tuple(np.shape(arrays[name]))}, the model's is {shape}"
        if np.asarray(arrays[name]).dtype != dtype:
            return name, f"has dtype {np.asarray(arrays[name]).dtype}, the model's is {dtype}"
    unexpected = sorted(set(arrays) - set(layout))
    if unexpected:
        return unexpected[0], "is not an array of the model"
    return None


def _all_finite(value: np.ndarray) -> bool:
    return not np.issubdtype(value.dtype, np.inexact) or bool(np.isfinite(value).all())


def _non_finite_summary(value: np.ndarray) -> str:
    return f"{int(np.isnan(value).sum())} NaN, {int(np.isinf(value).sum())} infinite of {value.size}"


def _parse_round(text: str, damaged: Damaged) -> int:
    if not re.fullmatch(r"[0-9]+", text):
        raise damaged("round", f"is {text!r}, not a round number (an integer >= 0)")
    return int(text)


def _parse_wall_seconds(text: str, damaged: Damaged) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise damaged("wall_seconds", f"is {text!r}, not a finite number of seconds >= 0")
    return seconds


def _parse_json_object(text: str, field: str, damaged: Damaged) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise damaged(field, f"is not valid JSON ({error})") from None
    except RecursionError:
        raise damaged(field, "is JSON nested too deeply to read") from None
    if not isinstance(value, dict):
        raise damaged(field, f"is not a JSON object but {type(value).__name__}")
    return value
