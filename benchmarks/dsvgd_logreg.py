"""DSVGD's Bayesian logistic regression under the paper's protocol (Kassab & Simeone Sec. 7, Figs. 4 and 5, App. C):
DSVGD and U-DSVGD against FedAvg scheduled the same way (one agent per round, round-robin), in one process with the
strategies' own math (strategies/dsvgd/math.py), no network: the model has d + 1 ≤ 31 parameters and the question is
the algorithm.

Datasets (each function below gives its definition): Twonorm, Ringnorm and Waveform generated from their published
definitions, used unnormalised as the paper uses Rätsch's copies; scikit-learn's breast_cancer as a real set,
standardised (it is not the paper's "Breast Cancer", see `breast_cancer`). Per trial: the data drawn (or, for
breast_cancer, permuted) afresh, a random 80/20 train/test split, the training set partitioned over K agents.
Model (Gershman et al. 2012): θ = [w, log ξ], p_0(w | ξ) = N(0, ξ⁻¹ I), p_0(ξ) = Gamma(1, 0.01) read as the authors'
code does (docs/algorithms/dsvgd.md: shape 1, rate b0 = 100 in the initialisation and the score, E[ξ] = 0.01, so the
initial weights have std ≈ 10); L_k = Σ log(1 + exp(-y w·x)) over agent k's data, estimated on a minibatch of 10 (the
paper's Table 2) x |D_k|/10. DSVGD: L = L' = 200, KDE bandwidth 0.55, AdaGrad-with-momentum lr 0.05, β 0.9, fudge
1e-9 (Table 3). FedAvg ("FedAvg implementation", App. C): the scheduled agent runs L = 200 steps of the same step rule
on its loss from the global weights and sends them back (one agent per round, so the server's average is its
weights); it starts from the first particle's w.

Metrics per round, method and trial, on the trial's test set: accuracy of the decision by the particle-averaged
predictive p(y = +1 | x) = (1/N) Σ_n σ(w_n·x), and log-likelihood, the mean over test points of log (1/N) Σ_n
σ(y w_n·x) (FedAvg: of its one model); reported as mean ± standard error (sd/√T) over T trials.

Runs (`--figures`):
- 4: Fig. 4's grid, every dataset x K ∈ `--agents` x N ∈ `--particles`, the training set split into K equal random
  parts (split "iid");
- 5: Fig. 5, K = 4 agents, N = 6 particles, split "homogeneous" (each label's training examples split equally over the
  agents) or "heterogeneous" (agents 1-2 hold 40% each of label +1 and 10% each of label -1, agents 3-4 the reverse).
The T trials of one configuration run at once, as one batch of T independent particle sets (bayes/kernels.py takes
(T, N, d)); trial t's numbers do not depend on which other trials share its batch, to round-off. One JSON line per
configuration is appended to the results file; a configuration already there is skipped (`--force` reruns it).

    python benchmarks/dsvgd_logreg.py                       # both figures, 4 datasets, 20 trials, 40 rounds
    python benchmarks/dsvgd_logreg.py --figures 4 --datasets twonorm --agents 2 --trials 2 --rounds 5 --results /tmp/l
    python benchmarks/dsvgd_logreg.py --report              # tables and figures from the results file only
                                                            # (of the records the other options select)

Writes benchmarks/results/dsvgd/paper-protocol.jsonl, and paper-fig4.png and paper-fig5.png beside it. (twonorm.json
and twonorm.png there are an earlier version of this benchmark: Twonorm only, 3 trials.)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.strategies.dsvgd.math import SVGDSettings, Visit, agent_round, unconstrained_tilted_update

RESULTS = Path(__file__).resolve().parent / "results" / "dsvgd" / "paper-protocol.jsonl"
BATCH, TRAIN_FRACTION = 10, 0.8
PRIOR_SHAPE, PRIOR_RATE = 1.0, 100.0  # Gamma(a = 1, b = 0.01) as the authors' code uses it (rate 1/0.01)
SETTINGS = SVGDSettings(
    local_steps=200, distill_steps=200, kde_bandwidth=0.55, lr=0.05, distill_lr=0.05, beta=0.9, fudge=1e-9
)
METHODS = ("dsvgd", "u-dsvgd", "fedavg")
METRICS = ("accuracy", "log_likelihood")
FIG5_AGENTS, FIG5_PARTICLES = 4, 6
CHECKPOINTS = (1, 2, 5, 10, 20, 40)

Data = tuple[torch.Tensor, torch.Tensor]  # inputs (n, d) float64, labels (n,) ±1 float64


# ---- datasets ------------------------------------------------------------------------------------------------------


def twonorm(generator: torch.Generator, count: int = 7400, dimension: int = 20) -> Data:
    """Breiman (1996), Twonorm: labels ±1 equally likely, inputs N(label·a·1, I_20) with a = 2/√20; 7,400 points as
    in Gershman et al. (2012) and the paper's Table 2. Bayes accuracy Φ(2) = 97.7%."""
    labels = torch.randint(0, 2, (count,), generator=generator, dtype=torch.float64) * 2 - 1
    inputs = torch.randn(count, dimension, generator=generator, dtype=torch.float64)
    return inputs + labels[:, None] * (2 / math.sqrt(dimension)), labels


