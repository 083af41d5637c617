"""`fedbayes compare`: which strategy, at which settings, for this federation, on the user's own data.

1. Validation split (tasks/validation.py): seed 0's split of the clients' training data, each client keeping 90% and
   giving 10%; what they give is the validation set. The test set is not read until the final runs.
2. Tune: every point of each strategy's grid (deploy/compare_grids.toml, `--grid defaults|small|paper`) is one
   federation on the validation split, seed 0. A point's score is its validation accuracy at the strategy's own
   predictive (the `_ensemble` value where the rows have one), the mean over the last 3 evaluated rounds (all of them
   when fewer); the best point wins, a tie going to the earlier point. A grid of one point (`defaults`) has nothing
   to tune: it goes straight to the final runs.
   Client work is equal (compare_grids.toml [budget]): a strategy that trains one client a round runs `clients`
   rounds for each round of the others, and a particle strategy's SVGD steps are `local-epochs` epochs of minibatches.
3. Final: each strategy's winning point on seeds 0..S-1 and the test set; each client holds out the validation share
   of its data to evaluate on (client-eval-fraction: its own accuracy and calibration) and trains on the rest, as
   many examples as while tuning.
4. Report (under --out): table.md and the same table on the terminal (accuracy, NLL, ECE and, where the rows hold
   them, the uncertainty and per-client metrics: mean ± sd over the seeds of each seed's mean over its last 3
   evaluated rounds), summary.json, and the figures curves.png, reliability.png and uncertainty.png (matplotlib, the
   `report` extra; without it the table and JSON are still written).

The engine is deploy/inprocess.py: the ServerApp and ClientApp code of a `fedbayes local` run in one process, whose
rows equal `fedbayes local`'s round for round (tests/integration/test_compare.py). Resumable: each run's rows are
written to runs/<name>.jsonl in one atomic write when it has finished, with what it ran (strategy, point, seed and
run config); a run whose file holds all its rounds for the same run config is not run again, anything else is run
afresh. `--parallel N` runs N federations at once, each in a subprocess of its own.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import shutil
import statistics
import sys
import time
import tomllib
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

from fedbayes.deploy.launcher import LocalRun, check_run_config
from fedbayes.deploy.progress import CLEAR_LINE, clock_text
from fedbayes.tasks.config import RunSettings, did_you_mean
from fedbayes.tasks.storage import OUTPUT_MODE, remove_torn_writes, write_atomically
from fedbayes.tasks.validation import VALIDATION_SHARE

GRIDS_FILE = Path(__file__).with_name("compare_grids.toml")
TAIL_ROUNDS = 3  # a run's metric: the mean over its last this many evaluated rounds
METRICS = ("accuracy", "nll", "ece")
UNCERTAINTY_KEYS = (
    "misclassification_auroc",
    "misclassification_auroc_mi",
    "selective_accuracy_80",
    "ood_auroc",
    "ood_auroc_mi",
)
CLIENT_KEYS = ("client_accuracy_mean", "client_accuracy_worst", "client_ece_mean", "client_ece_worst")
HEADINGS = {
    "accuracy": "accuracy",
    "nll": "NLL",
    "ece": "ECE",
    "misclassification_auroc": "misclass. AUROC",
    "misclassification_auroc_mi": "misclass. AUROC (MI)",
    "selective_accuracy_80": "sel. acc. @80%",
    "ood_auroc": "OOD AUROC",
    "ood_auroc_mi": "OOD AUROC (MI)",
    "client_accuracy_mean": "client acc. mean",
    "client_accuracy_worst": "client acc. worst",
    "client_ece_mean": "client ECE mean",
    "client_ece_worst": "client ECE worst",
}
RUNS, VALIDATION, WORK = "runs", "validation", "work"
FAILED_KEY = "run_failed"  # on every row of a run the server failed: its reason (a diverged point cannot win)
SUMMARY_FILE, TABLE_FILE = "summary.json", "table.md"
PLOT_FILES = ("curves.png", "reliability.png", "uncertainty.png")
# what the command's own options set, or the protocol does (the seeds), and --set may not
OPTION_KEYS = {
    "strategy": "--strategies",
    "num-server-rounds": "--rounds",
    "dataset": "--dataset",
    "fraction": "--fraction",
    "split": "--split",
    "seed": "--seeds",
}
UNTRACKED_KEYS = ("results-path", "federation", "server-state-dir")  # where a run writes, not what it computes
HELD_OUT_KEY = "client-eval-fraction"  # the final runs hold out each client's validation share to evaluate it on
BUDGET = "budget"  # compare_grids.toml's table of how client work is made equal; every other table is a grid
ENGINE = "in-process (deploy/inprocess.py: the code of `fedbayes local` in one process, equal round for round)"


# ---- grids -----------------------------------------------------------------------------------------------------------


def grid_points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The product of a grid's axes, the first axis slowest (deploy/compare_grids.toml).

    Args:
        axes: axis name -> its values; a scalar value sets the key named after the axis, a table every key it holds.

    Returns:
        The points, each the run-config keys it sets.
    """
    points = []
    for values in itertools.product(*axes.values()):
        point: dict[str, Any] = {}
        for name, value in zip(axes, values):
            point.update(value if isinstance(value, dict) else {name: value})
        points.append(point)
    return points


