"""The comparison a user can trust: `fedbayes compare` over the protocol's data sets, one after another, each resumable.

Every strategy with a grid (deploy/compare_grids.toml), each tuned on a validation split carved from its clients'
data, then its winner over the seeds on the test set (docs/running/compare.md). The experiments:

- fmnist-het-mlp: FMNIST-10% (6,000 images), 10 clients on the Dirichlet split, Table 1's MLP (784-200-100-10, sigmoid)
  on [0, 1] pixels, batch 32, 5 local epochs, 30 rounds, the paper grid, 3 seeds.
- breast_cancer, wine, digits, iris: scikit-learn's bundled real sets, standardised features (a stratified 75/25
  split, benchmarks/user_defaults.py `write_dataset`), 5 clients on the Dirichlet split, an MLP of 32 ReLU units,
  5 local epochs, 30 rounds, the paper grid, 3 seeds.
- fmnist-het-cnn: the fmnist-het-mlp federation with the Acar CNN (`cnn-acar`), the small grid (each strategy's learning
  rate at a constant and a cosine schedule) and 2 seeds: the paper grid's CNN runs would take days on a CPU.

Then the defaults on data nobody tuned on (issue 65, item 4), the `defaults` grid (every key at its default, nothing
tuned), 3 seeds:

- defaults-<set>: six UCI sets of R's mlbench (benchmarks/heldout_data.py: sonar, ionosphere, glass, vehicle, pima,
  satellite), the tabular federation above.
- defaults-fmnist-mlp: the fmnist-het-mlp federation. Its data was tuned on (BayesADMM's default schedule was chosen
  there): it shows what a user who sets nothing gets on the paper's own task, not a held-out result.
- defaults-fmnist-cnn: the fmnist-het-cnn federation, 2 seeds.

`python benchmarks/compare_tables.py --verdict defaults-sonar ...` sets each against FedAvg's defaults.

Each experiment writes under benchmarks/results/compare/<name>/ (the tabular data sets' files in its data/); an
interrupted run is resumed by running the same command again, a finished one is read.

    python benchmarks/compare_protocol.py --list
    python benchmarks/compare_protocol.py                           # every experiment, in order
    python benchmarks/compare_protocol.py --only wine,iris --parallel 2
    python benchmarks/compare_protocol.py --only fmnist-het-mlp --strategies fedavg,bayesadmm
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn import datasets  # noqa: E402

from benchmarks import heldout_data  # noqa: E402
from benchmarks.user_defaults import DATASETS, write_dataset  # noqa: E402
from fedbayes.deploy.compare import CompareSpec, compare  # noqa: E402
from fedbayes.deploy.processes import stop_processes_on_signals  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "compare"
# every strategy with a grid, the cheaper first (FedLap-Func's server fits w_g for seconds every round)
STRATEGIES = (
    "fedavg",
    "fedprox",
    "feddyn",
    "fedpa",
    "fedlap",
    "fedlap-cov",
    "bayesadmm",
    "p-dsvgd",
    "dsvgd",
    "fedlap-func",
)
TUNED_TABULAR = {**DATASETS, "iris": datasets.load_iris}
HELD_OUT = heldout_data.loaders()
TABULAR = {**TUNED_TABULAR, **HELD_OUT}
TABULAR_MODEL = {"hidden": "32", "activation": "relu"}


@dataclass(frozen=True)
class Experiment:
    """One `fedbayes compare` of the protocol."""

    name: str
    dataset: str  # fmnist, or a scikit-learn set written as npz:DIR
    clients: int
    fraction: float
    grid: str
    seeds: int
    overrides: dict[str, Any] = field(default_factory=dict)


EXPERIMENTS = (
    Experiment("fmnist-het-mlp", "fmnist", 10, 0.1, "paper", 3, {"local-epochs": 5}),
    *(Experiment(name, name, 5, 1.0, "paper", 3, {"local-epochs": 5, **TABULAR_MODEL}) for name in TUNED_TABULAR),
    Experiment("fmnist-het-cnn", "fmnist", 10, 0.1, "small", 2, {"local-epochs": 5, "model": "cnn-acar"}),
    *(
        Experiment(f"defaults-{name}", name, 5, 1.0, "defaults", 3, {"local-epochs": 5, **TABULAR_MODEL})
        for name in HELD_OUT
    ),
    Experiment("defaults-fmnist-mlp", "fmnist", 10, 0.1, "defaults", 3, {"local-epochs": 5}),
    Experiment("defaults-fmnist-cnn", "fmnist", 10, 0.1, "defaults", 2, {"local-epochs": 5, "model": "cnn-acar"}),
)


def spec(experiment: Experiment, strategies: tuple[str, ...], rounds: int, parallel: int = 1) -> CompareSpec:
    """The comparison of `experiment`, its tabular data set written first (the same files every time, so that a
    resumed run finds its runs).

    Args:
        experiment: the experiment.
        strategies: the strategies to compare.
        rounds: the rounds of each federation (of client work: DSVGD runs `clients` times as many).
        parallel: the federations run at once (the rows do not depend on it: tests/integration/test_compare.py).

    Returns:
        Its CompareSpec, writing under RESULTS/<name>.
    """
    out = RESULTS / experiment.name
    dataset = experiment.dataset
    if dataset in TABULAR:
        dataset = f"npz:{write_dataset(dataset, out / 'data', TABULAR[dataset])}"
    return CompareSpec(
        dataset=dataset,
        clients=experiment.clients,
        strategies=strategies,
        rounds=rounds,
        seeds=experiment.seeds,
        out=out,
        grid=experiment.grid,
        fraction=experiment.fraction,
        split="dirichlet",
        overrides=experiment.overrides,
        parallel=parallel,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated experiment names (default: all, in order)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="default: every strategy with a grid")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--parallel", type=int, default=1, help="federations at once (default 1)")
    parser.add_argument("--list", action="store_true", help="print the experiments and stop")
    args = parser.parse_args()
    names = [e.name for e in EXPERIMENTS]
    chosen = args.only.split(",") if args.only else names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"--only: no experiment {', '.join(unknown)}; choose from {', '.join(names)}")
    if args.list:
        for experiment in EXPERIMENTS:
            print(f"{experiment.name:<20} {experiment}")
        return
    stop_processes_on_signals()
    strategies = tuple(name.strip() for name in args.strategies.split(",") if name.strip())
    for experiment in EXPERIMENTS:
        if experiment.name in chosen:
            print(f"== {experiment.name}", flush=True)
            compare(spec(experiment, strategies, args.rounds, args.parallel))


if __name__ == "__main__":
    main()