def ringnorm(generator: torch.Generator, count: int = 7400, dimension: int = 20) -> Data:
    """Breiman (1996), Ringnorm: labels ±1 equally likely; label +1: N(0, 4 I_20), label -1: N(a·1, I_20) with
    a = 1/√20 (Breiman's definition, as R's mlbench.ringnorm has it: a = d^(-1/2)); 7,400 points (Table 2). The
    Bayes rule is quadratic: a linear model cannot reach it."""
    labels = torch.randint(0, 2, (count,), generator=generator, dtype=torch.float64) * 2 - 1
    noise = torch.randn(count, dimension, generator=generator, dtype=torch.float64)
    positive = labels[:, None] > 0
    return torch.where(positive, 2 * noise, noise + 1 / math.sqrt(dimension)), labels


def waveform(generator: torch.Generator, count: int = 5086) -> Data:
    """Breiman, Friedman, Olshen & Stone (1984, CART) waveform generator, 21 features: base waves h1(i) =
    max(6 - |i - 11|, 0) for i = 1..21, h2(i) = h1(i - 4), h3(i) = h1(i + 4); classes 1, 2, 3 equally likely,
    x = u·h1 + (1-u)·h2 + ε (class 1), u·h1 + (1-u)·h3 + ε (class 2), u·h2 + (1-u)·h3 + ε (class 3), u ~ U(0, 1) per
    example, ε ~ N(0, I_21). Binary as in Rätsch's benchmark, class 1 (label +1, a third of the points) against
    classes 2 and 3 (label -1): our reading of that benchmark's two-class version. 5,086 points as the paper's
    Table 2."""
    i = torch.arange(1, 22, dtype=torch.float64)
    h1, h2, h3 = ((6 - (i - centre).abs()).clamp_min(0) for centre in (11, 15, 7))
    classes = torch.randint(0, 3, (count,), generator=generator)
    u = torch.rand(count, 1, generator=generator, dtype=torch.float64)
    first, second = torch.stack([h1, h1, h2])[classes], torch.stack([h2, h3, h3])[classes]
    inputs = u * first + (1 - u) * second + torch.randn(count, 21, generator=generator, dtype=torch.float64)
    return inputs, torch.where(classes == 0, 1.0, -1.0).double()


def breast_cancer(generator: torch.Generator) -> Data:
    """scikit-learn's load_breast_cancer (Wisconsin diagnostic, 569 x 30), label +1 malignant, -1 benign; the same
    points every trial (the trial's split permutes them). Not the paper's "Breast Cancer", which is Rätsch's 263 x 9
    copy of the UCI Ljubljana set, a different problem. Its features range from 1e-3 to thousands: with the prior's
    initial weights of std ≈ 10 and lr 0.05 per coordinate the raw features leave the logits in the tens of thousands,
    so each trial standardises them with its training split's mean and std (`STANDARDISED`)."""
    from sklearn.datasets import load_breast_cancer

    del generator  # nothing random in the data itself
    inputs, target = load_breast_cancer(return_X_y=True)
    return torch.from_numpy(inputs).double(), torch.from_numpy(target == 0).double() * 2 - 1  # sklearn: 0 = malignant


DATASETS: dict[str, Callable[[torch.Generator], Data]] = {
    "twonorm": twonorm,
    "ringnorm": ringnorm,
    "waveform": waveform,
    "breast_cancer": breast_cancer,
}
STANDARDISED = {"breast_cancer"}  # the paper's Rätsch datasets are used unnormalised (App. C)


