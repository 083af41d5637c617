"""`fedbayes export`: the global posterior of a round a run kept a server checkpoint of, as an open file
(posterior/file.py).

The checkpoint is read through server/checkpoint.py (every field checked, checksum included). Its run config
rebuilds the model and the strategy's server half, which loads the checkpointed state and says what it holds of
the global posterior (strategies/base.py `global_posterior`): a Gaussian, particles, or only the global model.
The run config a checkpoint keeps leaves out what a resumed run may change (server/checkpoint.py RESUMABLE_KEYS);
of those the export needs the data's location (`data-root`) and the evaluation batch size, which a `fedbayes local`
workdir's run config has and a bare server state directory does not (then: the options, or the defaults).

A checkpoint and a workdir are data: a strategy or model their run config names as "<module>:<attribute>" is
imported only when the user names the same reference (`RunLocation.named_code`: `fedbayes export --strategy
--model`), and the model is laid out (tasks/models.py `build_model_holding`) against the checkpoint's global arrays
before it is built, so the sizes a run config claims cost no more memory than the checkpoint holds.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedbayes.bayes.params import flatten, unflatten
from fedbayes.posterior.file import (
    BUFFER,
    MEAN,
    PARTICLES,
    PRECISION,
    PRECISION_MATRIX,
    Header,
    Layout,
    ModelSpec,
    read_signing_key,
    write_posterior_file,
)
from fedbayes.server.assembly import ModelMismatch, assemble_server
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.strategies.base import GlobalPosterior
from fedbayes.tasks.config import unnamed_code
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import parse_hidden

WORKDIR_RUN_CONFIG = "run-config.toml"  # what `fedbayes local` submitted (deploy/launcher.py LocalFederation.submit)


class ExportError(ValueError):
    """A run's posterior cannot be exported; the message names the run or checkpoint and the problem."""


@dataclass(frozen=True)
class RunLocation:
    state_dir: Path  # the server state directory: <state_dir>/<federation>/checkpoint-<round>.safetensors
    federation: str
    run_config: dict[str, Any]  # a `fedbayes local` workdir's run config; {} for a bare server state directory
    # The code the user named (key -> "<module>:<attribute>", tasks/config.py CODE_KEYS): the only code the run
    # config of the run's files may name (tasks/config.py `unnamed_code`)
    named_code: Mapping[str, str] = field(default_factory=dict)

    def code_problem(self, source: str, run_config: Mapping[str, Any]) -> str | None:
        """Why the code `run_config` (read from `source`) names may not be imported; None when it may.

        Args:
            source: where `run_config` was read, as the message names it (a checkpoint's path, a workdir's run config).
            run_config: the run config whose strategy and model references are checked against `named_code`.

        Returns:
            None when every "<module>:<attribute>" reference in `run_config` is one the user named, else a message
                naming
            the reference, `source`, and the option that would name it.
        """
        return unnamed_code(source, run_config, self.named_code)


def locate_run(run: Path, federation: str | None, named_code: Mapping[str, str] | None = None) -> RunLocation:
    """Where the run `run` keeps its server checkpoints, and the run config that goes with them.

    Args:
        run: a `fedbayes local` workdir (the federation and server state directory are in its run config), or, with
            `federation`, a server state directory holding that federation.
        federation: the federation in the server state directory `run`; None (or empty) when `run` is a workdir.
        named_code: the strategy and model references the user named ("strategy"/"model" -> "<module>:<attribute>"),
            which the run's run config may name (RunLocation.named_code); None: none.

    Returns:
        The state directory, federation and run config (empty for a bare server state directory) of the run.

    Raises:
        ExportError: `run` holds no checkpoint of `federation` (the message lists the federations that it does hold),
            or, without `federation`, `run` is not a workdir or its run config names no server state directory or
            federation.
    """
    named_code = dict(named_code or {})
    if federation:
        if not CheckpointStore(run, federation, {}).kept_rounds():
            raise ExportError(f"{run / federation} holds no server checkpoint ({_federations_in(run)})")
        return RunLocation(run, federation, {}, named_code)
    config_file = run / WORKDIR_RUN_CONFIG
    if not config_file.is_file():
        raise ExportError(
            f"{run} is not a `fedbayes local` workdir (it has no {WORKDIR_RUN_CONFIG}); for a server "
            f"state directory, name the federation with --federation ({_federations_in(run)})"
        )
    config = tomllib.loads(config_file.read_text())
    missing = [key for key in ("server-state-dir", "federation") if key not in config]
    if missing:
        raise ExportError(f"{config_file} names no {' and no '.join(missing)} (`fedbayes local` writes both)")
    return RunLocation(Path(config["server-state-dir"]), config["federation"], config, named_code)