def load_grid(name: str, path: Path = GRIDS_FILE) -> dict[str, list[dict[str, Any]]]:
    """Grid `name` of `path`: per strategy its points.

    Args:
        name: the grid's name (`--grid`: small or paper), a table of `path`.
        path: the grids file (TOML); its [budget] table is no grid.

    Returns:
        Strategy name -> its points (`grid_points`), in the file's order.

    Raises:
        ValueError: no grid of that name.
        OSError: `path` cannot be read.
        tomllib.TOMLDecodeError: `path` is not TOML.
    """
    with open(path, "rb") as file:
        grids = tomllib.load(file)
    grids.pop(BUDGET, None)
    if name not in grids:
        raise ValueError(f"no grid {name!r}; choose one of {', '.join(grids)}")
    return {strategy: grid_points(axes) for strategy, axes in grids[name].items()}


@dataclass(frozen=True)
class Budget:
    """How the comparison makes each strategy's client work equal (compare_grids.toml [budget]).

    Attributes:
        one_client_a_round: strategies that train one client a round; they run `clients` rounds for each round of
            the others, evaluated every `clients` rounds, so that every client trains as often.
        steps_from_epochs: particle strategies whose L and L' SVGD steps (local-steps, distill-steps) are the
            minibatch steps of `local-epochs` epochs of the mean client, as many as the others' local training takes.
    """

    one_client_a_round: frozenset[str] = frozenset()
    steps_from_epochs: frozenset[str] = frozenset()

    def rounds_per_round(self, strategy: str, clients: int) -> int:
        """How many of `strategy`'s rounds make one round of client work.

        Args:
            strategy: the strategy's name.
            clients: the federation's clients.

        Returns:
            `clients` for a strategy that trains one client a round, else 1.
        """
        return clients if strategy in self.one_client_a_round else 1

    def keys(self, strategy: str, clients: int, steps: int | None) -> dict[str, Any]:
        """The run-config keys the budget sets for `strategy`.

        Args:
            strategy: the strategy's name.
            clients: the federation's clients.
            steps: the minibatch steps of the local training (`epoch_steps`), None while the data is not read yet.

        Returns:
            eval-every for a strategy that trains one client a round, local-steps and distill-steps for a particle
            strategy once `steps` is known; nothing for the others.
        """
        keys: dict[str, Any] = {}
        if strategy in self.one_client_a_round:
            keys["eval-every"] = clients
        if strategy in self.steps_from_epochs and steps is not None:
            keys.update({"local-steps": steps, "distill-steps": steps})
        return keys


@functools.cache
def load_budget(path: Path = GRIDS_FILE) -> Budget:
    """The [budget] table of `path` (an empty budget without one). Cached per path.

    Args:
        path: the grids file (TOML).

    Returns:
        The strategies that train one client a round, and those whose SVGD steps come from local-epochs.

    Raises:
        ValueError: a key of the table other than one-client-a-round and steps-from-epochs.
    """
    with open(path, "rb") as file:
        table = tomllib.load(file).get(BUDGET, {})
    known = {"one-client-a-round", "steps-from-epochs"}
    if set(table) - known:
        raise ValueError(f"{path} [{BUDGET}]: unknown {', '.join(sorted(set(table) - known))}")
    return Budget(frozenset(table.get("one-client-a-round", ())), frozenset(table.get("steps-from-epochs", ())))


def epoch_steps(settings: RunSettings, mean_examples: float) -> int:
    """The minibatch steps of a client's local training: `local-epochs` epochs of the mean client's minibatches.

    Args:
        settings: the run's settings (local-epochs, batch-size).
        mean_examples: the mean client's training examples.

    Returns:
        local-epochs x ceil(mean_examples / batch-size), at least 1.
    """
    return max(1, settings.training.local_epochs * math.ceil(mean_examples / settings.training.batch_size))


def check_strategies(strategies: Iterable[str], grid: dict[str, list[dict[str, Any]]], grid_name: str) -> None:
    """Refuse a strategy the grid has no points for, naming the closest one it has.

    Args:
        strategies: the strategies `--strategies` names, in its order.
        grid: per strategy its points (`load_grid`).
        grid_name: the grid's name, for the messages.

    Raises:
        ValueError: an unknown or repeated strategy, or none at all.
    """
    strategies = list(strategies)
    if not strategies:
        raise ValueError("--strategies names no strategy")
    for strategy in strategies:
        if strategy not in grid:
            raise ValueError(
                f"--strategies: no {grid_name} grid for {strategy!r}{did_you_mean(strategy, grid)}; "
                f"grids exist for {', '.join(grid)}"
            )
    repeated = sorted({strategy for strategy in strategies if strategies.count(strategy) > 1})
    if repeated:
        raise ValueError(f"--strategies names {', '.join(repeated)} more than once")


# ---- the runs --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareSpec:
    """What `fedbayes compare` was asked: the federation, the strategies and the protocol."""

    dataset: str
    clients: int
    strategies: tuple[str, ...]
    rounds: int
    seeds: int
    out: Path
    grid: str = "small"
    fraction: float = 1.0
    split: str = "iid"
    overrides: dict[str, Any] = field(default_factory=dict)  # --set, every run
    parallel: int = 1

    @property
    def tuning_seed(self) -> int:
        return 0