def seed(*parts: object) -> int:
    """A seed that depends on what it is for (data, prior, minibatches) and on the trial, never on the batch."""
    return zlib.crc32(repr(parts).encode())


# ---- one configuration's trials, as a batch -------------------------------------------------------------------------


def trial_data(dataset: str, trial: int) -> tuple[Data, Data]:
    """(train, test) of one trial: the data drawn (or permuted), a random 80/20 split, standardised if listed."""
    generator = torch.Generator().manual_seed(seed("data", dataset, trial))
    inputs, labels = DATASETS[dataset](generator)
    order = torch.randperm(len(labels), generator=generator)
    cut = int(TRAIN_FRACTION * len(labels))
    train, test = order[:cut], order[cut:]
    if dataset in STANDARDISED:
        mean, std = inputs[train].mean(0), inputs[train].std(0)
        inputs = (inputs - mean) / std
    return (inputs[train], labels[train]), (inputs[test], labels[test])


def partition(labels: torch.Tensor, agents: int, split: str) -> list[torch.Tensor]:
    """Agent k's rows of a (randomly ordered) training set. "iid": every K-th row (K equal random parts, Fig. 4);
    "homogeneous": each label's rows split equally over the agents; "heterogeneous" (even K): the first half of the
    agents share 80% of label +1's rows and 20% of label -1's equally, the second half the reverse (K = 4: 40% of one
    label and 10% of the other each, Fig. 5)."""
    if split == "iid":
        return [torch.arange(k, len(labels), agents) for k in range(agents)]
    if split == "heterogeneous" and agents % 2:
        raise ValueError("the heterogeneous split needs an even number of agents")
    half = agents // 2
    shares = {
        "homogeneous": {1.0: [1 / agents] * agents, -1.0: [1 / agents] * agents},
        "heterogeneous": {
            1.0: [0.8 / half] * half + [0.2 / half] * half,
            -1.0: [0.2 / half] * half + [0.8 / half] * half,
        },
    }[split]
    parts: list[list[torch.Tensor]] = [[] for _ in range(agents)]
    for label, fractions in shares.items():
        rows = torch.nonzero(labels == label).flatten()
        bounds = [round(f * len(rows)) for f in torch.tensor(fractions, dtype=torch.float64).cumsum(0).tolist()]
        for k, (start, stop) in enumerate(zip([0, *bounds[:-1]], bounds)):
            parts[k].append(rows[start:stop])
    return [torch.cat(p).sort().values for p in parts]


def prior_score(theta: torch.Tensor) -> torch.Tensor:
    """∇log p_0 for θ = [w, s = log ξ], (..., N, d + 1): log p_0 = (d/2 + a) s - e^s (‖w‖²/2 + b0) + const (the +s is
    the Jacobian)."""
    w, s = theta[..., :-1], theta[..., -1:]
    precision = s.exp()
    log_precision_score = (
        w.shape[-1] / 2 + PRIOR_SHAPE - precision * (w.square().sum(-1, keepdim=True) / 2 + PRIOR_RATE)
    )
    return torch.cat([-precision * w, log_precision_score], dim=-1)


def prior_sample(count: int, dimension: int, generator: torch.Generator) -> torch.Tensor:
    """`count` draws of [w, log ξ] from p_0; Gamma(1, b0) is the exponential distribution of rate b0."""
    assert PRIOR_SHAPE == 1.0
    precision = torch.empty(count, 1, dtype=torch.float64).exponential_(generator=generator) / PRIOR_RATE
    w = torch.randn(count, dimension, generator=generator, dtype=torch.float64) / precision.sqrt()
    return torch.cat([w, precision.log()], dim=1)