def _federations_in(directory: Path) -> str:
    if not directory.is_dir():
        return f"{directory} is no directory"
    names = sorted(
        path.name
        for path in directory.iterdir()
        if path.is_dir() and CheckpointStore(directory, path.name, {}).kept_rounds()
    )
    return (
        f"federations with checkpoints in {directory}: {', '.join(names)}"
        if names
        else f"{directory} holds no federation's checkpoints"
    )


def export_posterior(
    location: RunLocation,
    out: Path,
    server_round: int = 0,
    data_root: str | None = None,
    eval_batch_size: int | None = None,
    sign: Path | None = None,
) -> Header:
    """Write the posterior of a kept round to `out` as a posterior file (posterior/file.py), signed with `sign`'s key.

    Args:
        location: the run (locate_run): its state directory, federation, run config and the code the user named.
        out: the .safetensors file to write; replaced atomically (the caller checks it may be, tasks/storage.py
            `check_new_files`).
        server_round: the kept round to export, >= 1; 0: the newest kept round.
        data_root: where the run's dataset is, in place of what the run config says (outside a workdir: the default);
            the test split gives the input shape, classes and pixel scale the header records. None: the run config's.
        eval_batch_size: the run's evaluation batch size, recorded for bit-equal predictions, in place of the run
            config's (or the default). None: the run config's.
        sign: an Ed25519 private key file (posterior/file.py read_signing_key) to sign the file with; None: unsigned.

    Returns:
        The header written to `out`: strategy, posterior kind, model spec, data shape and preprocessing, round.

    Raises:
        ExportError: the checkpoint's run config names code the user did not name, its global arrays do not fit the
            model its run config builds, the run's test data are not at the data root, or the strategy's posterior mean
            is not its global model.
        CheckpointError: the checkpoint is missing, unreadable or damaged (server/checkpoint.py).
        ValueError: `sign` is not an unencrypted Ed25519 private key file; checked before any other work.
    """
    signing_key = read_signing_key(sign) if sign is not None else None  # a bad key before any work
    store = CheckpointStore(location.state_dir, location.federation, {})
    checkpoint, saved_run_config = store.read(server_round)
    source = store.round_path(checkpoint.server_round)
    options = {
        key: value
        for key, value in (("data-root", data_root), ("eval-batch-size", eval_batch_size))
        if value is not None
    }
    run_config = {**location.run_config, **saved_run_config, **options}
    if problem := location.code_problem(f"the run config of {source}", run_config):
        raise ExportError(problem)
    settings = run_settings({**default_run_config(str(run_config.get("strategy", ""))), **run_config})
    try:
        test = load_dataset(settings.dataset, train=False, data_root=settings.data_root)
    except (FileNotFoundError, ValueError) as error:
        raise ExportError(
            f"exporting {source} needs the run's test data (input shape, classes, pixel scale): {error}; "
            "--data-root names where the dataset is"
        ) from None
    spec = ModelSpec(settings.model, parse_hidden(settings.hidden), settings.activation, settings.pool)
    held = {name: tuple(value.shape) for name, value in checkpoint.arrays.items()}
    try:
        parts = assemble_server(settings, test.input_shape, test.num_classes, held)
    except ModelMismatch as error:
        raise ExportError(
            f"{source}: its global arrays ({len(held)} tensors) do not fit the model its run config builds here "
            f"({spec}): {type(error.cause).__name__}: {error}"
        ) from None
    settings, strategy, layout, buffers = parts.settings, parts.strategy, parts.layout, parts.buffers
    strategy.commit(strategy.load_state(checkpoint.strategy_state))
    posterior = strategy.global_posterior()
    kind, tensors = posterior_tensors(posterior, checkpoint.arrays, layout, buffers, source)
    header = Header(
        strategy=settings.strategy,
        kind=kind,
        note=posterior.note,
        model=spec,
        input_shape=test.input_shape,
        num_classes=test.num_classes,
        input_scale=settings.input_scale,
        pixel_scale=test.pixel_scale,
        dataset=settings.dataset,
        round=checkpoint.server_round,
        federation=settings.federation,
        seed=settings.seed,
        ensemble_samples=settings.ensemble_samples,
        eval_batch_size=settings.eval_batch_size,
        parameters=layout,
        buffers=buffers,
        particles=0 if posterior.particles is None else len(posterior.particles),
        fedbayes_version=_installed_version(),
    )
    write_posterior_file(out, header, tensors, signing_key)
    return header