@dataclass(frozen=True)
class Job:
    """One federation of the comparison: a grid point on the validation split, or a winner on one seed."""

    phase: str  # tune | final
    strategy: str
    point: int
    seed: int
    settings: dict[str, Any]
    run_config: dict[str, Any]

    @property
    def name(self) -> str:
        return f"tune-{self.strategy}-p{self.point}" if self.phase == "tune" else f"final-{self.strategy}-s{self.seed}"

    @property
    def rounds(self) -> int:
        """The rounds the federation runs (more than --rounds for a strategy that trains one client a round)."""
        return int(self.run_config["num-server-rounds"])

    @property
    def record(self) -> dict[str, Any]:
        """What the run's rows carry under `compare`: what it ran, to tell a finished run from another."""
        tracked = {key: value for key, value in self.run_config.items() if key not in UNTRACKED_KEYS}
        return json.loads(
            json.dumps(
                {
                    "phase": self.phase,
                    "strategy": self.strategy,
                    "point": self.point,
                    "seed": self.seed,
                    "settings": self.settings,
                    "run_config": tracked,
                }
            )
        )


def job_config(
    spec: CompareSpec,
    strategy: str,
    settings: dict[str, Any],
    seed: int,
    dataset: str,
    steps: int | None = None,
    held_out: float = 0.0,
) -> dict[str, Any]:
    """The run config of one federation (what `fedbayes local` would submit); the validation split's client files are
    the split, so a tuning run has no fraction or split file of its own.

    Args:
        spec: the comparison.
        strategy: the strategy's name.
        settings: the grid point's keys.
        seed: the run's seed.
        dataset: spec.dataset, or the validation split as npz:DIR.
        steps: the minibatch steps of the local training on `dataset` (`epoch_steps`; None: not known yet).
        held_out: the share of each client's examples it holds out of training to evaluate on (client-eval-fraction;
            0: none).

    Returns:
        The run config, with the keys the budget sets (`Budget.keys`).
    """
    tuning = dataset != spec.dataset
    budget = load_budget()
    run = LocalRun(
        strategy=strategy,
        clients=spec.clients,
        rounds=spec.rounds * budget.rounds_per_round(strategy, spec.clients),
        dataset=dataset,
        fraction=1.0 if tuning else spec.fraction,
        split=spec.split,
        seed=seed,
        overrides={
            **spec.overrides,
            **settings,
            **budget.keys(strategy, spec.clients, steps),
            **({"split-file": ""} if tuning else {}),
            **({HELD_OUT_KEY: held_out} if held_out else {}),
        },
    )
    return run.run_config(Path(WORK), Path("results.jsonl"))


def tuning_jobs(
    spec: CompareSpec, grid: dict[str, list[dict[str, Any]]], dataset: str, steps: int | None = None
) -> list[Job]:
    """Every point of `grid` on `dataset` (the validation split), seed 0.

    Args:
        spec: the comparison.
        grid: per strategy the points to tune, in the comparison's order.
        dataset: the validation split as npz:DIR.
        steps: the minibatch steps of the local training on it (`epoch_steps`).

    Returns:
        The jobs, strategy by strategy, point by point.
    """
    return [
        Job(
            "tune",
            strategy,
            point,
            spec.tuning_seed,
            settings,
            job_config(spec, strategy, settings, spec.tuning_seed, dataset, steps),
        )
        for strategy, points in grid.items()
        for point, settings in enumerate(points)
    ]


