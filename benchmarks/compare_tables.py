"""The tables of docs/results/compare.md, read from the protocol's summaries (benchmarks/compare_protocol.py).

    python benchmarks/compare_tables.py wine iris          # each experiment's table, the page's columns
    python benchmarks/compare_tables.py --verdict defaults-sonar defaults-glass
    python benchmarks/compare_tables.py --across ood_auroc_mi defaults-sonar defaults-glass

`--verdict` reads experiments of the `defaults` grid (nothing tuned) and sets each Bayesian strategy against
FedAvg at its defaults, by issue 65's target: accuracy within 1 point of FedAvg's, and a lower NLL and ECE (means
over the seeds). `--across METRIC` prints one metric's mean per strategy and experiment (the summary's keys:
ood_auroc, misclassification_auroc, selective_accuracy_80, client_ece_worst, ...).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "compare"
COLUMNS = (  # key, heading, decimals
    ("accuracy", "acc.", 3),
    ("nll", "NLL", 3),
    ("ece", "ECE", 3),
    ("misclassification_auroc", "misclass. AUROC", 3),
    ("selective_accuracy_80", "sel. acc. @80%", 3),
    ("ood_auroc", "OOD AUROC", 2),
    ("ood_auroc_mi", "OOD AUROC (MI)", 2),
    ("client_accuracy_worst", "worst client acc.", 3),
    ("client_ece_worst", "worst client ECE", 3),
)
LABELS = {  # a setting as the page writes it; None: not shown (it moves with another)
    "lr": "lr",
    "svgd-lr": "lr",
    "distill-lr": None,
    "hess-init": "h0",
    "beta2": "β₂",
    "proximal-mu": "μ",
    "feddyn-alpha": "α",
    "weight-decay": "wd",
    "shrinkage": "ρ",
    "prior-precision": "δ",
    "function-weight": "τ_f",
    "kde-bandwidth": "bw",
    "lr-schedule": None,
}
ACCURACY_MARGIN = 0.01  # issue 65, item 4: within 1 point of FedAvg's accuracy


def read_summary(name: str) -> dict[str, Any]:
    """An experiment's summary.json.

    Args:
        name: the experiment (a folder of RESULTS).

    Returns:
        The summary.

    Raises:
        FileNotFoundError: the experiment has not finished (no summary yet).
    """
    return json.loads((RESULTS / name / "summary.json").read_text())


def point_text(settings: dict[str, Any]) -> str:
    """A grid point as the page writes it: `lr 0.003, μ 0.01, constant`; `defaults` for none.

    Args:
        settings: the point's keys.

    Returns:
        The text.
    """
    parts = [f"{LABELS.get(key, key)} {value}" for key, value in settings.items() if LABELS.get(key, key) is not None]
    if "lr-schedule" in settings:
        parts.append(settings["lr-schedule"])
    return ", ".join(parts) or "defaults"


def cell(metric: dict[str, Any] | None, decimals: int) -> str:
    """mean ± sd, or `-` where the strategy's rows have no such metric.

    Args:
        metric: the summary's entry ({"mean", "sd", ...}) or None.
        decimals: digits after the point.

    Returns:
        The cell's text.
    """
    return "-" if metric is None else f"{metric['mean']:.{decimals}f} ± {metric['sd']:.{decimals}f}"


def seeds_text(entry: dict[str, Any]) -> str:
    """The seeds run, and how many of them diverged.

    Args:
        entry: a strategy's summary entry.

    Returns:
        `3`, or `3 (1 diverged)`.
    """
    failed = len(entry["failed_seeds"])
    return f"{entry['seeds']}" + (f" ({failed} diverged)" if failed else "")


def experiment_table(summary: dict[str, Any]) -> str:
    """The page's table of one experiment.

    Args:
        summary: its summary.json.

    Returns:
        The Markdown table, one row per strategy.
    """
    heading = "tuned point" if any(len(e["grid"]) > 1 for e in summary["strategies"].values()) else "settings"
    lines = [
        f"| strategy | {heading} | " + " | ".join(title for _, title, _ in COLUMNS) + " | seeds |",
        "|" + "---|" * (len(COLUMNS) + 3),
    ]
    for strategy, entry in summary["strategies"].items():
        cells = [cell(entry["test"].get(key), decimals) for key, _, decimals in COLUMNS]
        lines.append(
            f"| {strategy} | {point_text(entry['settings'])} | " + " | ".join(cells) + f" | {seeds_text(entry)} |"
        )
    return "\n".join(lines)


def verdict(entry: dict[str, Any], fedavg: dict[str, Any]) -> str:
    """A strategy at its defaults against FedAvg at its own: `meets`, or which part of the target it misses.

    Args:
        entry: the strategy's summary entry.
        fedavg: FedAvg's.

    Returns:
        `meets`, or `misses: ...` naming accuracy, NLL or ECE.
    """
    test, base = entry["test"], fedavg["test"]
    misses = []
    if test["accuracy"]["mean"] < base["accuracy"]["mean"] - ACCURACY_MARGIN:
        misses.append("accuracy")
    misses += [title for key, title in (("nll", "NLL"), ("ece", "ECE")) if test[key]["mean"] >= base[key]["mean"]]
    return "meets" if not misses else "misses: " + ", ".join(misses)


def verdict_table(names: list[str]) -> str:
    """Every Bayesian strategy at its defaults against FedAvg at its own, per experiment.

    Args:
        names: experiments of the `defaults` grid.

    Returns:
        The Markdown table: accuracy difference in points, NLL and ECE beside FedAvg's, the verdict.
    """
    lines = [
        "| data | strategy | acc. − FedAvg's (points) | NLL (FedAvg) | ECE (FedAvg) | target |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        strategies = read_summary(name)["strategies"]
        fedavg = strategies["fedavg"]
        for strategy, entry in strategies.items():
            if strategy in ("fedavg", "fedprox"):
                continue
            test, base = entry["test"], fedavg["test"]
            lines.append(
                f"| {name.removeprefix('defaults-')} | {strategy} | "
                f"{100 * (test['accuracy']['mean'] - base['accuracy']['mean']):+.1f} | "
                f"{test['nll']['mean']:.3f} ({base['nll']['mean']:.3f}) | "
                f"{test['ece']['mean']:.3f} ({base['ece']['mean']:.3f}) | {verdict(entry, fedavg)} |"
            )
    return "\n".join(lines)


def across_table(names: list[str], metric: str) -> str:
    """One metric's mean over the seeds, a row per strategy and a column per experiment.

    Args:
        names: the experiments.
        metric: a key of the summaries' `test` entries (ood_auroc_mi, ...).

    Returns:
        The Markdown table; `-` where a strategy was not run or has no such metric.

    Raises:
        ValueError: no experiment has `metric` for any strategy (a misspelt key).
    """
    summaries = {name: read_summary(name)["strategies"] for name in names}
    strategies = list(dict.fromkeys(strategy for entries in summaries.values() for strategy in entries))
    rows, found = [], False
    for strategy in strategies:
        cells = []
        for entries in summaries.values():
            value = entries.get(strategy, {}).get("test", {}).get(metric)
            found |= value is not None
            cells.append("-" if value is None else f"{value['mean']:.2f}")
        rows.append(f"| {strategy} | " + " | ".join(cells) + " |")
    if not found:
        raise ValueError(f"no strategy of {', '.join(names)} has the metric {metric!r}")
    heading = "| strategy | " + " | ".join(name.removeprefix("defaults-") for name in names) + " |"
    return "\n".join([heading, "|" + "---|" * (len(names) + 1), *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", nargs="+", help="folders of benchmarks/results/compare")
    parser.add_argument("--verdict", action="store_true", help="the defaults against FedAvg's (defaults grid)")
    parser.add_argument("--across", metavar="METRIC", help="one metric's mean per strategy across the experiments")
    args = parser.parse_args()
    if args.across:
        print(across_table(args.experiments, args.across))
        return
    if args.verdict:
        print(verdict_table(args.experiments))
        return
    for name in args.experiments:
        print(f"## {name}\n\n{experiment_table(read_summary(name))}\n")


if __name__ == "__main__":
    main()
