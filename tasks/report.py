"""`fedbayes report RUN [RUN ...] --out DIR`: plots of federations' results rows and a one-page index of them.

A RUN is a `fedbayes local` workdir (its results file and the run config it was submitted with,
deploy/launcher.py) or a results file (.jsonl, one row per round, server/loop.py), finished or still being
written. A results file that holds several federations (results-exists=append: the rounds start again at 1) gives
one run per federation. Every figure shows every run, side by side:

- metrics.png: accuracy, NLL and ECE of the global model per round (the `*_ensemble` metrics dashed);
- reliability.png: each run's last round as a reliability diagram, from the row's per-bin data (`reliability`,
  bayes/metrics.py);
- clients.png: replies accepted and rejected, work sent, and nodes quarantined, per round; where the rows carry the
  clients' held-out metrics (run config `client-eval-fraction`, server/client_metrics.py), each client's accuracy,
  NLL and ECE per round below, with their mean and the worst client's;
- phases.png: where each round's time went, the server's phases and the clients' medians (docs/architecture.md,
  the data path of one round);
- index.html: the figures, each run's summary (its last evaluated round's accuracy, NLL, ECE and uncertainty
  metrics: misclassification and OOD AUROC, selective accuracy) and settings (its run config; "settings unknown"
  for a bare results file), and each client's held-out metrics in the last round that has them.

Figures are drawn with matplotlib's Agg renderer into files (no display, no pyplot state: the ServerApp's tracking,
server/tracking.py, draws them on its own thread). matplotlib is the optional extra fedbayes[report].
"""

from __future__ import annotations

import html
import importlib
import io
import json
import math
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedbayes.tasks.storage import MAX_LINE_BYTES, OUTPUT_MODE, complete_lines, write_atomically

REQUIRED_KEYS = ("round", "accuracy", "nll", "ece")  # what a row needs to be drawn at all (None: not evaluated)
METRICS = (("accuracy", "accuracy"), ("nll", "NLL"), ("ece", "ECE"))
# What a predictive's uncertainty is for (posterior/uncertainty.py uncertainty_metrics), each null where undefined,
# and the `_mi` ones only where the predictive has more than one member.
UNCERTAINTY_METRICS = (
    "misclassification_auroc",
    "misclassification_auroc_mi",
    "ood_auroc",
    "ood_auroc_mi",
    "selective_accuracy_80",
)
# The clients' held-out metrics (server/client_metrics.py): of the global model, and of each client's own posterior
# after training (`_local`), with how each is drawn.
CLIENT_PARTS = (("", "global model", "-"), ("_local", "own posterior", ":"))
# The server's phases of a round (server/loop.py) in the order they happen. first_reply and last_reply are both
# counted from the push, so the bar shows last_reply - first_reply as "first to last reply".
SERVER_PHASES = (
    ("wait_clients", "wait for clients"),
    ("configure", "configure"),
    ("push", "push"),
    ("first_reply", "push to first reply"),
    ("last_reply", "first to last reply"),
    ("previous_round", "previous round (not hidden)"),
    ("aggregate", "aggregate"),
    ("evaluate", "evaluate"),
    ("previous_checkpoint", "previous checkpoint"),
)
COLUMN_INCHES = 5.0  # the width of one run's panel
FEW_EXAMPLES = 0.01  # a reliability bin with fewer than this share of the examples is drawn pale
DPI = 100


class ReportError(ValueError):
    """A RUN cannot be reported: the message names the path and what is wrong with it."""


class MissingExtra(RuntimeError):
    """An optional dependency is not installed: the message names the extra that brings it."""


@dataclass(frozen=True)
class Run:
    """One federation's results: its rows in round order, and the run config it was submitted with (None: unknown)."""

    name: str
    source: str  # where its rows came from
    rows: list[dict[str, Any]]
    settings: dict[str, Any] | None


@dataclass(frozen=True)
class Plot:
    """One figure of the report: its file, its heading in the index, and what draws it."""

    file: str
    title: str
    draw: Callable[[Sequence[Run], Path], None]
    note: str = ""  # how to read it, under its heading in the index