def final_jobs(
    spec: CompareSpec, grid: dict[str, list[dict[str, Any]]], winners: dict[str, int], steps: int | None = None
) -> list[Job]:
    """Each strategy's winning point on seeds 0..S-1 and the real dataset, each client holding out the validation
    share of its examples to evaluate on (its own accuracy and calibration), so that it trains on as many as it did
    while tuning.

    Args:
        spec: the comparison.
        grid: per strategy its points.
        winners: per strategy its winning point.
        steps: the minibatch steps of the local training (`epoch_steps`).

    Returns:
        The jobs, strategy by strategy, seed by seed.
    """
    return [
        Job(
            "final",
            strategy,
            point,
            seed,
            grid[strategy][point],
            job_config(spec, strategy, grid[strategy][point], seed, spec.dataset, steps, VALIDATION_SHARE),
        )
        for strategy, point in winners.items()
        for seed in range(spec.seeds)
    ]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A run file's rows; none for a file that is not there or not whole (it is then run again).

    Args:
        path: a run's file, runs/<name>.jsonl (JSON lines).

    Returns:
        Its rows in order; an empty list where the file is missing, unreadable or holds a line that is not JSON.
    """
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def finished_rows(job: Job, out: Path) -> list[dict[str, Any]] | None:
    """The rows of `job`'s file if it holds all its rounds of this very run, else None.

    Args:
        job: the federation.
        out: the comparison's folder.

    Returns:
        The rows, when they are rounds 1..job.rounds in order (or fewer, ending on a run the server failed: FAILED_KEY)
        and each one's `compare` equals job.record; else None.
    """
    rows = read_rows(out / RUNS / f"{job.name}.jsonl")
    rounds = [row.get("round") for row in rows]
    in_order = bool(rows) and rounds == list(range(1, len(rows) + 1))
    ended = len(rows) == job.rounds or (0 < len(rows) < job.rounds and bool(rows[-1].get(FAILED_KEY)))
    return rows if in_order and ended and all(row.get("compare") == job.record for row in rows) else None


def run_job(job: Job, clients: int, out: Path) -> list[dict[str, Any]]:
    """Run one federation in this process and write its rows to runs/<name>.jsonl at once.

    Args:
        job: the federation.
        clients: how many clients.
        out: the comparison's folder (its work/<name>/ holds the run's state while it runs).

    Returns:
        Its rows, each with `compare` (Job.record). A run the server failed (it diverged, or accepted no reply for
        max-failed-rounds rounds) keeps the rows it evaluated, each with FAILED_KEY: the server's reason.

    Raises:
        RunFailed: the server failed the run before it wrote a row.
    """
    from fedbayes.deploy.inprocess import run_inprocess
    from fedbayes.server.loop import RunFailed

    workdir = out / WORK / job.name
    rows_file = out / RUNS / f"{job.name}.jsonl"
    shutil.rmtree(workdir, ignore_errors=True)  # what a killed run left
    remove_torn_writes(rows_file)
    workdir.mkdir(parents=True)
    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.WARNING)  # the progress line says how far it is
    failure = None
    try:
        rows = run_inprocess(job.run_config, clients, workdir)
    except RunFailed as failed:
        rows, failure = read_rows(workdir / "results.jsonl"), str(failed)
        if not rows:
            raise
    finally:
        flower.setLevel(level)
    for row in rows:
        row["compare"] = job.record
        if failure:
            row[FAILED_KEY] = failure
    write_atomically(rows_file, "".join(json.dumps(row) + "\n" for row in rows).encode(), OUTPUT_MODE)
    shutil.rmtree(workdir, ignore_errors=True)
    return rows


class ProgressLine:
    """One line on stderr: the phase, runs done of all, elapsed time and what is running; redrawn in place on a
    terminal, a line per change elsewhere."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.started = time.monotonic()
        self.shown = ""

    def show(self, phase: str, done: int, total: int, running: list[str]) -> None:
        """Draw the line: `done` of `total` runs of `phase` finished, `running` the names of those running.

        Args:
            phase: tune or final.
            done: runs of the phase finished.
            total: runs of the phase in all.
            running: the names of the runs running now (empty: none).
        """
        text = f"compare: {phase} {done}/{total} runs | {clock_text(time.monotonic() - self.started)} elapsed"
        text += f" | running {', '.join(running)}" if running else ""
        if self.live:
            self.stream.write(f"{CLEAR_LINE}{text}")
        elif text != self.shown:
            self.stream.write(f"{text}\n")
        self.shown = text
        self.stream.flush()

    def close(self) -> None:
        """End a live line, so that what follows starts on a line of its own."""
        if self.live and self.shown:
            self.stream.write("\n")
            self.stream.flush()


def run_jobs(
    jobs: list[Job], spec: CompareSpec, phase: str, progress: ProgressLine, runner: Callable[..., Any] = run_job
) -> dict[str, list[dict[str, Any]]]:
    """Every job's rows by name: those finished before are read, the others run, `spec.parallel` at a time (each
    in a subprocess when more than one).

    Args:
        jobs: the phase's federations.
        spec: the comparison: its out folder, clients and `parallel`.
        phase: tune or final, for the progress line.
        progress: the line that shows how far the phase is.
        runner: runs one job, as `run_job(job, clients, out)`; with `parallel` > 1 it must be picklable (it runs in a
            spawned process).

    Returns:
        Job name -> its rows, for every job.
    """
    rows = {job.name: found for job in jobs if (found := finished_rows(job, spec.out)) is not None}
    pending = [job for job in jobs if job.name not in rows]
    progress.show(phase, len(rows), len(jobs), [])
    if spec.parallel <= 1:
        for job in pending:
            progress.show(phase, len(rows), len(jobs), [job.name])
            rows[job.name] = runner(job, spec.clients, spec.out)
        progress.show(phase, len(rows), len(jobs), [])
        return rows
    with ProcessPoolExecutor(max_workers=spec.parallel, mp_context=get_context("spawn")) as pool:
        running: dict[Future, Job] = {}
        while pending or running:
            while pending and len(running) < spec.parallel:
                job = pending.pop(0)
                running[pool.submit(runner, job, spec.clients, spec.out)] = job
            progress.show(phase, len(rows), len(jobs), [job.name for job in running.values()])
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                rows[running.pop(future).name] = future.result()
    progress.show(phase, len(rows), len(jobs), [])
    return rows


# ---- reading the rows ------------------------------------------------------------------------------------------------


def own_value(row: dict[str, Any], key: str) -> float | None:
    """`key` at the strategy's own predictive: the ensemble's value where the row has one.

    Args:
        row: a round's row.
        key: the metric's name (accuracy, nll, ece, ...).

    Returns:
        The row's `<key>_ensemble` where it is not None, else its `key`; None where it has neither.
    """
    ensemble = row.get(f"{key}_ensemble")
    return ensemble if ensemble is not None else row.get(key)


