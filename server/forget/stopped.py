"""A stopped federation's server, rebuilt from its newest checkpoint, for `fedbayes forget` to settle requests on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedbayes.posterior.export import RunLocation
from fedbayes.server.assembly import ModelMismatch, assemble_server
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.server.forget.requests import ForgetError, ForgetRequest
from fedbayes.server.forget.settling import Forgetting
from fedbayes.server.round_core import RoundCore
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.datasets import load_dataset

Arrays = dict[str, np.ndarray]


@dataclass
class Rebuilt:
    """A stopped federation's newest checkpoint, with a round core (and its strategy) holding its state."""

    store: CheckpointStore  # writes checkpoints with the checkpoint's own run config
    core: RoundCore
    arrays: Arrays
    server_round: int
    wall_seconds: float


def checked_newest(location: RunLocation) -> tuple[Checkpoint, dict[str, Any]]:
    """The newest checkpoint and its run config; ForgetError when it belongs to another federation.

    Args:
        location: the stopped federation.

    Returns:
        The newest kept checkpoint and the run config it was made with.

    Raises:
        ForgetError: the run config names another federation (nothing was changed).
        CheckpointError: there is no checkpoint, or the newest is unreadable or damaged.
    """
    store = CheckpointStore(location.state_dir, location.federation, {})
    checkpoint, run_config = store.read()
    if run_config.get("federation") != location.federation:
        raise ForgetError(
            f"{store.round_path(checkpoint.server_round)} is a checkpoint of federation "
            f"{str(run_config.get('federation'))[:64]!r}, not of {location.federation!r} (copied from "
            "another federation's directory?); nothing was changed"
        )
    return checkpoint, run_config


def rebuild(location: RunLocation, data_root: str | None = None) -> Rebuilt:
    """The newest checkpoint's state in the strategy's server half, built from the checkpoint's run config as the
    ServerApp builds it (server/assembly.py; the model from the run's test data: its input shape and classes).

    Args:
        location: the stopped federation.
        data_root: where the run's dataset is, if not where its run config says.

    Returns:
        The checkpoint's store, round core, arrays, round and wall time.

    Raises:
        ForgetError: for code the run config names that the user did not, missing test data, a model that does not
            fit the checkpoint, or a checkpoint of another federation.
    """
    checkpoint, saved_run_config = checked_newest(location)
    options = {"data-root": data_root} if data_root is not None else {}
    run_config = {**location.run_config, **saved_run_config, **options}
    source = f"the run config of {CheckpointStore(location.state_dir, location.federation, {}).path}"
    if problem := location.code_problem(source, run_config):  # before anything it names is imported
        raise ForgetError(f"{problem}; nothing was changed")
    # Operators' requests only: a client's comes through a running server, so the registry is not needed here.
    defaults = default_run_config(str(run_config.get("strategy", "")))
    settings = run_settings({**defaults, **run_config, "client-registry": ""})
    try:
        test = load_dataset(settings.dataset, train=False, data_root=settings.data_root)
    except (FileNotFoundError, ValueError) as error:
        raise ForgetError(
            f"rebuilding the server of {location.federation!r} needs the run's test data (input shape, "
            f"classes): {error}; --data-root names where the dataset is"
        ) from None
    held = {name: value.shape for name, value in checkpoint.arrays.items()}
    try:  # laid out against the checkpoint's arrays first: its run config's sizes cost no more than they do
        parts = assemble_server(settings, test.input_shape, test.num_classes, held)
    except ModelMismatch as error:
        raise ForgetError(
            f"the newest checkpoint of {location.federation!r} does not fit the model its run config builds here: "
            f"{error}; nothing was changed"
        ) from None
    core = RoundCore(parts.settings, parts.strategy)
    core.load_state_dict(checkpoint.strategy_state)
    store = CheckpointStore(
        location.state_dir,
        location.federation,
        saved_run_config,
        initial_arrays=checkpoint.arrays,
        keep=settings.keep_checkpoints,
    )
    return Rebuilt(store, core, checkpoint.arrays, checkpoint.server_round, checkpoint.wall_seconds)


def settle_stopped(location: RunLocation, own: tuple[ForgetRequest, ...] = (), data_root: str | None = None) -> None:
    """With the server lock held: settle the queued requests and `own` on the newest checkpoint.

    Args:
        location: the stopped federation.
        own: the operator's requests, decided after the queued ones.
        data_root: where the run's dataset is, if not where its run config says.

    Raises:
        ForgetError: the server cannot be rebuilt from the newest checkpoint (`rebuild`; nothing was changed).
        CheckpointError: there is no checkpoint, or the newest is unreadable or damaged.
    """
    rebuilt = rebuild(location, data_root)
    Forgetting(rebuilt.store).settle(rebuilt.core, rebuilt.arrays, rebuilt.server_round, rebuilt.wall_seconds, own)
