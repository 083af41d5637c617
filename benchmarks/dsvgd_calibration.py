"""Calibration against the hidden layer's width: FedAvg against DSVGD on FMNIST (Kassab & Simeone, DSVGD, Fig. 8:
"Reliability plots for classification using BNN with variable number of hidden neurons using fashion MNIST (N = 20,
I = 10, L = L' = 200, K = 20)"; Sec. 7 "Calibration"; App. B.5, Figs. 19-20 for the MCE).

The paper's claim: a wider hidden layer makes FedAvg overconfident (overfitting), while DSVGD stays calibrated.

For each width in --widths and each strategy (fedavg, dsvgd) one federation runs under the `dsvgd-paper` preset
(`fedbayes presets dsvgd-paper`: 20 clients, all of FMNIST, iid, 10 rounds, MLP with one hidden layer of ReLUs,
batch 100, input-scale 0.99; DSVGD N = 20 particles, L = L' = 200, KDE bandwidth 0.55, AdaGrad-with-momentum 1e-3,
prior precision e, round-robin; FedAvg: one agent per round, 7 local epochs of Adam 1e-3) with `hidden=<width>`
and every other value the preset's (`--set KEY=VALUE` changes any, for trials). Each run goes through the in-process
engine of deploy/inprocess.py (`run_inprocess`: the same ServerApp and ClientApp code as the network
federation, the clients' messages run in this process, one after the other; client i gets partition i of 20, as
`fedbayes local` gives it). Then the final server checkpoint's model is evaluated on the 10,000 FMNIST test images:
DSVGD by its particle-averaged predictive (eq. 27), FedAvg by its weights. Recorded: accuracy, NLL, the ECE and the
paper's MCE (max over non-empty bins of |accuracy - confidence|) over 10 equal confidence bins (j-1)/10 < c <= j/10,
and each bin's accuracy, mean confidence and count.

Widths: 10, 50, 100 (the paper's Sec. 7.3 network) and 400, small to large around the paper's 100 (the paper's text
does not list the widths of its figure). CPU time bounds the top: DSVGD's cost grows with the particles' size (N = 20
copies of a 784-w-10 network, 795 parameters per hidden unit), and so does the checkpoint, which keeps each visited
agent's local particles (about 25 MB per agent at width 400). Measured on a shared 2-core machine at a load average
of about 4 (2026-11-26; another training job running beside), one SVGD or distillation step of 20 particles on a
batch of 100 takes about 0.02 s at width 10, 0.08 s at 50, 0.15 s at 100 and 0.6 s at 400, so a DSVGD round (L + L'
= 400 steps, plus evaluation and checkpoint) about 10 s, 35 s, 62 s (measured: one full round) and 250 s: 10 rounds
about 2, 6, 11 and 42 minutes; FedAvg's 10 rounds take under a minute at every width. The default experiment: about
an hour there. Wider layers (e.g. --widths 1000: about 1 h 45 min for DSVGD alone there) on a faster machine.

    python benchmarks/dsvgd_calibration.py                                    # the full experiment, resumable
    python benchmarks/dsvgd_calibration.py --widths 10,100 --strategies fedavg --rounds 5
    python benchmarks/dsvgd_calibration.py --report                           # table and figure from the JSONL
    python benchmarks/dsvgd_calibration.py --widths 10 --rounds 1 --set local-steps=5 --set distill-steps=5 \\
        --set particles=4 --set fraction=0.05 --results-dir /tmp/calib           # a smoke run

Writes <results-dir>/calibration-width.jsonl (one line per strategy, width and seed: the settings, the metrics, the
reliability bins, the server's per-round rows in short, wall seconds and the load average; a run already there with
the same settings is skipped, --force runs it again and appends, the newest line wins) and
<results-dir>/calibration-width.png (reliability diagrams: a column per width, rows FedAvg and DSVGD, ECE and MCE in
each title); --results-dir defaults to benchmarks/results/dsvgd. Each run's working directory,
runs/<timestamp>-calibration-width-<strategy>-h<width>-seed<seed>, is removed once its line is written (a failed
run's is kept). reliability.png and reliability.json in benchmarks/results/dsvgd are an older experiment's (width
100 only, K = 10, N = 10, L = L' = 50, through the network federation) and are left as they are.

Differences from the paper (also `fedbayes presets dsvgd-paper`): FedAvg's single agent is drawn at random each round
(fraction-train = 1/K), not in round-robin order, and trains whole epochs (7 of 3,000 examples = 210 iterations of
100) with Adam; with I = 10 rounds and K = 20 agents DSVGD's round-robin schedules only 10 of the 20 agents once
each (agents 0-9: half the training set; the paper's setting has the same count), while FedAvg's 10 random draws
may repeat an agent (seed 0: 7 distinct agents, the same at every width); the ECE here uses 10 bins, the server's
rows' `ece` 15; the paper's 86/14 re-split of train and test and its +0.01 pixel offset are not reproduced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `python benchmarks/dsvgd_calibration.py` from a source checkout

import benchmarks.environment  # noqa: F401  (one thread, no telemetry: before torch and flwr)

# isort: split

import numpy as np
import torch
from safetensors import safe_open

from fedbayes.bayes.metrics import (
    classification_metrics,
    expected_calibration_error,
    maximum_calibration_error,
    predict_probs,
    reliability_bins,
)
from fedbayes.bayes.params import parameter_layout, set_parameters, unflatten
from fedbayes.deploy.launcher import check_run_config, parse_override
from fedbayes.deploy.presets import get_preset
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.config import ConfigError
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import build_run_model

RESULTS = Path(__file__).resolve().parent / "results" / "dsvgd"
RUNS = REPO / "runs"
EXPERIMENT = "calibration-width"
PRESET = "dsvgd-paper"
SPLIT = "iid"
STRATEGIES = ("fedavg", "dsvgd")  # the figure's rows, top to bottom
LABELS = {"fedavg": "FedAvg", "dsvgd": "DSVGD"}
DEFAULT_WIDTHS = "10,50,100,400"
BINS = 10
# Run-config keys that say where a run writes, not what it computes: left out when runs are compared.
LOCATION_KEYS = ("federation", "server-state-dir", "results-path")
ROW_KEYS = (  # what each server row keeps in the JSONL (the *_ensemble keys: DSVGD's particle predictive)
    "round",
    "accuracy",
    "nll",
    "ece",
    "accuracy_ensemble",
    "nll_ensemble",
    "ece_ensemble",
    "train_loss",
    "client_compute_seconds",
    "round_seconds",
    "wall_seconds",
)


def reliability(confidence: torch.Tensor, correct: torch.Tensor, bins: int = BINS) -> dict[str, list[float] | float]:
    """Per bin (j-1)/B < c <= j/B: accuracy, mean confidence (0 for an empty bin), count; MCE and ECE over the
    non-empty bins (bayes/metrics.py)."""
    diagram = reliability_bins(confidence, correct, bins)
    return {
        "accuracy": [value or 0.0 for value in diagram["accuracy"]],
        "confidence": [value or 0.0 for value in diagram["confidence"]],
        "count": [float(count) for count in diagram["count"]],
        "mce": maximum_calibration_error(confidence, correct, bins),
        "ece": expected_calibration_error(confidence, correct, bins),
    }


# ---------------------------------------------------------------------------------------------------------
# One run: the preset's run config, the in-process federation, the evaluation of its final checkpoint


def run_config(strategy: str, width: int, rounds: int, seed: int, clients: int, overrides: dict) -> dict[str, Any]:
    """The dsvgd-paper preset's run config for `strategy` with `hidden=<width>`, then the --set overrides."""
    preset = get_preset(PRESET)
    return {
        "strategy": strategy,
        "num-server-rounds": rounds,
        "dataset": preset.dataset,
        "fraction": preset.fraction,
        "split": SPLIT,
        "seed": seed,
        "wait-for-clients": clients,
        **preset.run_config(strategy, SPLIT, clients),
        "hidden": str(width),
        **overrides,
    }