def tail_mean(rows: list[dict[str, Any]], key: str, count: int = TAIL_ROUNDS) -> float | None:
    """The mean of `key` (own_value) over the last `count` rows that have it; None when none has.

    Args:
        rows: a run's rows, in round order.
        key: the metric's name.
        count: how many of the last rows that have it; at least 1.

    Returns:
        The mean, or None.
    """
    values = [value for row in rows if (value := own_value(row, key)) is not None][-count:]
    return statistics.fmean(values) if values else None


def client_tail(rows: list[dict[str, Any]], key: str, count: int = TAIL_ROUNDS) -> float | None:
    """A per-client key (CLIENT_KEYS) over the run's end: each client's mean over its own last `count` held-out
    evaluations (the rows' client_metrics), then the mean or the worst of those over the clients; a strategy that
    trains one client a round is so read at each client's last turns.

    Args:
        rows: a run's rows.
        key: client_<metric>_mean or client_<metric>_worst, the metric one of accuracy, nll, ece.
        count: the evaluations of each client to average.

    Returns:
        The value, or None when no row holds client metrics.
    """
    from fedbayes.server.client_metrics import WORST

    metric, summary = key.removeprefix("client_").rsplit("_", 1)
    per_client: dict[str, list[float]] = {}
    for row in rows:
        for client, entry in (row.get("client_metrics") or {}).items():
            if entry.get(metric) is not None:
                per_client.setdefault(client, []).append(entry[metric])
    if not per_client:
        return None
    values = [statistics.fmean(own[-count:]) for own in per_client.values()]
    return statistics.fmean(values) if summary == "mean" else WORST[metric](values)


def best_point(scores: list[float | None]) -> int:
    """The point with the best score, a tie going to the earlier point; a point without one never wins unless no
    point has one.

    Args:
        scores: each point's score (higher is better; None: the run evaluated no round); not empty.

    Returns:
        The winning point's index.
    """
    ranked = [(-math.inf if score is None else score, -point) for point, score in enumerate(scores)]
    return -max(ranked)[1]


def failed(rows: list[dict[str, Any]]) -> str | None:
    """The server's reason where it failed the run (FAILED_KEY), else None.

    Args:
        rows: a run's rows.

    Returns:
        The reason, or None.
    """
    return next((row[FAILED_KEY] for row in rows if row.get(FAILED_KEY)), None)


def tuning_scores(runs: list[list[dict[str, Any]]]) -> list[float | None]:
    """Each grid point's score, its validation accuracy (tail_mean); a point whose run the server failed has none
    while another point's run did not fail, so that a diverged setting never wins.

    Args:
        runs: each point's tuning rows, in point order.

    Returns:
        The scores, for best_point.
    """
    scores = [tail_mean(rows, "accuracy") for rows in runs]
    if all(failed(rows) for rows in runs):
        return scores
    return [None if failed(rows) else score for rows, score in zip(runs, scores)]


def spread(values: list[float]) -> dict[str, float] | None:
    """Mean and sample standard deviation (0 for one value); None for no values.

    Args:
        values: one value per seed.

    Returns:
        {"mean": ..., "sd": ...}, or None.
    """
    if not values:
        return None
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


# ---- the report ------------------------------------------------------------------------------------------------------


def summarise(
    spec: CompareSpec,
    grid: dict[str, list[dict[str, Any]]],
    tuned: dict[str, list[dict[str, Any]]],
    finals: dict[str, list[list[dict[str, Any]]]],
    winners: dict[str, int],
) -> dict[str, Any]:
    """summary.json: the protocol, every grid point's validation score, and each winner's test metrics.

    Args:
        spec: the comparison.
        grid: per strategy its points.
        tuned: the tuning runs' rows by job name (tune-<strategy>-p<point>); none for a grid of one point.
        finals: per strategy its final runs' rows, seed by seed.
        winners: per strategy its winning point.

    Returns:
        {"protocol": ..., "strategies": ...}, plain JSON values; a winner's test metrics hold, per key some seed's rows
        have, the per-seed values and their mean and sd.
    """
    strategies = {}
    for strategy in spec.strategies:
        points = []
        for point, settings in enumerate(grid[strategy]):
            rows = tuned.get(f"tune-{strategy}-p{point}", [])  # a one-point grid: not tuned, no score
            points.append(
                {
                    "settings": settings,
                    "validation_accuracy": tail_mean(rows, "accuracy"),
                    "validation_nll": tail_mean(rows, "nll"),
                    "failed": failed(rows),
                }
            )
        runs = finals[strategy]
        metrics = {}
        for key in (*METRICS, *UNCERTAINTY_KEYS, *CLIENT_KEYS):
            read = client_tail if key in CLIENT_KEYS else tail_mean
            per_seed = [value for rows in runs if (value := read(rows, key)) is not None]
            if per_seed:
                metrics[key] = {"per_seed": per_seed, **(spread(per_seed) or {})}
        strategies[strategy] = {
            "rounds_per_round": load_budget().rounds_per_round(strategy, spec.clients),
            "winner": winners[strategy],
            "settings": grid[strategy][winners[strategy]],
            "grid": points,
            "seeds": len(runs),
            "failed_seeds": {str(seed): reason for seed, rows in enumerate(runs) if (reason := failed(rows))},
            "test": metrics,
        }
    return {
        "protocol": {
            "dataset": spec.dataset,
            "clients": spec.clients,
            "fraction": spec.fraction,
            "split": spec.split,
            "rounds": spec.rounds,
            "seeds": list(range(spec.seeds)),
            "grid": spec.grid,
            "validation_share": VALIDATION_SHARE,
            "tuning_seed": spec.tuning_seed,
            "score": f"validation accuracy, own predictive, mean over the last {TAIL_ROUNDS} evaluated rounds",
            "budget": "equal client work: a strategy of one client a round runs `rounds_per_round` rounds for each "
            "of the others'; a particle strategy's SVGD steps are local-epochs epochs of the mean client's minibatches",
            "set": spec.overrides,
            "engine": ENGINE,
        },
        "strategies": strategies,
    }