class LossGradient:
    """∇L_k at every particle of every trial, (T, N, d + 1), on one minibatch of `BATCH` rows per trial and call x
    |D_k|/BATCH; the log-precision gets no gradient from the data. Each trial draws its minibatches from its own
    seeded permutations of its agent's rows (a new permutation when fewer than `BATCH` rows are left), independently
    of the other trials in the batch."""

    CHUNK = 200  # calls' worth of minibatch rows drawn at a time

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor, rows: list[torch.Tensor], seeds: list[int]) -> None:
        assert min(len(r) for r in rows) >= BATCH, "an agent holds fewer rows than a minibatch"
        self.inputs, self.labels, self.rows = inputs, labels, rows  # (T, n, d), (T, n), T x (|D_k|,)
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]
        self.scale = torch.tensor([len(r) / BATCH for r in rows], dtype=inputs.dtype)[:, None, None]
        self.pending = [torch.empty(0, dtype=torch.long) for _ in rows]
        self.block, self.position = torch.empty(len(rows), 0, dtype=torch.long), 0
        self.trials = torch.arange(len(rows))[:, None]

    def _refill(self) -> None:
        for t, rows in enumerate(self.rows):
            epochs = [self.pending[t]]
            while sum(len(e) for e in epochs) < self.CHUNK * BATCH:
                order = torch.randperm(len(rows), generator=self.generators[t])
                epochs.append(rows[order[: len(rows) // BATCH * BATCH]])
            self.pending[t] = torch.cat(epochs)
        self.block = torch.stack([p[: self.CHUNK * BATCH] for p in self.pending])
        self.pending = [p[self.CHUNK * BATCH :] for p in self.pending]
        self.position = 0

    def __call__(self, theta: torch.Tensor) -> torch.Tensor:
        if self.position + BATCH > self.block.shape[1]:
            self._refill()
        batch = self.block[:, self.position : self.position + BATCH]  # (T, B)
        self.position += BATCH
        x, y = self.inputs[self.trials, batch], self.labels[self.trials, batch][:, None, :]  # (T, B, d), (T, 1, B)
        margins = y * (theta[..., :-1] @ x.mT)  # (T, N, B)
        weights = -torch.sigmoid(-margins) * y  # d/dm log(1 + e^-m) = -σ(-m), times dm/dw = y x
        gradient_w = weights @ x * self.scale
        return torch.cat([gradient_w, torch.zeros_like(theta[..., -1:])], dim=-1)


def evaluate(weights: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per trial (T,): accuracy of the decision by the averaged predictive over the N rows of `weights` (T, N, d) (one
    row: a point estimate), and the mean log of the averaged predictive probability of the true label."""
    logits = inputs @ weights.mT  # (T, n, N)
    probability = torch.sigmoid(logits).mean(-1)  # p(y = +1 | x)
    accuracy = ((probability > 0.5).double() * 2 - 1 == labels).double().mean(-1)
    log_predictive = torch.logsumexp(torch.nn.functional.logsigmoid(labels[..., None] * logits), -1)
    return accuracy, (log_predictive - math.log(weights.shape[-2])).mean(-1)


def run_trials(
    dataset: str, agents: int, particles: int, split: str, trials: list[int], rounds: int, settings: SVGDSettings
) -> dict[str, dict[str, torch.Tensor]]:
    """The three methods on trials `trials` of one configuration at once: {method: {metric: (rounds, T)}}."""
    data = [trial_data(dataset, t) for t in trials]
    train_x, train_y = (torch.stack([d[0][i] for d in data]) for i in (0, 1))
    test_x, test_y = (torch.stack([d[1][i] for d in data]) for i in (0, 1))
    parts = [partition(labels, agents, split) for labels in train_y]  # T x K
    gradients = {
        method: [
            LossGradient(
                train_x, train_y, [p[k] for p in parts], [seed("batches", dataset, split, agents, t, k) for t in trials]
            )
            for k in range(agents)
        ]
        for method in METHODS
    }
    dimension = train_x.shape[-1]
    start = torch.stack(
        [
            prior_sample(particles, dimension, torch.Generator().manual_seed(seed("prior", dataset, t, particles)))
            for t in trials
        ]
    )  # (T, N, d + 1)
    dsvgd, local = start.clone(), [start.clone() for _ in range(agents)]
    unconstrained, visits = start.clone(), [[] for _ in range(agents)]
    fedavg = start[:, :1].clone()
    curves: dict[str, dict[str, list[torch.Tensor]]] = {m: {metric: [] for metric in METRICS} for m in METHODS}
    for i in range(rounds):
        k = i % agents
        dsvgd, local[k] = agent_round(dsvgd, local[k], prior_score, gradients["dsvgd"][k], settings)
        updated = unconstrained_tilted_update(
            unconstrained, i == 0, visits[k], prior_score, gradients["u-dsvgd"][k], settings
        )
        visits[k].append(Visit(None if i == 0 else unconstrained, updated))
        unconstrained = updated
        stepper, point = settings.stepper(settings.lr), fedavg
        for _ in range(settings.local_steps):
            point = stepper.step(point, -gradients["fedavg"][k](point))
        fedavg = point
        for method, state in (("dsvgd", dsvgd), ("u-dsvgd", unconstrained), ("fedavg", fedavg)):
            for metric, values in zip(METRICS, evaluate(state[..., :-1], test_x, test_y)):
                curves[method][metric].append(values)
    return {m: {metric: torch.stack(v) for metric, v in c.items()} for m, c in curves.items()}


# ---- configurations, results file, tables, figures ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Configuration:
    dataset: str
    figure: int
    agents: int
    particles: int
    split: str


def configurations(
    figures: list[int], datasets: list[str], agents: list[int], particles: list[int]
) -> list[Configuration]:
    found = []
    for figure in figures:
        for dataset in datasets:
            if figure == 4:
                found += [Configuration(dataset, 4, k, n, "iid") for k in agents for n in particles]
            elif figure == 5:
                found += [
                    Configuration(dataset, 5, FIG5_AGENTS, FIG5_PARTICLES, s) for s in ("homogeneous", "heterogeneous")
                ]
            else:
                raise ValueError(f"figures are 4 and 5, got {figure}")
    return found


def key(record: dict) -> tuple:
    return tuple(record[f] for f in ("dataset", "figure", "agents", "particles", "split", "trials", "rounds"))


def read(path: Path) -> dict[tuple, dict]:
    """The results file's records by configuration, the last one where a configuration was rerun."""
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key(r): r for r in records}


def summary(values: torch.Tensor) -> dict[str, list[float]]:
    """Mean and standard error (sd/√T, 0 for one trial) over the trials of (rounds, T) values, per round."""
    trials = values.shape[1]
    se = values.std(1) / math.sqrt(trials) if trials > 1 else torch.zeros(values.shape[0], dtype=values.dtype)
    return {"mean": values.mean(1).tolist(), "se": se.tolist()}


def run_configuration(configuration: Configuration, trials: int, rounds: int) -> dict:
    load, started = os.getloadavg(), time.monotonic()
    curves = run_trials(
        configuration.dataset,
        configuration.agents,
        configuration.particles,
        configuration.split,
        list(range(trials)),
        rounds,
        SETTINGS,
    )
    return {
        **dataclasses.asdict(configuration),
        "trials": trials,
        "rounds": rounds,
        "methods": {m: {metric: summary(v) for metric, v in c.items()} for m, c in curves.items()},
        "last_round": {m: {metric: v[-1].tolist() for metric, v in c.items()} for m, c in curves.items()},
        "wall_seconds": time.monotonic() - started,
        "load_average": list(load),
        "settings": dataclasses.asdict(SETTINGS),
        "batch": BATCH,
        "torch": torch.__version__,
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def table(record: dict) -> str:
    rounds = [r for r in CHECKPOINTS if r <= record["rounds"]]
    head = (
        f"{record['dataset']}  Fig. {record['figure']}  K={record['agents']}  N={record['particles']}  "
        f"split={record['split']}  {record['trials']} trials, {record['wall_seconds']:.0f} s "
        f"(load {record['load_average'][0]:.1f})"
    )
    lines = [head, f"  {'':<8} {'metric':<15}" + "".join(f"{'round ' + str(r):>16}" for r in rounds)]
    for method in METHODS:
        for metric, scale, unit in (("accuracy", 100, "acc %"), ("log_likelihood", 1, "log-lik")):
            values = record["methods"][method][metric]
            cells = "".join(f"{cell(scale * values['mean'][r - 1], scale * values['se'][r - 1]):>16}" for r in rounds)
            lines.append(f"  {method:<8} {unit:<15}{cells}")
    return "\n".join(lines)


def cell(mean: float, se: float) -> str:
    return f"{mean:.3g} ± {se:.2g}"


def band(axis, record: dict, method: str, metric: str, **style) -> None:
    values = record["methods"][method][metric]
    rounds = range(1, len(values["mean"]) + 1)
    mean, se = torch.tensor(values["mean"]), torch.tensor(values["se"])
    (line,) = axis.plot(rounds, mean, **style)
    axis.fill_between(rounds, mean - se, mean + se, color=line.get_color(), alpha=0.2, lw=0)


def plot_fig4(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in records)]
    agents = sorted({r["agents"] for r in records})
    figure, axes = plt.subplots(
        len(datasets), len(agents), figsize=(4.2 * len(agents), 3.2 * len(datasets)), squeeze=False
    )
    for row, dataset in zip(axes, datasets):
        for axis, k in zip(row, agents):
            runs = sorted(
                (r for r in records if r["dataset"] == dataset and r["agents"] == k), key=lambda r: r["particles"]
            )
            for colour, record in enumerate(runs):
                n = record["particles"]
                band(axis, record, "dsvgd", "accuracy", color=f"C{colour}", label=f"DSVGD N={n}")
                band(axis, record, "u-dsvgd", "accuracy", color=f"C{colour}", ls=":", label=f"U-DSVGD N={n}")
            if runs:
                band(axis, runs[-1], "fedavg", "accuracy", color="k", ls="--", label="FedAvg")
                axis.legend(fontsize=7)
            trials = {r["trials"] for r in runs}
            axis.set(title=f"{dataset}, K = {k} ({'/'.join(map(str, sorted(trials)))} trials)", xlabel="round")
            axis.set_ylabel("test accuracy")
    figure.suptitle("DSVGD paper, Fig. 4 protocol: mean ± s.e. over trials", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_fig5(records: list[dict], path: Path, floor: float = -2.0) -> None:
    """Log-likelihood (top) and accuracy (bottom) per dataset; the log-likelihood axis is cut at `floor` (FedAvg's
    overconfident first rounds are far below; the tables have every number)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in records)]
    figure, axes = plt.subplots(2, len(datasets), figsize=(4.2 * len(datasets), 6.4), squeeze=False)
    for column, dataset in enumerate(datasets):
        for split, ls in (("homogeneous", "-"), ("heterogeneous", "--")):
            for record in (r for r in records if r["dataset"] == dataset and r["split"] == split):
                for row, metric in enumerate(METRICS[::-1]):
                    for method, colour, name in (("dsvgd", "C0", "DSVGD"), ("fedavg", "C3", "FedAvg")):
                        band(axes[row, column], record, method, metric, color=colour, ls=ls, label=f"{name}, {split}")
        top, bottom = axes[0, column], axes[1, column]
        low, high = top.get_ylim()
        top.set_ylim(max(low, floor), high)
        top.set(title=f"{dataset}, K = {FIG5_AGENTS}, N = {FIG5_PARTICLES}", ylabel="test log-likelihood")
        bottom.set(xlabel="round", ylabel="test accuracy")
        top.legend(fontsize=7)
    figure.suptitle("DSVGD paper, Fig. 5 protocol: mean ± s.e. over trials", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(records: list[dict], directory: Path, tables: bool) -> None:
    """The tables (`tables`) and the figures of the chosen configurations' records."""
    if tables:
        for record in records:
            print(table(record), flush=True)
    if fig4 := [r for r in records if r["figure"] == 4]:
        plot_fig4(fig4, directory / "paper-fig4.png")
    if fig5 := [r for r in records if r["figure"] == 5]:
        plot_fig5(fig5, directory / "paper-fig5.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--figures", default="4,5")
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--agents", default="2,10,20", help="Fig. 4's K values (Fig. 5 has K = 4)")
    parser.add_argument("--particles", default="2,6", help="Fig. 4's N values (Fig. 5 has N = 6)")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSONL file; the figures go beside it")
    parser.add_argument("--force", action="store_true", help="rerun configurations already in the results file")
    parser.add_argument(
        "--report",
        action="store_true",
        help="tables and figures from the results file, no runs: the records the other options select",
    )
    args = parser.parse_args()
    figures = [int(f) for f in args.figures.split(",")]
    datasets = args.datasets.split(",")
    unknown = set(datasets) - set(DATASETS)
    if unknown:
        parser.error(f"unknown datasets {sorted(unknown)}; known: {', '.join(DATASETS)}")
    chosen = configurations(
        figures, datasets, [int(k) for k in args.agents.split(",")], [int(n) for n in args.particles.split(",")]
    )
    args.results.parent.mkdir(parents=True, exist_ok=True)
    wanted = [key({**dataclasses.asdict(c), "trials": args.trials, "rounds": args.rounds}) for c in chosen]
    if not args.report:
        done = read(args.results)
        for configuration, configuration_key in zip(chosen, wanted):
            if configuration_key in done and not args.force:
                print(f"skipped (in {args.results}): {configuration}", flush=True)
                continue
            record = run_configuration(configuration, args.trials, args.rounds)
            with args.results.open("a") as out:
                out.write(json.dumps(record) + "\n")
            print(table(record), flush=True)
    records = read(args.results)
    report([records[k] for k in wanted if k in records], args.results.parent, tables=args.report)


if __name__ == "__main__":
    main()