def settings_of(config: dict[str, Any]) -> dict[str, Any]:
    """A run config without the keys that only say where the run writes: what identifies a run's settings."""
    return {key: value for key, value in config.items() if key not in LOCATION_KEYS}


def checkpoint_probs(config: dict[str, Any], checkpoint: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Test-set class probabilities of a run's final server checkpoint (DSVGD: averaged over its particles, eq. 27;
    FedAvg: its global weights), and the test labels."""
    settings = run_settings({**default_run_config(str(config["strategy"])), **config})
    test = load_dataset(settings.dataset, train=False, data_root=settings.data_root).scaled(settings.input_scale)
    model = build_run_model(settings.architecture, test.input_shape, test.num_classes)
    layout = parameter_layout(model)
    with safe_open(checkpoint, framework="np") as stored:
        if settings.strategy.endswith("dsvgd"):
            weights = [unflatten(p, layout) for p in stored.get_tensor("strategy/particles")]
        else:
            weights = [{name: stored.get_tensor(f"global/{name}") for name in layout}]
    probs = []
    for arrays in weights:
        set_parameters(model, arrays)
        probs.append(predict_probs(model, test.images, 2000, torch.device("cpu")))
    return torch.stack(probs).mean(0), test.labels


def evaluate(config: dict[str, Any], checkpoint: Path) -> dict[str, Any]:
    probs, labels = checkpoint_probs(config, checkpoint)
    confidence, predicted = probs.max(1)
    diagram = reliability(confidence, predicted == labels)
    metrics = classification_metrics(probs, labels, bins=BINS)
    return {
        "metrics": {
            "accuracy": metrics["accuracy"],
            "nll": metrics["nll"],
            "ece": diagram["ece"],
            "mce": diagram["mce"],
        },
        "reliability": {"bins": BINS, **{key: diagram[key] for key in ("accuracy", "confidence", "count")}},
        "test_examples": len(labels),
    }


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_one(config: dict[str, Any], clients: int, width: int, overrides: dict) -> tuple[dict[str, Any], Path]:
    """Train one federation in this process and evaluate its final checkpoint: the JSONL line, and the working
    directory this made for the run (runs/<timestamp>-...)."""
    from fedbayes.deploy.inprocess import run_inprocess

    strategy, seed = config["strategy"], config["seed"]
    name = f"{EXPERIMENT}-{strategy}-h{width}-seed{seed}"
    workdir = RUNS / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    workdir.mkdir(parents=True)  # a new directory, this run's own: the only one removed afterwards
    federation = {**config, "federation": name}
    load_start, started = os.getloadavg(), time.monotonic()
    rows = run_inprocess(federation, clients, workdir, pipeline_evaluation=True)
    trained = time.monotonic()
    evaluation = evaluate(config, workdir / "server-state" / name / "checkpoint.safetensors")
    finished = time.monotonic()
    line = {
        "experiment": EXPERIMENT,
        "preset": PRESET,
        "strategy": strategy,
        "width": width,
        "seed": seed,
        "rounds": config["num-server-rounds"],
        "clients": clients,
        "overrides": overrides,
        "run_config": settings_of(config),
        **evaluation,
        "server_rows": [{key: row.get(key) for key in ROW_KEYS if key in row} for row in rows],
        "train_seconds": trained - started,
        "eval_seconds": finished - trained,
        "wall_seconds": finished - started,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "commit": git_commit(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return line, workdir


# ---------------------------------------------------------------------------------------------------------
# The JSONL, the table and the figure


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def newest(lines: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """The newest line of each (strategy, width, seed)."""
    found: dict[tuple, dict[str, Any]] = {}
    for line in lines:
        found[(line["strategy"], line["width"], line["seed"])] = line
    return found


def ordered(lines: dict[tuple, dict[str, Any]]) -> list[tuple[tuple, dict[str, Any]]]:
    """The lines by width, seed, then strategy."""
    return sorted(lines.items(), key=lambda item: (item[0][1], item[0][2], item[0][0]))


def table(lines: dict[tuple, dict[str, Any]]) -> str:
    header = f"{'width':>6} {'seed':>4}  " + "  ".join(
        f"{LABELS.get(s, s) + ' acc / NLL / ECE / MCE':<33}" for s in STRATEGIES
    )
    out = [header, "-" * len(header)]
    for width, seed in sorted({(w, seed) for _, w, seed in lines}):
        cells = []
        for strategy in STRATEGIES:
            line = lines.get((strategy, width, seed))
            if line is None:
                cells.append(f"{'-':<33}")
                continue
            m = line["metrics"]
            cells.append(f"{m['accuracy']:.4f} / {m['nll']:.4f} / {m['ece']:.4f} / {m['mce']:.4f}  ")
        out.append(f"{width:>6} {seed:>4}  " + "  ".join(cells))
    walls = [
        f"{LABELS.get(s, s)} h{w} s{seed}: {line['wall_seconds'] / 60:.1f} min" for (s, w, seed), line in ordered(lines)
    ]
    out.append("wall (train + evaluation): " + ", ".join(walls))
    protocols = {json.dumps([line["rounds"], line["clients"], line["overrides"]]) for line in lines.values()}
    if len(protocols) > 1:
        out.append("NOTE: these runs differ in rounds, clients or --set overrides:")
        out += [
            f"  {LABELS.get(s, s)} h{w} s{seed}: {line['rounds']} rounds, {line['clients']} clients, "
            f"{line['overrides']}"
            for (s, w, seed), line in ordered(lines)
        ]
    return "\n".join(out)


def plot(lines: dict[tuple, dict[str, Any]], seed: int, path: Path) -> None:
    """Reliability diagrams: a column per width, rows FedAvg and DSVGD (the paper's Fig. 8/19)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = sorted({w for _, w, s in lines if s == seed})
    if not widths:
        return
    figure, axes = plt.subplots(
        len(STRATEGIES), len(widths), figsize=(max(3.2 * len(widths), 6.4), 3.3 * len(STRATEGIES)), squeeze=False
    )
    centres = (np.arange(BINS) + 0.5) / BINS
    for row, strategy in enumerate(STRATEGIES):
        for column, width in enumerate(widths):
            axis = axes[row][column]
            axis.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
            axis.set(xlim=(0, 1), ylim=(0, 1))
            if row == len(STRATEGIES) - 1:
                axis.set_xlabel("confidence")
            if column == 0:
                axis.set_ylabel(f"{LABELS[strategy]}\naccuracy")
            line = lines.get((strategy, width, seed))
            if line is None:
                axis.set_title(f"{LABELS[strategy]}, {width} hidden: not run", fontsize=9)
                continue
            bins = line["reliability"]
            accuracy = np.where(np.array(bins["count"]) > 0, bins["accuracy"], np.nan)
            axis.bar(centres, accuracy, width=1 / BINS, edgecolor="k", color="tab:blue", label="accuracy")
            m = line["metrics"]
            axis.set_title(
                f"{LABELS[strategy]}, {width} hidden\nacc {m['accuracy']:.3f}, ECE {m['ece']:.3f}, MCE {m['mce']:.3f}",
                fontsize=9,
            )
            if row == 0 and column == 0:
                axis.legend(loc="upper left", fontsize=7)
    first = next(line for key, line in lines.items() if key[2] == seed)
    changed = ", ".join(f"{key}={value}" for key, value in first["overrides"].items())
    figure.suptitle(
        f"FMNIST, {PRESET} preset, K = {first['clients']} agents, {first['rounds']} rounds, seed {seed}"
        + (f"\nchanged by --set: {changed}" if changed else ""),
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def report(results: Path, seed: int) -> None:
    lines = newest(read_lines(results / f"{EXPERIMENT}.jsonl"))
    if not lines:
        print(f"no runs in {results / f'{EXPERIMENT}.jsonl'}")
        return
    print(table(lines))
    if any(key[2] == seed for key in lines):
        plot(lines, seed, results / f"{EXPERIMENT}.png")
        print(f"wrote {results / f'{EXPERIMENT}.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", default=DEFAULT_WIDTHS, help=f"hidden units, comma-separated ({DEFAULT_WIDTHS})")
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--rounds", type=int, default=get_preset(PRESET).rounds, help="the preset's: 10")
    parser.add_argument("--clients", type=int, default=get_preset(PRESET).clients, help="K, the preset's: 20")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset value")
    parser.add_argument("--results-dir", type=Path, default=RESULTS, help="where the JSONL and the PNG go")
    parser.add_argument("--force", action="store_true", help="run again what the JSONL already holds")
    parser.add_argument("--report", action="store_true", help="only tabulate and plot the JSONL")
    args = parser.parse_args()
    results = args.results_dir
    if args.report:
        report(results, args.seed)
        return
    strategies = args.strategies.split(",")
    if unknown := [s for s in strategies if s not in STRATEGIES]:
        parser.error(f"--strategies: {', '.join(unknown)} not among {', '.join(STRATEGIES)}")
    widths = [int(w) for w in args.widths.split(",")]
    overrides = dict(parse_override(item) for item in args.set)
    if "hidden" in overrides:
        parser.error("--set hidden: the widths are --widths")
    jsonl = results / f"{EXPERIMENT}.jsonl"
    done = newest(read_lines(jsonl))
    planned = []
    for width in widths:
        for strategy in strategies:
            config = run_config(strategy, width, args.rounds, args.seed, args.clients, overrides)
            try:  # a bad key or value fails here, before hours of training
                check_run_config(config, args.clients)
            except (ConfigError, ValueError) as error:
                parser.error(f"{strategy} width {width}: {error}")
            earlier = done.get((strategy, width, args.seed))
            if earlier is not None and not args.force:
                if earlier["run_config"] != settings_of(config):
                    differ = sorted(
                        key
                        for key in set(earlier["run_config"]) | set(config)
                        if key not in LOCATION_KEYS and earlier["run_config"].get(key) != config.get(key)
                    )
                    parser.error(
                        f"{jsonl} holds {strategy} width {width} seed {args.seed} with other settings "
                        f"({', '.join(differ)}): use another --results-dir, or --force to run it again (the newest "
                        "line wins)"
                    )
                print(f"{strategy} width {width} seed {args.seed}: in {jsonl}, skipped", flush=True)
                continue
            planned.append((strategy, width, config))
    results.mkdir(parents=True, exist_ok=True)
    for strategy, width, config in planned:
        load = os.getloadavg()
        print(f"{strategy} width {width} seed {args.seed}: training (load average {load[0]:.2f}) ...", flush=True)
        line, workdir = run_one(config, args.clients, width, overrides)
        with jsonl.open("a") as out:
            out.write(json.dumps(line) + "\n")
        shutil.rmtree(workdir)  # this run's own directory, made by run_one; the line is written
        m = line["metrics"]
        print(
            f"{strategy} width {width}: accuracy {m['accuracy']:.4f}, NLL {m['nll']:.4f}, ECE {m['ece']:.4f}, "
            f"MCE {m['mce']:.4f}; {line['train_seconds']:.0f} s training, {line['eval_seconds']:.0f} s evaluation",
            flush=True,
        )
    report(results, args.seed)


if __name__ == "__main__":
    main()