def table_columns(summary: dict[str, Any]) -> list[str]:
    """accuracy, NLL and ECE, then each uncertainty and per-client key some strategy's rows hold.

    Args:
        summary: the summary (`summarise`).

    Returns:
        The metric keys, in the table's order.
    """
    held = {key for entry in summary["strategies"].values() for key in entry["test"]}
    return [*METRICS, *(key for key in (*UNCERTAINTY_KEYS, *CLIENT_KEYS) if key in held)]


def table_cells(summary: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The table's header and, per strategy, its cells: settings, each column's mean ± sd ("-": none), seeds.

    Args:
        summary: the summary (`summarise`).

    Returns:
        The header row, and one row of cells per strategy, in the summary's order.
    """
    columns = table_columns(summary)
    header = ["strategy", "settings", *(HEADINGS[key] for key in columns), "seeds"]
    body = []
    for strategy, entry in summary["strategies"].items():
        settings = ", ".join(f"{key}={value}" for key, value in entry["settings"].items())
        cells = []
        for key in columns:
            value = entry["test"].get(key)
            cells.append("-" if value is None else f"{value['mean']:.4f} ± {value['sd']:.4f}")
        seeds = str(entry["seeds"]) + (f" ({len(entry['failed_seeds'])} failed)" if entry["failed_seeds"] else "")
        body.append([strategy, settings, *cells, seeds])
    return header, body


def markdown_table(summary: dict[str, Any]) -> str:
    """table.md: the winners' test metrics, mean ± sd over the seeds.

    Args:
        summary: the summary (`summarise`).

    Returns:
        The Markdown text: a heading, the protocol in a sentence, the table; it ends with a newline.
    """
    header, body = table_cells(summary)
    protocol = summary["protocol"]
    if any(len(entry["grid"]) > 1 for entry in summary["strategies"].values()):
        point = (
            f"Each strategy at the point of the `{protocol['grid']}` grid with the best {protocol['score']} (the "
            f"clients' data less {protocol['validation_share']:.0%} each, seed {protocol['tuning_seed']}); then that "
            "point"
        )
    else:
        point = f"Each strategy at the one point of the `{protocol['grid']}` grid, nothing tuned"
    lines = [
        f"# fedbayes compare: {protocol['dataset']}, {protocol['clients']} clients, {protocol['rounds']} rounds",
        "",
        f"{point} on seed{'s' if len(protocol['seeds']) > 1 else ''} {', '.join(map(str, protocol['seeds']))} and "
        f"the test set: mean ± sd over the seeds of each "
        f"seed's mean over its last {TAIL_ROUNDS} evaluated rounds. Engine: {protocol['engine']}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]
    return "\n".join(lines) + "\n"


def terminal_table(summary: dict[str, Any]) -> str:
    """The table as aligned plain text, for the terminal.

    Args:
        summary: the summary (`summarise`).

    Returns:
        The header and one line per strategy, columns padded with spaces; no trailing newline.
    """
    header, body = table_cells(summary)
    widths = [max(len(row[index]) for row in (header, *body)) for index in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in (header, *body))


def mean_curve(runs: list[list[dict[str, Any]]], key: str) -> tuple[list[int], list[float]]:
    """`key` (own_value) per round, the mean over the runs that have it that round.

    Args:
        runs: each run's rows.
        key: the metric.

    Returns:
        The rounds that have it, and its mean in each.
    """
    rounds = sorted({row["round"] for rows in runs for row in rows})
    points = []
    for number in rounds:
        values = [
            v for rows in runs for row in rows if row["round"] == number and (v := own_value(row, key)) is not None
        ]
        if values:
            points.append((number, statistics.fmean(values)))
    return [number for number, _ in points], [value for _, value in points]


def plot_curves(
    finals: dict[str, list[list[dict[str, Any]]]], path: Path, rounds_per_round: dict[str, int] | None = None
) -> None:
    """Test accuracy, NLL and ECE per round of client work, each strategy's mean over its seeds (own predictive).

    Args:
        finals: per strategy its seeds' rows.
        path: the figure's file.
        rounds_per_round: per strategy its rounds in one round of client work (Budget.rounds_per_round; default 1).
    """
    from fedbayes.tasks.report import colour, integer_rounds, new_figure, save_figure

    scale = rounds_per_round or {}
    figure, axes = new_figure(len(METRICS), share_y=False)
    for axis, key in zip(axes[0], METRICS):
        for index, (strategy, runs) in enumerate(finals.items()):
            rounds, values = mean_curve(runs, key)
            work = [number / scale.get(strategy, 1) for number in rounds]
            axis.plot(work, values, "o-", markersize=3, color=colour(index), label=f"{strategy} ({len(runs)} seeds)")
        axis.set_title(f"test {HEADINGS[key]} (mean over seeds)")
        integer_rounds(axis)
        axis.set_xlabel("round of client work")
    axes[0][0].legend(fontsize="small")
    save_figure(figure, path)


def plot_reliability(finals: dict[str, list[list[dict[str, Any]]]], path: Path) -> None:
    """Each strategy's seed-0 run, its last evaluated round (tasks/report.py's reliability diagram).

    Args:
        finals: per strategy its seeds' rows; every strategy has a seed 0.
        path: the figure's file.

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    from fedbayes.tasks.report import Run
    from fedbayes.tasks.report import plot_reliability as draw

    draw([Run(f"{strategy} seed 0", strategy, runs[0], None) for strategy, runs in finals.items()], path)


