"""ServerApp: run config -> task, model and strategy; drive the rounds; evaluate them (server/evaluation.py)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; see tasks/compute.py

import secrets
import time
from dataclasses import replace
from logging import ERROR, INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from fedbayes.bayes.params import get_parameters
from fedbayes.flowerseam.simulation_polls import InMemoryGrid
from fedbayes.server.assembly import assemble_server
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.evaluation import ServerEvaluation
from fedbayes.server.loop import run_rounds
from fedbayes.server.preflight import preflight
from fedbayes.server.round_core import RoundCore
from fedbayes.server.tracking import posterior_export, tracked_run
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.compute import configure_threads, resolve_device
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.events import (
    COMPLETED,
    EVENTS_FILE,
    FAILED,
    RUN_ENDED,
    RUN_STARTED,
    TRACKING,
    EventLog,
)
from fedbayes.tasks.runlog import error_reason, new_federation_line, run_failed_line

app = ServerApp()
DEFAULT_SERVER_STATE_DIR = os.environ.get("FEDBAYES_SERVER_STATE_DIR", str(Path.home() / ".fedbayes" / "server"))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """The ServerApp: `run_federation` on Flower's grid.

    Args:
        grid: Flower's grid to the clients.
        context: the ServerApp's context; its run config describes the federation.

    Raises:
        Exception: whatever ended the run (run_federation).
    """
    run_federation(grid, context)


def run_federation(grid: Grid, context: Context, pipeline_evaluation: bool = True) -> None:
    """Run the federation the run config describes on `grid` to its last round. Flower records a failed ServerApp
    only as a run status without the exception's type, and the traceback it logs spans many lines: the cause is
    logged as one line, and the event stream (tasks/events.py), which the CLI tools read, ends with the outcome.

    Args:
        grid: the clients' link (Flower's Grid, or one of the same shape such as deploy/inprocess.py's).
        context: the ServerApp's context; its run config describes the federation.
        pipeline_evaluation: evaluate and checkpoint round t while round t+1 trains; False: one step after the
            other, on this thread.

    Raises:
        Exception: whatever ended the run, once logged and recorded.
    """
    events = EventLog(mirror=lambda line: log(INFO, "%s", line))
    try:
        _run_federation(grid, context, events, pipeline_evaluation)
    except Exception as error:
        log(ERROR, "%s", run_failed_line(error))
        events.emit(RUN_ENDED, outcome=FAILED, reason=error_reason(error))
        raise
    events.emit(RUN_ENDED, outcome=COMPLETED, reason=None)


def _run_federation(grid: Grid, context: Context, events: EventLog, pipeline_evaluation: bool) -> None:
    configure_threads()
    settings = run_settings(context.run_config)
    preflight(settings)
    server_state_dir = settings.server_state_dir or DEFAULT_SERVER_STATE_DIR
    named_here = not settings.federation
    if named_here:
        settings = settings.replace(federation=new_federation_name(server_state_dir))
        log(INFO, "%s", new_federation_line(settings.federation))
    events.write_to(Path(server_state_dir) / settings.federation / EVENTS_FILE)
    events.emit(
        RUN_STARTED,
        federation=settings.federation,
        named_by_server=named_here,
        strategy=settings.strategy,
        rounds=settings.num_server_rounds,
    )
    if isinstance(grid, InMemoryGrid) and settings.client_identity != "reconnect":
        # Simulation: virtual clients in this process, with new random node ids in every run, so ids bound to
        # the nodes of the run a resume continues would refuse every client. Nothing crosses a network here.
        log(INFO, "simulation: client ids may move to the new run's nodes (client-identity=reconnect)")
        settings = settings.replace(client_identity="reconnect")
    test = load_dataset(settings.dataset, train=False, data_root=settings.data_root, download=settings.download)
    torch.manual_seed(settings.seed)  # the initial model, and every later draw of this run, follow from the seed
    parts = assemble_server(settings, test.input_shape, test.num_classes)
    settings, strategy = parts.settings, parts.strategy
    assert parts.model is not None, "a server that runs builds its model"
    device = resolve_device(settings.device)
    log(
        INFO,
        "fedbayes: federation %s, strategy %s, %s, %d rounds",
        settings.federation,
        settings.strategy,
        settings.dataset,
        settings.num_server_rounds,
    )

    initial = ArrayRecord({name: Array(np.asarray(value)) for name, value in get_parameters(parts.model).items()})
    # the ensemble's size as evaluated: a checkpoint (and the posterior `fedbayes export` makes of it) records it
    run_config = {
        **context.run_config,
        "federation": settings.federation,
        "ensemble-samples": settings.ensemble_samples,
    }
    # run config `tracking`: the rows, figures and posterior in MLflow or TensorBoard (server/tracking.py)
    with tracked_run(
        settings.tracker,
        run_config,
        posterior_export(server_state_dir, settings.federation, run_config),
        notice=lambda message: events.emit(TRACKING, message=message),
    ) as sinks:
        run_rounds(
            grid,
            RoundCore(settings, strategy),
            initial,
            replace(settings.loop, pipeline_evaluation=pipeline_evaluation),
            ServerEvaluation(parts.model, test.scaled(settings.input_scale), strategy, settings.evaluation, device),
            settings.results_path,
            # The federation's name as chosen, so that a resume naming it matches the checkpoint's settings.
            CheckpointStore(
                server_state_dir,
                settings.federation,
                run_config,
                initial_arrays={name: array.numpy() for name, array in initial.items()},
                keep=settings.keep_checkpoints,
                resume_from_round=settings.resume_from_round,
                defaults=default_run_config(settings.strategy),
            ),
            sinks,
            events,
        )


def new_federation_name(server_state_dir: str) -> str:
    """<date>-<time>-<4 hex digits>, one no checkpoint under `server_state_dir` has: a run that names no
    federation starts a new one rather than resuming (or clashing with) whatever ran before.

    Args:
        server_state_dir: the folder holding a folder per federation (run config `server-state-dir`); it need not
            exist.

    Returns:
        The name, from the local time and 2 random bytes; no folder of that name is under `server_state_dir`.
    """
    while True:
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
        if not (Path(server_state_dir) / name).exists():
            return name