def import_extra(module: str, extra: str, needed_by: str):
    """`module`, imported, or MissingExtra naming the pip extra that installs it.

    Args:
        module: the dotted module name ("matplotlib.figure").
        extra: the fedbayes extra that installs its package ("report").
        needed_by: what needs it, for the message ("fedbayes report").

    Returns:
        The module.

    Raises:
        MissingExtra: the module's top-level package is not installed.
        ModuleNotFoundError: the package is there but something it imports is not (re-raised as it is).
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module.partition(".")[0]:
            raise  # the module is there, but something it imports is broken: not a missing extra
        raise MissingExtra(
            f"{needed_by} needs {module.partition('.')[0]}, which is not installed: pip install 'fedbayes[{extra}]'"
        ) from None


# ---- reading runs ---------------------------------------------------------------------------------------------


def load_runs(paths: Sequence[Path | str]) -> list[Run]:
    """The runs the RUN arguments name, in order; names made unique (a second `x` is `x #2`).

    Args:
        paths: `fedbayes local` workdirs or results files (.jsonl).

    Returns:
        One run per federation of each path (load_run), in argument order.

    Raises:
        ReportError: a path cannot be reported (load_run).
    """
    runs = [run for path in paths for run in load_run(Path(path))]
    seen: Counter[str] = Counter()
    unique = []
    for run in runs:
        seen[run.name] += 1
        unique.append(run if seen[run.name] == 1 else replace(run, name=f"{run.name} #{seen[run.name]}"))
    return unique


def load_run(path: Path) -> list[Run]:
    """A workdir's or a results file's runs: one per federation its results file holds.

    Args:
        path: a `fedbayes local` workdir (its run config names the results file) or a results file.

    Returns:
        The runs, named after the workdir (or the file's stem), "NAME (k)" where the file holds several federations;
        a bare results file's runs have no settings.

    Raises:
        ReportError: `path` is neither, its results file is missing, holds no row yet or none that is usable, or the
            workdir's run config is missing or no TOML.
    """
    if path.is_dir():
        settings, results = workdir_run_config(path)
    elif path.is_file():
        settings, results = None, path
    else:
        raise ReportError(f"{path}: no such `fedbayes local` workdir or results file")
    if not results.is_file():
        raise ReportError(f"{path}: its results file {results} is not there (yet)")
    federations = split_federations(read_rows(results))
    if not federations:
        raise ReportError(f"{results} holds no results row yet")
    name = path.name if path.is_dir() else path.stem
    if len(federations) == 1:
        return [Run(name, str(path), federations[0], settings)]
    return [Run(f"{name} ({number})", str(path), rows, settings) for number, rows in enumerate(federations, 1)]


def workdir_run_config(workdir: Path) -> tuple[dict[str, Any], Path]:
    """The run config a `fedbayes local` workdir's federation was submitted with, and its results file.

    Args:
        workdir: a `fedbayes local` workdir.

    Returns:
        The run config, and its results-path (default: the workdir's results.jsonl).

    Raises:
        ReportError: the workdir has no run config, or it is no TOML.
    """
    from fedbayes.tasks.config import RUN_CONFIG_FILE

    config_file = workdir / RUN_CONFIG_FILE
    if not config_file.is_file():
        raise ReportError(
            f"{workdir} is no `fedbayes local` workdir: it has no {RUN_CONFIG_FILE} (a results .jsonl "
            "can be reported too)"
        )
    try:
        config = tomllib.loads(config_file.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ReportError(f"{config_file}: not TOML ({error})") from None
    return config, Path(config.get("results-path") or workdir / "results.jsonl")


def warn_on_stderr(message: str) -> None:
    """A results line the report leaves out, said on stderr.

    Args:
        message: the problem, naming file and line; printed after "warning: ".
    """
    print(f"warning: {message}", file=sys.stderr)


def read_rows(path: Path, warn: Callable[[str], None] = warn_on_stderr) -> list[dict[str, Any]]:
    """The usable rows of a results file in file order. The text after its last newline is a row still being written
    (or cut short by a crash): not a row yet.

    Args:
        path: the results file (JSON lines).
        warn: told, by file and line, of each line that holds no usable row (`parsed_row`), which is left out.

    Returns:
        The rows, in file order; blank lines are skipped.

    Raises:
        ReportError: naming the file, when none of its lines is usable.
        OSError: the file cannot be read.
    """
    rows, unusable = [], 0
    for entry in complete_lines(path):  # none read past MAX_LINE_BYTES, whatever the file holds
        number, line = entry.number, "" if entry.text is None else entry.text.decode(errors="replace")
        if entry.text is not None and not line.strip():
            continue
        row = f"over {MAX_LINE_BYTES} bytes, longer than any results row" if entry.text is None else parsed_row(line)
        if isinstance(row, str):
            unusable += 1
            warn(f"{path}:{number}: {row}; the report leaves this line out")
        else:
            rows.append(row)
    if unusable and not rows:
        raise ReportError(f"{path}: none of its {unusable} lines is a usable results row (each is named above)")
    return rows


def parsed_row(line: str) -> dict[str, Any] | str:
    """The results row a line of a results file holds, or why it holds none the report can draw.

    Args:
        line: one line of a results file, without its newline.

    Returns:
        The row; or the problem in words: not JSON, not an object, a required key missing, a field the report reads
        that is not what server/loop.py writes there, or accuracy, NLL and ECE not all numbers or all null.
    """
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        return f"not a JSON row ({error.msg})"
    if not isinstance(row, dict):
        return f"not a results row (a JSON {type(row).__name__}, not an object)"
    missing = [key for key in REQUIRED_KEYS if key not in row]
    if missing:
        return f"not a results row (no {', '.join(missing)})"
    for key, (usable, what) in ROW_FIELDS.items():
        if key in row and not usable(row[key]):
            return f"field {key!r} is {shown(row[key])}, not {what}"
    if len({row[key] is None for key, _ in METRICS}) > 1:
        return "accuracy, nll and ece must be numbers (an evaluated round) or null (a round not evaluated) together"
    return row


def shown(value: Any, limit: int = 60) -> str:
    """`value` as its JSON, cut to about `limit` characters.

    Args:
        value: any JSON value.
        limit: the most characters shown, >= 4.

    Returns:
        The JSON, or its first `limit` - 4 characters followed by " ...".
    """
    text = json.dumps(value)
    return text if len(text) <= limit else f"{text[: limit - 4]} ..."


def _number(value: Any) -> bool:
    """A finite JSON number; not true or false, which Python's json reads as ints."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _seconds(value: Any) -> bool:
    """A row's phase timings: names to seconds (null: a phase that did not run)."""
    return isinstance(value, dict) and all(seconds is None or _number(seconds) for seconds in value.values())


def _client_metrics(value: Any) -> bool:
    """A row's `client_metrics`: client id -> metric name -> a finite number."""
    return isinstance(value, dict) and all(
        isinstance(entry, dict) and all(map(_number, entry.values())) for entry in value.values()
    )


def _bins(value: Any) -> bool:
    """null, or reliability bins as bayes/metrics.py `reliability_bins` writes them: per bin its example count and,
    when it holds any, their mean confidence and accuracy."""
    if value is None:
        return True
    if not isinstance(value, dict):
        return False
    confidence, accuracy, count = (value.get(key) for key in ("confidence", "accuracy", "count"))
    if not (isinstance(confidence, list) and isinstance(accuracy, list) and isinstance(count, list)):
        return False
    return len(confidence) == len(accuracy) == len(count) > 0 and all(
        _count(n) and (not n or (_number(c) and _number(a))) for c, a, n in zip(confidence, accuracy, count)
    )


# What the report reads of a row, each key's check and what it must be (server/loop.py and server/evaluation.py
# write them): a row whose value fails is left out, so no figure or summary line meets a value it cannot draw.
ROW_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "round": (lambda value: type(value) is int and value >= 1, "a round number (an integer >= 1)"),
    **{key: (lambda value: value is None or _number(value), "a finite number or null") for key, _ in METRICS},
    **{f"{key}_ensemble": (_number, "a finite number") for key, _ in METRICS},
    **{key: (_number, "a finite number") for key in ("round_seconds", "wall_seconds", "eval_fraction")},
    **{
        key: (_count, "a count (an integer >= 0)")
        for key in ("clients", "clients_sent", "clients_rejected", "eval_examples")
    },
    "quarantined": (lambda value: isinstance(value, list), "a list of nodes"),
    "phase_seconds": (_seconds, "an object of seconds"),
    "client_phase_seconds": (
        lambda value: isinstance(value, dict) and all(map(_number, value.values())),
        "an object of seconds",
    ),
    **{key: (_bins, "null or reliability bins") for key in ("reliability", "reliability_ensemble")},
    **{
        f"{key}{suffix}": (lambda value: value is None or _number(value), "a finite number or null")
        for key in UNCERTAINTY_METRICS
        for suffix in ("", "_ensemble")
    },
    "ood_inputs": (lambda value: value is None or isinstance(value, str), "a name or null"),
    "client_metrics": (_client_metrics, "an object of each client's metrics (finite numbers)"),
    **{
        f"client_{key}{suffix}_{summary}": (lambda value: value is None or _number(value), "a finite number or null")
        for key, _ in METRICS
        for suffix, _, _ in CLIENT_PARTS
        for summary in ("mean", "worst")
    },
}


def split_federations(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows split where the rounds start again: a new federation appended to the file (a resume never repeats a
    round, server/loop.py ResultsLog drops the rows after its checkpoint).

    Args:
        rows: results rows in file order, each with a "round".

    Returns:
        One list of rows per federation, in file order; none for no rows.
    """
    federations: list[list[dict[str, Any]]] = []
    for row in rows:
        if not federations or row["round"] <= federations[-1][-1]["round"]:
            federations.append([])
        federations[-1].append(row)
    return federations


# ---- figures ----------------------------------------------------------------------------------------------------


def new_figure(columns: int, rows: int = 1, height: float = 4.0, share_y: bool = True):
    """A matplotlib Figure (Agg, no pyplot) with `rows` x `columns` axes (a 2-D array).

    Args:
        columns: axes per row, one per run; each COLUMN_INCHES wide.
        rows: rows of axes.
        height: the height of one row, in inches.
        share_y: share the y axis along each row.

    Returns:
        The figure and its axes, an array of shape (rows, columns).

    Raises:
        MissingExtra: matplotlib (fedbayes[report]) is not installed.
    """
    figure_module = import_extra("matplotlib.figure", "report", "fedbayes report")
    figure = figure_module.Figure(figsize=(COLUMN_INCHES * columns, height * rows), layout="constrained")
    return figure, figure.subplots(rows, columns, sharey="row" if share_y else False, squeeze=False)


def save_figure(figure, path: Path) -> None:
    """`figure` as a PNG at `path`, replacing a file there atomically (a reader never sees half an image).

    Args:
        figure: a matplotlib Figure.
        path: the PNG to write, at DPI dots per inch.
    """
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    write_atomically(path, buffer.getvalue(), OUTPUT_MODE)


def colour(index: int) -> str:
    """The run's colour, the same in every figure.

    Args:
        index: the run's position, >= 0.

    Returns:
        One of matplotlib's ten cycle colours, "C0" .. "C9", repeating after ten.
    """
    return f"C{index % 10}"


def integer_rounds(axis, integer_y: bool = False) -> None:
    """Label `axis`'s x axis as rounds, with integer ticks, and draw a light grid.

    Args:
        axis: a matplotlib Axes.
        integer_y: give the y axis integer ticks too (counts).
    """
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    if integer_y:
        axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("round")
    axis.grid(alpha=0.3)


def no_data(axis, what: str) -> None:
    """Say in the middle of an empty panel what the run's rows lack.

    Args:
        axis: a matplotlib Axes.
        what: what is missing ("evaluated round"), shown as "no WHAT in this run's rows".
    """
    axis.text(
        0.5, 0.5, f"no {what} in this run's rows", ha="center", va="center", transform=axis.transAxes, color="grey"
    )


def evaluated_rows(run: Run) -> list[dict[str, Any]]:
    """The rows with test metrics: not those of rounds the server did not evaluate (run config `eval-every`).

    Args:
        run: a run whose rows parsed_row accepted.

    Returns:
        The rows whose accuracy is not None, in order.
    """
    return [row for row in run.rows if row["accuracy"] is not None]


def plot_metrics(runs: Sequence[Run], path: Path) -> None:
    """Draw metrics.png: accuracy, NLL and ECE per evaluated round, one panel per metric, every run in each (the
    ensemble's dashed).

    Args:
        runs: the runs to draw, each in its colour (`colour`), in every panel.
        path: the PNG to write, replaced atomically.

    Raises:
        MissingExtra: matplotlib (fedbayes[report]) is not installed.
    """
    figure, axes = new_figure(len(METRICS), share_y=False)
    for axis, (key, label) in zip(axes[0], METRICS):
        for index, run in enumerate(runs):
            rows = evaluated_rows(run)
            rounds = [row["round"] for row in rows]
            axis.plot(rounds, [row[key] for row in rows], "o-", markersize=3, color=colour(index), label=run.name)
            ensemble = [row.get(f"{key}_ensemble") for row in rows]
            if any(value is not None for value in ensemble):
                axis.plot(
                    rounds,
                    [math.nan if value is None else value for value in ensemble],
                    "s--",
                    markersize=3,
                    color=colour(index),
                    label=f"{run.name} ensemble",
                )
        axis.set_title(label)
        integer_rounds(axis)
    axes[0][0].legend(fontsize="small")
    save_figure(figure, path)


def plot_reliability(runs: Sequence[Run], path: Path) -> None:
    """Draw reliability.png: each run's last evaluated round as a reliability diagram (the ensemble's as points).

    Args:
        runs: the runs to draw, one panel (column) each, in order.
        path: the PNG to write, replaced atomically.

    Raises:
        MissingExtra: matplotlib (fedbayes[report]) is not installed.
    """
    figure, axes = new_figure(len(runs))
    for index, (axis, run) in enumerate(zip(axes[0], runs)):
        axis.plot([0, 1], [0, 1], ":", color="grey", label="calibrated")
        evaluated = evaluated_rows(run)
        if not evaluated:
            no_data(axis, "evaluated round")
            axis.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title=run.name)
            continue
        last = evaluated[-1]
        bar_legend = []
        if last.get("reliability"):
            bar_legend = reliability_bars(axis, last["reliability"], colour(index))
        else:
            no_data(axis, "per-bin data (rows written before fedbayes kept them)")
        if last.get("reliability_ensemble"):
            bins = last["reliability_ensemble"]
            points = [(c, a) for c, a in zip(bins["confidence"], bins["accuracy"]) if c is not None]
            axis.plot(*zip(*points), "s", color="black", markersize=4, label="ensemble (accuracy at mean confidence)")
        axis.set(
            xlim=(0, 1),
            ylim=(0, 1),
            xlabel="confidence",
            ylabel="accuracy",
            title=f"{run.name}: round {last['round']}, ECE {last['ece']:.4f}",
        )
        axis.legend(handles=[*axis.get_legend_handles_labels()[0], *bar_legend], fontsize="small", loc="upper left")
    save_figure(figure, path)


def reliability_bars(axis, bins: dict[str, list], bar_colour: str) -> list:
    """Accuracy per confidence bin as bars, and the gap to the bin's mean confidence hatched (Guo et al., 2017). A bin
    with few examples says little: bars of bins with under FEW_EXAMPLES of them are pale.

    Args:
        axis: a matplotlib Axes, confidence and accuracy in [0, 1].
        bins: a row's `reliability`: per bin its "confidence", "accuracy" and "count", bins equally wide over [0, 1];
            empty bins are not drawn.
        bar_colour: the run's colour.

    Returns:
        The legend handles of the bars and of the gap.
    """
    from matplotlib.patches import Patch

    width, total = 1.0 / len(bins["count"]), sum(bins["count"])
    for number, (confidence, accuracy, count) in enumerate(zip(bins["confidence"], bins["accuracy"], bins["count"])):
        if not count:
            continue
        centre, few = (number + 0.5) * width, count < FEW_EXAMPLES * total
        axis.bar(centre, accuracy, width, color=bar_colour, alpha=0.3 if few else 1.0, edgecolor="black", linewidth=0.5)
        axis.bar(
            centre,
            confidence - accuracy,
            width,
            bottom=accuracy,
            color="none",
            edgecolor="tab:red",
            hatch="//",
            linewidth=0.5,
        )
    return [
        Patch(facecolor=bar_colour, edgecolor="black", label=f"accuracy (pale: < {FEW_EXAMPLES:.0%} of the examples)"),
        Patch(facecolor="none", edgecolor="tab:red", hatch="//", label="gap to mean confidence"),
    ]


def client_rows(run: Run) -> list[dict[str, Any]]:
    """The rows with the clients' held-out metrics (run config `client-eval-fraction`).

    Args:
        run: a run.

    Returns:
        The rows that hold `client_metrics`, in order.
    """
    return [row for row in run.rows if "client_metrics" in row]


def plot_clients(runs: Sequence[Run], path: Path) -> None:
    """Draw clients.png: replies accepted and rejected, work sent and nodes quarantined per round; below, where the rows
    have them, each client's held-out accuracy, NLL and ECE.

    Args:
        runs: the runs to draw, one panel (column) each, in order.
        path: the PNG to write, replaced atomically.

    Raises:
        MissingExtra: matplotlib (fedbayes[report]) is not installed.
    """
    with_metrics = any(client_rows(run) for run in runs)
    figure, axes = new_figure(len(runs), rows=1 + len(METRICS) * with_metrics)
    if with_metrics:
        for row_axes, (key, label) in zip(axes[1:], METRICS):
            for index, (axis, run) in enumerate(zip(row_axes, runs)):
                client_metric_lines(axis, run, key, colour(index))
                axis.set(title=f"{run.name}: clients' held-out {label}", ylabel=label)
                integer_rounds(axis)
    for axis, run in zip(axes[0], runs):
        rounds = [row["round"] for row in run.rows]
        accepted = [row.get("clients", 0) for row in run.rows]
        axis.bar(rounds, accepted, color="tab:green", label="accepted")
        axis.bar(
            rounds,
            [row.get("clients_rejected", 0) for row in run.rows],
            bottom=accepted,
            color="tab:red",
            label="rejected or silent",
        )
        sent = [row.get("clients_sent", 0) for row in run.rows]
        axis.plot(rounds, sent, "_", color="black", markersize=16, markeredgewidth=2, label="sent work")
        quarantined = [
            (number, len(row["quarantined"])) for number, row in zip(rounds, run.rows) if row.get("quarantined")
        ]
        if quarantined:
            axis.plot(
                *zip(*quarantined),
                "v",
                color="tab:purple",
                markersize=10,
                markeredgecolor="white",
                zorder=3,
                label="quarantined (sit out the next round)",
            )
        axis.set(title=run.name, ylabel="clients")
        axis.set_ylim(0, 1.35 * max(sent + accepted) + 0.5)  # room for the legend above the bars
        integer_rounds(axis, integer_y=True)
        axis.legend(fontsize="small", loc="upper left", ncols=2)
    save_figure(figure, path)


def client_metric_lines(axis, run: Run, key: str, run_colour: str) -> None:
    """Each client's `key` per round (thin lines), their mean and the worst client's, of the global model it received
    (solid) and of its own posterior after training (dotted, where the strategy keeps one).

    Args:
        axis: a matplotlib Axes.
        run: the run whose client rows are drawn; without any, the panel says so.
        key: the metric, "accuracy", "nll" or "ece".
        run_colour: the colour of the clients' lines and their mean (the worst client's is red).
    """
    rows = client_rows(run)
    if not rows:
        no_data(axis, "client metrics (client-eval-fraction)")
        return
    rounds = [row["round"] for row in rows]
    clients = list(dict.fromkeys(client for row in rows for client in row["client_metrics"]))
    for suffix, part, style in CLIENT_PARTS:
        name = f"{key}{suffix}"
        if not any(name in entry for row in rows for entry in row["client_metrics"].values()):
            continue
        for client in clients:
            values = [row["client_metrics"].get(client, {}).get(name, math.nan) for row in rows]
            axis.plot(rounds, values, style, color=run_colour, alpha=0.3, linewidth=0.8)
        for summary, marker, line_colour in (("mean", "o", run_colour), ("worst", "v", "tab:red")):
            values = [row.get(f"client_{name}_{summary}") for row in rows]
            axis.plot(
                rounds,
                [math.nan if value is None else value for value in values],
                f"{marker}{style}",
                markersize=4,
                color=line_colour,
                label=f"{part}: {summary}",
            )
    axis.legend(fontsize="small")


def server_phase_seconds(row: dict[str, Any]) -> dict[str, float]:
    """The row's server phases in SERVER_PHASES' order and labels (unknown ones after them, by their key).

    Args:
        row: a results row; its `phase_seconds` (null: a phase that did not run, counted 0).

    Returns:
        Phase label -> seconds, every phase of SERVER_PHASES included; "first to last reply" is last_reply minus
        first_reply, both of which count from the push.
    """
    seconds = {key: value or 0.0 for key, value in row.get("phase_seconds", {}).items()}
    seconds["last_reply"] = seconds.get("last_reply", 0.0) - seconds.get("first_reply", 0.0)
    labels = dict(SERVER_PHASES)
    order: list[str] = [key for key, _ in SERVER_PHASES] + sorted(set(seconds) - set(labels))
    return {labels.get(key, key): seconds.get(key, 0.0) for key in order}


def stacked_bars(axis, rounds: list[int], phases: list[dict[str, float]], colours: dict[str, str]) -> None:
    """One bar per round, its phases stacked in the order of `colours`, each in its colour there.

    Args:
        axis: a matplotlib Axes.
        rounds: the bars' rounds.
        phases: per round, phase name -> seconds; a phase it lacks counts 0.
        colours: phase name -> colour, in stacking order (bottom first).
    """
    bottom = [0.0] * len(rounds)
    for name, phase_colour in colours.items():
        heights = [round_phases.get(name, 0.0) for round_phases in phases]
        axis.bar(rounds, heights, bottom=bottom, color=phase_colour)
        bottom = [b + h for b, h in zip(bottom, heights)]


def phase_colours(per_run: list[list[dict[str, float]]]) -> dict[str, str]:
    """One colour per phase name, the same in every run's panel, in the order the phases first appear.

    Args:
        per_run: per run, per round, phase name -> seconds.

    Returns:
        Phase name -> matplotlib cycle colour ("C0" .. "C9", repeating).
    """
    names = dict.fromkeys(name for rows in per_run for phases in rows for name in phases)
    return {name: f"C{number % 10}" for number, name in enumerate(names)}


def phase_legend(axis, colours: dict[str, str], extra: Sequence = ()) -> None:
    """The phases' legend, beside `axis` on its right.

    Args:
        axis: the last panel of a row.
        colours: phase name -> colour (phase_colours).
        extra: legend handles shown before the phases'.
    """
    from matplotlib.patches import Patch

    handles = [*extra, *(Patch(color=phase_colour, label=name) for name, phase_colour in colours.items())]
    axis.legend(handles=handles, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))


def plot_phases(runs: Sequence[Run], path: Path) -> None:
    """Draw phases.png: per round, the server's phases stacked (with its round_seconds) and, below, the clients' median
    phases.

    Args:
        runs: the runs to draw, one panel (column) each, in order.
        path: the PNG to write, replaced atomically.

    Raises:
        MissingExtra: matplotlib (fedbayes[report]) is not installed.
    """
    from matplotlib.lines import Line2D

    figure, axes = new_figure(len(runs), rows=2, height=4.5)
    server = [[server_phase_seconds(row) for row in run.rows if "phase_seconds" in row] for run in runs]
    clients = [[row.get("client_phase_seconds") or {} for row in run.rows] for run in runs]
    server_colours, client_colours = phase_colours(server), phase_colours(clients)
    for column, run in enumerate(runs):
        rounds = [row["round"] for row in run.rows]
        server_axis, clients_axis = axes[0][column], axes[1][column]
        if server[column]:
            stacked_bars(server_axis, rounds, server[column], server_colours)
            server_axis.plot(rounds, [row.get("round_seconds") for row in run.rows], "k*")
        else:
            no_data(server_axis, "phase_seconds")
        if any(clients[column]):
            stacked_bars(clients_axis, rounds, clients[column], client_colours)
        else:
            no_data(clients_axis, "client_phase_seconds")
        server_axis.set(title=f"{run.name}: server", ylabel="seconds")
        clients_axis.set(title=f"{run.name}: clients (medians)", ylabel="seconds")
        integer_rounds(server_axis)
        integer_rounds(clients_axis)
    # the same phases in every column: one legend per row, beside its last panel
    phase_legend(
        axes[0][-1], server_colours, [Line2D([], [], color="black", marker="*", linestyle="", label="round_seconds")]
    )
    phase_legend(axes[1][-1], client_colours)
    save_figure(figure, path)


PLOTS = (
    Plot("metrics.png", "Accuracy, NLL and ECE per round", plot_metrics),
    Plot("reliability.png", "Reliability diagram of the last round", plot_reliability),
    Plot(
        "clients.png",
        "Clients per round",
        plot_clients,
        "Where the run set client-eval-fraction, the panels below the counts show each accepted client's metrics on "
        "the examples it held out of training (thin lines): of the global model it received, before training "
        "(solid), and of its own posterior after training (dotted; BayesADMM, DSVGD), with the clients' mean and the "
        "worst client's (lowest accuracy, highest NLL and ECE), each client counting once.",
    ),
    Plot(
        "phases.png",
        "Where each round's time went",
        plot_phases,
        "A round's evaluation and the previous round's checkpoint run while the next round's clients train "
        "(server/loop.py RoundFinisher), so the server's phases can add up to more than its round_seconds (★).",
    ),
)


INDEX_FILE = "index.html"
REPORT_FILES = (*(plot.file for plot in PLOTS), INDEX_FILE)  # what `write_report` writes into its folder


# ---- the index ----------------------------------------------------------------------------------------------------


def summary(run: Run) -> dict[str, str]:
    """What the index says about a run besides its settings.

    Args:
        run: a run with at least one row.

    Returns:
        Label -> text, in display order: source, rounds, the last evaluated round's metrics, the clients' held-out
        metrics, the last round's clients, wall time, and whether its settings are known.
    """
    first, last = run.rows[0], run.rows[-1]
    lines = {
        "source": run.source,
        "rounds": f"{first['round']}–{last['round']}" if len(run.rows) > 1 else str(last["round"]),
    }
    evaluated = evaluated_rows(run)
    if evaluated:
        lines |= evaluation_summary(evaluated[-1], last)
    lines |= client_summary(run)
    if "clients" in last:
        lines["last round's clients"] = f"{last['clients']} of {last.get('clients_sent', '?')} accepted"
    if "wall_seconds" in last:
        lines["wall time"] = f"{last['wall_seconds']:.1f} s"
    lines["settings"] = "its run config" if run.settings is not None else "settings unknown (a bare results file)"
    return lines


def evaluation_summary(evaluated: dict[str, Any], last: dict[str, Any]) -> dict[str, str]:
    """The index's lines on the run's last evaluated row, saying which round that was when it is not the last, and
    on how many test examples when it is a subset (eval-fraction).

    Args:
        evaluated: the run's last evaluated row.
        last: the run's last row.

    Returns:
        Label -> text: accuracy, NLL and ECE (the ensemble's too), the uncertainty metrics where the row has them.
    """
    lines = {
        "last accuracy / NLL / ECE": f"{evaluated['accuracy']:.4f} / {evaluated['nll']:.4f} / {evaluated['ece']:.4f}"
    }
    if "accuracy_ensemble" in evaluated:
        lines["ensemble"] = (
            f"{evaluated['accuracy_ensemble']:.4f} / {evaluated['nll_ensemble']:.4f} / {evaluated['ece_ensemble']:.4f}"
        )
    for suffix, part in (("", "last"), ("_ensemble", "ensemble")):
        if f"misclassification_auroc{suffix}" in evaluated:
            lines[f"{part} AUROC errors / OOD ({evaluated.get('ood_inputs')}), accuracy at 80%"] = uncertainty_line(
                evaluated, suffix
            )
    if evaluated is not last or evaluated.get("eval_fraction", 1.0) < 1:
        lines["evaluated"] = f"round {evaluated['round']}, on {evaluated.get('eval_examples', '?')} test examples"
    return lines


def uncertainty_line(row: dict[str, Any], suffix: str) -> str:
    """A row's uncertainty metrics: the AUROCs by predictive entropy, by mutual information after them where the row
    has them, and the selective accuracy.

    Args:
        row: an evaluated results row.
        suffix: "" (the global model) or "_ensemble".

    Returns:
        "misclassification / OOD [(by MI ... / ...)], selective accuracy", each to 4 decimals; "-" where undefined.
    """

    def value(key: str) -> str:
        number = row.get(f"{key}{suffix}")
        return "-" if number is None else f"{number:.4f}"

    aurocs = f"{value('misclassification_auroc')} / {value('ood_auroc')}"
    if f"misclassification_auroc_mi{suffix}" in row:
        aurocs += f" (by MI {value('misclassification_auroc_mi')} / {value('ood_auroc_mi')})"
    return f"{aurocs}, {value('selective_accuracy_80')}"


def client_summary(run: Run) -> dict[str, str]:
    """The index's lines on the clients' held-out metrics of the run's last round that has them.

    Args:
        run: a run.

    Returns:
        Label -> text: the clients' mean and worst accuracy, NLL and ECE, of the global model and of their own
        posteriors where the row has them; empty without such a round.
    """
    rows = [row for row in client_rows(run) if row.get("client_accuracy_mean") is not None]
    if not rows:
        return {}
    last, lines = rows[-1], {}
    for suffix, part, _ in CLIENT_PARTS:
        if last.get(f"client_accuracy{suffix}_mean") is None:
            continue
        values = [f"{last[f'client_{key}{suffix}_mean']:.4f}" for key, _ in METRICS]
        worst = [f"{last[f'client_{key}{suffix}_worst']:.4f}" for key, _ in METRICS]
        lines[f"clients' {part}: mean accuracy / NLL / ECE"] = " / ".join(values) + f" (round {last['round']})"
        lines[f"clients' {part}: worst"] = " / ".join(worst)
    return lines


def client_tables(runs: Sequence[Run]) -> str:
    """Per run with the clients' held-out metrics, one table of each client's in its last round that has them.

    Args:
        runs: the runs reported.

    Returns:
        The HTML section (a heading, a note, one table per run), or "" when no run has client metrics.
    """
    sections = []
    for run in runs:
        rows = [row for row in client_rows(run) if row["client_metrics"]]
        if not rows:
            continue
        last = rows[-1]
        names = list(dict.fromkeys(name for entry in last["client_metrics"].values() for name in entry))
        cells = [
            (client, [shown_number(entry.get(name)) for name in names], False)
            for client, entry in sorted(last["client_metrics"].items())
        ]
        sections.append(f"<h3>{html.escape(run.name)}: round {last['round']}</h3>\n{table(['client', *names], cells)}")
    if not sections:
        return ""
    return (
        "<h2>Each client's held-out metrics</h2>\n<p>On the examples each client held out of training "
        "(client-eval-fraction): the global model it received, and, with <code>_local</code>, its own posterior "
        "after training.</p>\n" + "\n".join(sections)
    )


def shown_number(value: Any) -> str:
    """A metric as an index cell.

    Args:
        value: an int, a float or None.

    Returns:
        "" for None, an int as it is, a float to 4 decimals.
    """
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def table(header: Sequence[str], rows: Sequence[tuple[str, Sequence[str], bool]]) -> str:
    """An HTML table, every text escaped.

    Args:
        header: the column headings.
        rows: per row (label, one cell per column after the label's, whether the runs differ there: highlighted).

    Returns:
        The table's HTML.
    """
    head = "".join(f"<th>{html.escape(text)}</th>" for text in header)
    body = "".join(
        ('<tr class="differs">' if differs else "<tr>")
        + f"<th>{html.escape(label)}</th>"
        + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells)
        + "</tr>"
        for label, cells, differs in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def settings_rows(runs: Sequence[Run]) -> list[tuple[str, list[str], bool]]:
    """One row per run-config key any run set; it differs where the runs whose settings are known differ.

    Args:
        runs: the runs reported.

    Returns:
        Per key (key, per run its JSON value, "(default)" where not set or "—" where the settings are unknown,
        whether they differ), keys in the order the runs first set them.
    """
    keys = list(dict.fromkeys(key for run in runs for key in (run.settings or {})))
    rows = []
    for key in keys:
        known = [
            json.dumps(run.settings[key]) if key in run.settings else "(default)"
            for run in runs
            if run.settings is not None
        ]
        cells = iter(known)
        rows.append((key, ["—" if run.settings is None else next(cells) for run in runs], len(set(known)) > 1))
    return rows


def render_index(runs: Sequence[Run]) -> str:
    """index.html: the runs' summaries and settings, the figures with their notes, and the clients' tables.

    Args:
        runs: the runs reported, one column each.

    Returns:
        The page's HTML.
    """
    names = [run.name for run in runs]
    summaries = [summary(run) for run in runs]
    overview = [
        (label, [lines.get(label, "") for lines in summaries], False)
        for label in dict.fromkeys(label for lines in summaries for label in lines)
    ]
    figures = "".join(
        f"<h2>{html.escape(plot.title)}</h2>\n"
        + (f"<p>{html.escape(plot.note)}</p>\n" if plot.note else "")
        + f'<img src="{plot.file}" alt="{html.escape(plot.title)}">\n'
        for plot in PLOTS
    )
    title = f"fedbayes report: {', '.join(names)}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; font-size: 0.9em; }}
tr.differs td {{ background: #fff3c4; font-weight: bold; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<h2>Runs</h2>
{table(["", *names], overview)}
<h2>Settings</h2>
<p>The run config each run was submitted with; highlighted: where the runs differ ("(default)": not set, so the
key's default).</p>
{table(["key", *names], settings_rows(runs))}
{figures}
{client_tables(runs)}
</body></html>
"""


def write_report(runs: Sequence[Run], out: Path) -> Path:
    """Every figure and index.html into `out` (made if missing), each replacing a file of its name atomically, and
    nothing else in `out` touched.

    Args:
        runs: the runs to report, at least one.
        out: the report's folder (the caller checks it may be written, tasks/storage.py `check_output_folder`).

    Returns:
        The index's path, `out`/index.html.

    Raises:
        ReportError: `runs` is empty.
        MissingExtra: matplotlib (fedbayes[report]) is not installed.
    """
    if not runs:
        raise ReportError("no run to report")
    for plot in PLOTS:
        plot.draw(runs, out / plot.file)
    index = out / INDEX_FILE
    write_atomically(index, render_index(runs).encode(), OUTPUT_MODE)
    return index