def plot_uncertainty(summary: dict[str, Any], path: Path) -> None:
    """The uncertainty metrics the rows hold, per strategy, mean ± sd over the seeds.

    Args:
        summary: the summary (`summarise`).
        path: the figure's file (a placeholder panel where no strategy has an uncertainty metric).

    Raises:
        MissingExtra: matplotlib is not installed.
    """
    from fedbayes.tasks.report import colour, new_figure, save_figure

    keys = [key for key in UNCERTAINTY_KEYS if any(key in entry["test"] for entry in summary["strategies"].values())]
    figure, axes = new_figure(max(1, len(keys)), share_y=False)
    if not keys:
        axes[0][0].text(0.5, 0.5, "no uncertainty metrics\nin these runs' rows", ha="center", va="center", color="grey")
        axes[0][0].set_axis_off()
    strategies = list(summary["strategies"])
    for axis, key in zip(axes[0], keys):
        for index, strategy in enumerate(strategies):
            value = summary["strategies"][strategy]["test"].get(key)
            if value is not None:
                axis.bar(index, value["mean"], yerr=value["sd"], color=colour(index), capsize=4)
        axis.set_xticks(range(len(strategies)), strategies, rotation=30)
        axis.set_title(HEADINGS[key])
        axis.set_ylim(0, 1)
    save_figure(figure, path)


def write_report(
    summary: dict[str, Any], finals: dict[str, list[list[dict[str, Any]]]], out: Path, say: Callable[[str], None]
) -> list[Path]:
    """summary.json, table.md and, where matplotlib is installed, the figures; the files written.

    Args:
        summary: the summary (`summarise`).
        finals: per strategy its seeds' rows, for the figures.
        out: the comparison's folder; the files go directly in it.
        say: prints the line that says why there are no figures.

    Returns:
        The paths written: summary.json and table.md, then the figures where they were drawn.
    """
    from fedbayes.tasks.report import MissingExtra

    written = [out / SUMMARY_FILE, out / TABLE_FILE]
    write_atomically(written[0], (json.dumps(summary, indent=1) + "\n").encode(), OUTPUT_MODE)
    write_atomically(written[1], markdown_table(summary).encode(), OUTPUT_MODE)
    try:
        scale = {strategy: entry["rounds_per_round"] for strategy, entry in summary["strategies"].items()}
        plot_curves(finals, out / PLOT_FILES[0], scale)
        plot_reliability(finals, out / PLOT_FILES[1])
        plot_uncertainty(summary, out / PLOT_FILES[2])
    except MissingExtra as error:
        say(f"no figures: {error}")
        return written
    return [*written, *(out / name for name in PLOT_FILES)]


# ---- the command -----------------------------------------------------------------------------------------------------


def validation_dataset(spec: CompareSpec, base_config: dict[str, Any]) -> str:
    """The tuning dataset, npz:<out>/validation, carved from the clients' training data as seed 0's run gives it to
    them (made once; made again when the federation asked for differs).

    Args:
        spec: the comparison: its clients and out folder.
        base_config: a run config of the real dataset (seed 0); what makes the split, and what it is recorded against.

    Returns:
        The dataset value of a tuning run, `npz:<absolute folder>`.

    Raises:
        ValueError: `base_config` is refused (`check_run_config`).
    """
    from fedbayes.client.runtime import NodeSettings, load_client_data
    from fedbayes.tasks.validation import write_validation_folder

    folder = (spec.out / VALIDATION).resolve()
    source = {key: value for key, value in base_config.items() if key not in UNTRACKED_KEYS}
    source = json.loads(json.dumps({**source, "clients": spec.clients, "share": VALIDATION_SHARE}))
    record = folder / "source.json"
    try:
        if json.loads(record.read_text()) == source:
            return f"npz:{folder}"
    except (OSError, ValueError):
        pass  # not made yet, or not to the end
    shutil.rmtree(folder, ignore_errors=True)
    settings = check_run_config(base_config, spec.clients)
    clients = [
        load_client_data(settings.data, NodeSettings(f"client-{index}", index, spec.clients, "", "", "cpu"))
        for index in range(spec.clients)
    ]
    write_validation_folder(folder, clients, VALIDATION_SHARE, spec.tuning_seed)
    write_atomically(record, json.dumps(source).encode(), OUTPUT_MODE)  # last: the folder is whole
    return f"npz:{folder}"