def posterior_tensors(
    posterior: GlobalPosterior, arrays: dict[str, np.ndarray], layout: Layout, buffers: Layout, source: Path
) -> tuple[str, dict[str, np.ndarray]]:
    """The posterior's kind and its tensors (posterior/file.py), from the checkpoint's global `arrays` and what the
    strategy holds.

    Args:
        posterior: what the strategy's server half holds of the global posterior: particles, a Gaussian, or neither.
        arrays: the checkpoint's global arrays, parameter and buffer name -> array.
        layout: the model's parameters, name -> shape, in the order the flat vectors follow.
        buffers: the model's buffers (BatchNorm statistics), name -> shape.
        source: the checkpoint's path, for the message of an error.

    Returns:
        The kind ("particles", "point", "gaussian-full" or "gaussian-diagonal") and tensor name -> array: the mean and
        buffers always, then the particles (N, *shape) per parameter, the (P, P) precision matrix, or the per-entry
        precisions (float64, an isotropic precision broadcast to every entry).

    Raises:
        ExportError: a Gaussian posterior whose mean is not exactly the global model `arrays` hold.
    """
    tensors = {f"{MEAN}{name}": arrays[name] for name in layout} | {f"{BUFFER}{name}": arrays[name] for name in buffers}
    if posterior.particles is not None:
        particles = [unflatten(particle, layout) for particle in posterior.particles]
        return "particles", tensors | {f"{PARTICLES}{name}": np.stack([p[name] for p in particles]) for name in layout}
    gaussian = posterior.gaussian
    if gaussian is None:
        return "point", tensors
    # The file keeps one mean, the global model the server evaluates; the server samples around the Gaussian's.
    if not np.array_equal(gaussian.mean.numpy(), flatten(arrays, layout)):
        raise ExportError(
            f"{source}: the strategy's posterior mean is not its global model (the strategy "
            "should round it to float32 as it sends it)"
        )
    if gaussian.kind == "full":
        return "gaussian-full", tensors | {PRECISION_MATRIX: gaussian.precision.numpy()}
    precision = torch.broadcast_to(gaussian.precision, gaussian.mean.shape).numpy()  # isotropic: one for every entry
    return "gaussian-diagonal", tensors | {
        f"{PRECISION}{name}": value for name, value in unflatten(precision, layout, dtype=np.float64).items()
    }


def _installed_version() -> str:
    try:
        return version("fedbayes")
    except PackageNotFoundError:
        return "unknown (not installed: run from a checkout)"