def mean_client_examples(dataset: str, clients: int) -> float:
    """The mean client's training examples: what it keeps of its data in the validation split, as many as it trains
    on in the final runs, which hold out the same share.

    Args:
        dataset: the validation split as npz:DIR (`validation_dataset`).
        clients: the federation's clients.

    Returns:
        The mean over the clients of client-<i>.npz's rows.
    """
    from fedbayes.tasks.npzdata import client_file, read_header

    folder = Path(dataset.removeprefix("npz:"))
    return sum(read_header(client_file(folder, index)).rows for index in range(clients)) / clients


def compare(
    spec: CompareSpec, say: Callable[[str], None] = print, progress: ProgressLine | None = None
) -> dict[str, Any]:
    """Tune, run the winners over the seeds, and write the report (module docstring).

    Args:
        spec: the federation, strategies and protocol.
        say: prints a line for the user.
        progress: the progress line (default: on stderr).

    Returns:
        The summary (summary.json).

    Raises:
        ValueError: an unknown strategy or grid, or a run config a run would refuse (before anything runs).
    """
    grid = load_grid(spec.grid)
    check_strategies(spec.strategies, grid, spec.grid)
    if spec.seeds < 1 or spec.rounds < 1 or spec.parallel < 1:
        raise ValueError("--seeds, --rounds and --parallel must be >= 1")
    options = [f"{key} (that is {option})" for key, option in OPTION_KEYS.items() if key in spec.overrides]
    if options:
        raise ValueError(f"--set {', '.join(options)}: give it as the option")
    tuned_keys = sorted({key for strategy in spec.strategies for point in grid[strategy] for key in point})
    clash = [key for key in tuned_keys if key in spec.overrides]
    if clash:
        raise ValueError(f"--set {', '.join(clash)}: the {spec.grid} grid tunes it; leave it to the grid")
    budget = load_budget()
    for strategy in spec.strategies:
        clash = sorted(set(budget.keys(strategy, spec.clients, 1)) & set(spec.overrides))
        if clash:
            raise ValueError(
                f"--set {', '.join(clash)}: the comparison sets it for {strategy}, to make client work equal"
            )
    if HELD_OUT_KEY in spec.overrides:
        raise ValueError(
            f"--set {HELD_OUT_KEY}: the comparison sets it (the final runs' clients hold out their validation share)"
        )
    for strategy in spec.strategies:  # every point against the real data: what a run would refuse, refused now
        for settings in grid[strategy]:
            check_run_config(
                job_config(spec, strategy, settings, 0, spec.dataset, None, VALIDATION_SHARE), spec.clients
            )
    say(f"compare: engine {ENGINE}; the runs' rows go to {spec.out / RUNS}")
    progress = progress or ProgressLine()
    try:
        first = spec.strategies[0]
        base = job_config(spec, first, {}, spec.tuning_seed, spec.dataset)
        dataset = validation_dataset(spec, base)
        steps = epoch_steps(check_run_config(base, spec.clients), mean_client_examples(dataset, spec.clients))
        to_tune = {strategy: grid[strategy] for strategy in spec.strategies if len(grid[strategy]) > 1}
        tuned = run_jobs(tuning_jobs(spec, to_tune, dataset, steps), spec, "tune", progress) if to_tune else {}
        winners = {
            strategy: best_point(tuning_scores([tuned[f"tune-{strategy}-p{point}"] for point in range(len(points))]))
            for strategy, points in to_tune.items()
        }
        winners = {strategy: winners.get(strategy, 0) for strategy in spec.strategies}
        rows = run_jobs(final_jobs(spec, grid, winners, steps), spec, "final", progress)
    finally:
        progress.close()
    finals = {
        strategy: [rows[f"final-{strategy}-s{seed}"] for seed in range(spec.seeds)] for strategy in spec.strategies
    }
    summary = summarise(spec, grid, tuned, finals, winners)
    written = write_report(summary, finals, spec.out, say)
    shutil.rmtree(spec.out / WORK, ignore_errors=True)
    say(terminal_table(summary))
    say(f"wrote {', '.join(str(path) for path in written)}")
    return summary


def run(args) -> int:
    """`fedbayes compare` as parsed.

    Args:
        args: the parsed command line (deploy/cli.py): dataset, clients, strategies (comma-separated), rounds, seeds,
            out, grid, fraction, split, set, data_root and parallel.

    Returns:
        0 (a failure raises).

    Raises:
        ValueError: a bad `--set`, or what `compare` refuses.
    """
    from fedbayes.deploy.launcher import parse_override
    from fedbayes.tasks.npzdata import NPZ_PREFIX, npz_folder

    overrides = dict(parse_override(item) for item in args.set)
    if args.data_root:
        overrides["data-root"] = str(Path(args.data_root).resolve())
    folder = npz_folder(args.dataset)
    spec = CompareSpec(
        dataset=f"{NPZ_PREFIX}{folder.resolve()}" if folder is not None else args.dataset,
        clients=args.clients,
        strategies=tuple(name.strip() for name in args.strategies.split(",") if name.strip()),
        rounds=args.rounds,
        seeds=args.seeds,
        out=args.out.resolve(),
        grid=args.grid,
        fraction=args.fraction,
        split=args.split,
        overrides=overrides,
        parallel=args.parallel,
    )
    compare(spec)
    return 0
