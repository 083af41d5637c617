"""Reproduce BayesADMM's Table 1 row (FMNIST-10%, MLP 784-200-100-10 sigmoid, 10 clients) through
the real local federation: a SuperLink and one SuperNode process per client, gRPC on loopback.

For each split (iid = "homogeneous", dirichlet = "heterogeneous") and strategy it runs
`fedbayes local` on identical splits (same seed), writes every round to
benchmarks/results/table1/<split>-<strategy>-seed<seed>.jsonl, prints accuracy and NLL at rounds
10/25/50 (the paper's metric: mean over rounds t-2..t) next to the paper's numbers, and plots accuracy
and NLL against the round.

    python benchmarks/reproduce_table1.py --splits dirichlet --strategies bayesadmm,fedavg --seed 0

Tuning runs (`--tag NAME --set key=value ...`, the overrides on top of the presets) go to
benchmarks/results/table1/tuning/ with their own summary, so they never replace the reference runs.

FedDyn, FedLap, FedLap-Cov and FedLap-Func (docs/algorithms/feddyn.md) run with Adam 1e-3 and 5 local epochs
like FedAvg; FedDyn α = 1e-2, wd = 1e-4; FedLap/FedLap-Cov/FedLap-Func δ = 1 (one point of [P]'s grids each, not
swept; FedLap-Func at its defaults otherwise):

    python benchmarks/reproduce_table1.py --splits dirichlet,iid --strategies feddyn,fedlap-cov,fedlap

BayesADMM runs with the run config's default `noise=shared` (every client draws IVON's weight noise and its
minibatch order from the run seed in every round, as the reference code does); the earlier rows with fresh numbers
per client and round are `--tag independent --set noise=independent`.

Hyperparameters: BayesADMM uses the reference configuration (docs/algorithms/bayesadmm.md),
which feeds raw 0-255 pixels (input-scale=255); FedAvg/FedProx use Adam 1e-3 on [0, 1] pixels with
5 local epochs, their usual good setting, not tuned down. FedPA (heterogeneous split only) uses
FedAvg's client and server setting, with 10 burn-in rounds and shrinkage ρ = 0.1 (spec fedpa.md §6.3).

Other setups (`--setup`, results in benchmarks/results/<setup>/; heterogeneous split, 10 clients, batch 64):
  cifar10-zenke, cifar10-acar   Table 1's CIFAR-10 rows (CNN of Zenke et al. / of Acar et al.), 50 rounds
  cifar100-resnet20             Table 2's CIFAR-100 row (ResNet-20 with FRN), rounds 25/50/100
  fmnist-acar                   the Acar CNN on FMNIST-10% (1x28x28): what a CPU machine affords
  fmnist-100                    Table 1's 100-client row: full FMNIST, heterogeneous, MLP, batch 32, the authors'
                                100-client IVON setting; Flower's simulation engine (Ray), 100 virtual clients
  fmnist-100-two-class          Table 2's 100-client row with FMNIST for MNIST: 2 classes of 300 examples per client
                                (--splits two-class), 100 rounds, the authors' MNIST configuration; Ray as fmnist-100
  fmnist-100-paper              fmnist-100 with every method under the paper's protocol (bayesadmm-paper's
                                settings: raw 0-255 pixels, the baselines' 10 or 5 local epochs); Ray as fmnist-100
  bayesadmm-paper               Table 1's FMNIST-10% rows under the paper's protocol (`fedbayes presets
                                bayesadmm-paper`): every method on the raw 0-255 pixels of the authors' code, the
                                baselines with 10 local epochs (FedDyn, FedLap 5); both splits (fmnist-mlp: [0, 1])
  fedlap-paper                  [P]'s FedLap-Func rows of Table 1 (`fedbayes presets fedlap-paper`), FedLap's beside
CIFAR needs the torchvision folder (`--data-root DIR`, cifar-10-batches-py / cifar-100-python inside; these
machines cannot download it). BayesADMM uses the authors' IVON configuration of each setup
(configs/{cifar10_zenke,cifar10_acar,cifar100_resnet20}/fedivon.yaml: 25 local epochs, cosine), the baselines
their Adam configuration (fedavg/feddyn/fedprox.yaml: lr 1e-4 and gradient clipping 10 for the Acar CNN,
lr 1e-3 for ResNet-20); pixels in [0, 1], no augmentation, as in their data generator:

    python benchmarks/reproduce_table1.py --setup cifar10-acar --data-root /data/cifar --strategies bayesadmm,fedavg
    python benchmarks/reproduce_table1.py --setup fmnist-acar --splits dirichlet --strategies bayesadmm,fedavg,feddyn \
        --rounds 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedbayes.deploy.flower_app import toml_value, write_app
from fedbayes.deploy.launcher import (
    APP,
    LocalRun,
    check_run_config,
    check_workdir,
    parse_override,
    run_local,
)
from fedbayes.deploy.presets import get_preset
from fedbayes.deploy.processes import stop_processes_on_signals

RESULTS = Path(__file__).resolve().parent / "results" / "table1"
BAYESADMM_PAPER, FEDLAP_PAPER = get_preset("bayesadmm-paper"), get_preset("fedlap-paper")
REPORT_ROUNDS = (10, 25, 50)

COMMON = {"model": "mlp", "hidden": "200,100", "activation": "sigmoid", "batch-size": 32}
PRESETS = {
    ("bayesadmm", "dirichlet"): {
        "local-epochs": 10,
        "lr": 5e-5,
        "hess-init": 1e-3,
        "temperature": 1e-3,
        "prior-precision": 1.0,
        "dual-damping": 1e-3,
        "rho": 0.2,
        "beta2": 0.9998,
        "lr-schedule": "cosine",
        "input-scale": 255.0,
    },
    ("bayesadmm", "iid"): {
        "local-epochs": 10,
        "lr": 5e-5,
        "hess-init": 1e-3,
        "temperature": 1e-3,
        "prior-precision": 0.5,
        "dual-damping": 1e-3,
        "rho": 0.1,
        "beta2": 0.9998,
        "lr-schedule": "constant",
        "input-scale": 255.0,
    },
    ("fedavg", "dirichlet"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam"},
    ("fedavg", "iid"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam"},
    ("fedprox", "dirichlet"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam", "proximal-mu": 0.01},
    ("fedprox", "iid"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam", "proximal-mu": 0.01},
    # FedDyn / FedLap / FedLap-Cov ([P] App. E.5 grids, one point each, not swept here): Adam 1e-3, 5 epochs; the
    # paper's site damping ρ_k for every coordinate ([P] App. E; our default damps only the cavity's share since).
    **{
        (strategy, split): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam", **preset}
        for split in ("dirichlet", "iid")
        for strategy, preset in (
            ("feddyn", {"feddyn-alpha": 0.01, "weight-decay": 1e-4}),
            ("fedlap", {"prior-precision": 1.0, "site-damping-rule": "paper"}),
            ("fedlap-cov", {"prior-precision": 1.0, "site-damping-rule": "paper"}),
            ("fedlap-func", {"prior-precision": 1.0}),
        )
    },
    # FedPA reuses FedAvg's client setting (the paper's protocol, §5.1) and FedAvg's server (SGD, lr 1):
    # 10 FedAvg rounds, then 1 discarded + 4 sampled epochs per round (the same 5 epochs), ρ = 0.1.
    ("fedpa", "dirichlet"): {
        "local-epochs": 5,
        "lr": 1e-3,
        "optimizer": "adam",
        "burn-in-rounds": 10,
        "samples": 4,
        "local-burnin-epochs": 1,
        "shrinkage": 0.1,
        "server-optimizer": "sgd",
        "server-lr": 1.0,
    },
}

# Paper Table 1 (FMNIST-10%, 10 clients), accuracy % at rounds 10/25/50; heterogeneous NLL where given.
PAPER_ACCURACY = {
    ("iid", "fedavg"): (72.3, 77.7, 80.0),
    ("iid", "fedprox"): (72.2, 77.4, 80.3),
    ("iid", "bayesadmm@mean"): (80.4, 83.1, 83.4),
    ("iid", "bayesadmm"): (80.6, 83.5, 84.1),
    ("dirichlet", "fedavg"): (70.4, 74.3, 76.0),
    ("dirichlet", "fedprox"): (69.9, 74.7, 76.9),
    ("dirichlet", "bayesadmm@mean"): (77.0, 81.4, 82.1),
    ("dirichlet", "bayesadmm"): (77.0, 81.5, 82.3),
    ("iid", "feddyn"): (75.3, 77.5, 78.2),
    ("iid", "fedlap"): (72.1, 77.1, 80.2),
    ("iid", "fedlap-cov"): (75.0, 79.8, 81.8),
    ("dirichlet", "feddyn"): (73.0, 74.6, 74.6),
    ("dirichlet", "fedlap"): (71.3, 74.3, 77.6),
    ("dirichlet", "fedlap-cov"): (74.6, 78.3, 80.5),
}
# NLL: BayesADMM's paper [C] Table 1 (FedDyn/FedLap rows taken from Swaroop et al.).
PAPER_NLL = {
    ("dirichlet", "fedavg"): (0.78, 0.72, 0.67),
    ("dirichlet", "bayesadmm"): (0.65, 0.52, 0.50),
    ("iid", "fedavg"): (0.70, 0.61, 0.56),
    ("iid", "feddyn"): (0.67, 0.63, 0.63),
    ("iid", "fedlap"): (0.71, 0.62, 0.57),
    ("iid", "fedlap-cov"): (0.67, 0.59, 0.56),
    ("dirichlet", "feddyn"): (0.75, 0.70, 0.77),
    ("dirichlet", "fedlap"): (0.75, 0.71, 0.65),
    ("dirichlet", "fedlap-cov"): (0.70, 0.63, 0.60),
}


# The authors' per-setup configurations (team-approx-bayes/bayes-admm configs/*/fedivon.yaml and the baselines'
# yaml files); "dirichlet" is their heterogeneous split (Dir(1) sizes, Dir(0.5) classes).
_IVON = {"temperature": 0.1, "dual-damping": 0.1, "beta1": 0.9, "lr-schedule": "cosine", "local-epochs": 25}
CNN_PRESETS = {
    "cifar10-zenke": {
        ("bayesadmm", "dirichlet"): {
            **_IVON,
            "lr": 1e-3,
            "hess-init": 0.02,
            "prior-precision": 100.0,
            "rho": 0.5,
            "beta2": 0.99999,
        },
        ("fedavg", "dirichlet"): {"local-epochs": 10, "lr": 1e-3, "optimizer": "adam"},
        ("feddyn", "dirichlet"): {
            "local-epochs": 10,
            "lr": 1e-3,
            "optimizer": "adam",
            "feddyn-alpha": 0.01,
            "weight-decay": 1e-4,
        },
    },
    "cifar10-acar": {
        ("bayesadmm", "dirichlet"): {
            **_IVON,
            "lr": 5e-3,
            "hess-init": 0.1,
            "prior-precision": 0.5,
            "rho": 1.0,
            "beta2": 0.99998,
        },
        ("fedavg", "dirichlet"): {"local-epochs": 10, "lr": 1e-4, "optimizer": "adam", "max-grad-norm": 10.0},
        ("fedprox", "dirichlet"): {
            "local-epochs": 20,
            "lr": 1e-4,
            "optimizer": "adam",
            "proximal-mu": 1e-3,
            "max-grad-norm": 10.0,
        },
        ("feddyn", "dirichlet"): {
            "local-epochs": 20,
            "lr": 1e-4,
            "optimizer": "adam",
            "feddyn-alpha": 1e-6,
            "weight-decay": 1e-4,
            "max-grad-norm": 10.0,
        },
    },
    "cifar100-resnet20": {
        ("bayesadmm", "dirichlet"): {
            **_IVON,
            "lr": 1e-3,
            "hess-init": 0.1,
            "prior-precision": 0.5,
            "rho": 0.5,
            "beta2": 0.99999,
        },
        ("fedavg", "dirichlet"): {"local-epochs": 5, "lr": 1e-3, "optimizer": "adam"},
        ("feddyn", "dirichlet"): {
            "local-epochs": 10,
            "lr": 1e-3,
            "optimizer": "adam",
            "feddyn-alpha": 1e-4,
            "weight-decay": 1e-4,
        },
    },
}
# FMNIST-10% with the Acar CNN, sized for a CPU run: 2 local epochs (instead of 25 on CIFAR, 10 on the MLP), batch 64.
# BayesADMM takes the FMNIST-10% heterogeneous IVON setting of the MLP rows (τ 1e-3, h0 1e-3, δ 1, ρ 0.2, damping
# 1e-3, β2 0.9998, cosine) on [0, 1] pixels with lr 5e-4: the CIFAR-10 Acar setting (τ 0.1) leaves the CNN at chance
# for rounds at 600 examples per client (its weight noise 1/√(ess·(h+δ)) is as large as the weights), and lr 1e-3
# diverged in round 2 (a few one-client trials, not a sweep). A 4-sample ensemble (each sample is one more pass over
# the 10,000 test images). The baselines: Adam 1e-3 as on the MLP rows.
CNN_PRESETS["fmnist-acar"] = {
    ("bayesadmm", "dirichlet"): {
        "local-epochs": 2,
        "lr": 5e-4,
        "hess-init": 1e-3,
        "temperature": 1e-3,
        "prior-precision": 1.0,
        "dual-damping": 1e-3,
        "rho": 0.2,
        "beta2": 0.9998,
        "lr-schedule": "cosine",
        "ensemble-samples": 4,
    },
    ("fedavg", "dirichlet"): {"local-epochs": 2, "lr": 1e-3, "optimizer": "adam"},
    ("feddyn", "dirichlet"): {
        "local-epochs": 2,
        "lr": 1e-3,
        "optimizer": "adam",
        "feddyn-alpha": 0.01,
        "weight-decay": 1e-4,
    },
}

# The 100-client FMNIST row: the authors' configuration for it (docs/algorithms/bayesadmm.md: h0 5e-4, δ 0.1,
# ρ 0.1, β2 0.9999, cosine; 10 local epochs on raw pixels) and FedAvg's 10-client setting.
PRESETS_100 = {
    ("bayesadmm", "dirichlet"): {
        **PRESETS[("bayesadmm", "dirichlet")],
        "hess-init": 5e-4,
        "prior-precision": 0.1,
        "rho": 0.1,
        "beta2": 0.9999,
    },
    # The baselines keep their 10-client rows' settings ([P] App. E.5 names no 100-client ones).
    **{(strategy, "dirichlet"): PRESETS[(strategy, "dirichlet")] for strategy in ("fedavg", "feddyn", "fedlap-cov")},
}

# Table 2's 100-client row on FMNIST instead of MNIST (not on these machines): full FMNIST, 2 classes of 300 examples
# per client ([39]'s split, `--split two-class`), batch 64, [0, 1] pixels as in the authors' MNIST pickle. The
# authors' configuration of that row (configs/mnist_heterog/fedivon.yaml, fedavg.yaml): IVON lr 0.02, h0 5e-3,
# τ 1e-2, δ 1e-2, damping 0.1, ρ 5, β2 0.9998, cosine, 10 local epochs; FedAvg Adam 1e-3, 10 local epochs.
PRESETS_100_TWO_CLASS = {
    ("bayesadmm", "two-class"): {
        "local-epochs": 10,
        "lr": 0.02,
        "hess-init": 5e-3,
        "temperature": 1e-2,
        "prior-precision": 1e-2,
        "dual-damping": 0.1,
        "rho": 5.0,
        "beta2": 0.9998,
        "lr-schedule": "cosine",
    },
    ("fedavg", "two-class"): {"local-epochs": 10, "lr": 1e-3, "optimizer": "adam"},
}


@dataclass(frozen=True)
class Setup:
    dataset: str
    fraction: float
    common: dict
    presets: dict
    report_rounds: tuple[int, ...] = REPORT_ROUNDS
    paper_accuracy: dict = field(default_factory=dict)
    paper_nll: dict = field(default_factory=dict)
    clients: int = 10
    engine: str = "deployment"  # deployment: `fedbayes local` (a SuperNode process per client); simulation: Ray


# Paper Table 1's 100-client FMNIST row, accuracy % and NLL at rounds 10 / 25 / 50.
FMNIST_100_PAPER_ACCURACY = {
    ("dirichlet", "bayesadmm@mean"): (78.7, 82.2, 82.9),
    ("dirichlet", "bayesadmm"): (78.7, 82.3, 83.0),
    ("dirichlet", "fedavg"): (73.9, 78.7, 81.8),
    ("dirichlet", "fedprox"): (73.3, 78.4, 81.6),
    ("dirichlet", "feddyn"): (75.7, 81.4, 82.2),
    ("dirichlet", "fedlap-cov"): (76.9, 81.3, 83.0),
}
FMNIST_100_PAPER_NLL = {("dirichlet", "bayesadmm"): (0.62, 0.50, 0.48), ("dirichlet", "fedavg"): (0.73, 0.60, 0.53)}

# The tables average the last three rounds before each reported round, on the whole test set: evaluate every round
# in full (a CNN's defaults evaluate every 5th round on a tenth of it, server/evaluation.py).
_CNN = {"batch-size": 64, "eval-every": 1, "eval-fraction": 1.0}
SETUPS = {
    "fmnist-mlp": Setup("fmnist", 0.1, COMMON, PRESETS, paper_accuracy=PAPER_ACCURACY, paper_nll=PAPER_NLL),
    "fmnist-acar": Setup("fmnist", 0.1, {**_CNN, "model": "cnn-acar"}, CNN_PRESETS["fmnist-acar"]),
    # Paper Table 1's 100-client row (full FMNIST, heterogeneous, MLP, batch 32). Chosen when 100 SuperNodes each had
    # a warm executor of its own (~0.8 GiB RSS each, benchmarks/memory.py), which did not fit in 24 GB: Flower's
    # simulation engine runs the 100 virtual clients, one Ray actor per core (client-resources-num-cpus=1; Flower's
    # default, 2, ran one at a time here).
    # Ray trains the virtual clients a core at a time, so a round takes the sum of their training over the cores:
    # round-timeout is raised from 600 s (a first try on a loaded machine accepted 24 of 100 replies in time).
    "fmnist-100": Setup(
        "fmnist",
        1.0,
        {**COMMON, "round-timeout": 3600.0},
        PRESETS_100,
        clients=100,
        engine="simulation",
        paper_accuracy=FMNIST_100_PAPER_ACCURACY,
        paper_nll=FMNIST_100_PAPER_NLL,
    ),
    # The same row with every method under the paper's protocol (`fedbayes presets bayesadmm-paper` at 100 clients:
    # raw 0-255 pixels, the baselines' epochs); BayesADMM's preset is already the authors' 100-client one.
    "fmnist-100-paper": Setup(
        "fmnist",
        1.0,
        {"round-timeout": 3600.0},
        {
            ("bayesadmm", "dirichlet"): {**COMMON, **PRESETS_100[("bayesadmm", "dirichlet")]},
            **{
                (strategy, "dirichlet"): BAYESADMM_PAPER.run_config(strategy, "dirichlet", 100)
                for strategy in ("fedavg", "fedprox", "feddyn", "fedlap-cov")
            },
        },
        clients=100,
        engine="simulation",
        paper_accuracy=FMNIST_100_PAPER_ACCURACY,
        paper_nll=FMNIST_100_PAPER_NLL,
    ),
    # Table 2's substitute: the paper's numbers beside it are MNIST's (FMNIST is the harder set; compare the order of
    # the methods and their gaps, not the levels).
    "fmnist-100-two-class": Setup(
        "fmnist",
        1.0,
        {**COMMON, "batch-size": 64, "round-timeout": 3600.0},
        PRESETS_100_TWO_CLASS,
        report_rounds=(25, 50, 100),
        clients=100,
        engine="simulation",
        paper_accuracy={
            ("two-class", "fedavg"): (89.4, 91.8, 94.1),
            ("two-class", "bayesadmm@mean"): (88.8, 93.6, 95.6),
            ("two-class", "bayesadmm"): (88.9, 93.5, 95.5),
        },
        paper_nll={
            ("two-class", "fedavg"): (0.67, 0.41, 0.24),
            ("two-class", "bayesadmm@mean"): (0.39, 0.22, 0.15),
            ("two-class", "bayesadmm"): (0.40, 0.22, 0.15),
        },
    ),
    # The same rows as fmnist-mlp under the paper's own protocol (deploy/presets.toml): what the paper's numbers are
    # comparable with.
    "bayesadmm-paper": Setup(
        BAYESADMM_PAPER.dataset,
        BAYESADMM_PAPER.fraction,
        {},
        {
            (strategy, split): BAYESADMM_PAPER.run_config(strategy, split, BAYESADMM_PAPER.clients)
            for strategy in BAYESADMM_PAPER.strategies
            for split in BAYESADMM_PAPER.splits
        },
        paper_accuracy=PAPER_ACCURACY,
        paper_nll=PAPER_NLL,
    ),
    # FedLap-Func's rows under [P]'s protocol (`fedbayes presets fedlap-paper`: the preset's FedLap point with App.
    # E.5's memory and server fit), FedLap's beside; App. E.5's 2 points per class: --tag two-points --set
    # memory-points-per-class=2 (its paper rows, which this table does not print: 74.0 / 77.8 / 80.1 homogeneous,
    # 73.2 / 76.1 / 78.4 heterogeneous).
    "fedlap-paper": Setup(
        FEDLAP_PAPER.dataset,
        FEDLAP_PAPER.fraction,
        {},
        {
            (strategy, split): FEDLAP_PAPER.run_config(strategy, split, FEDLAP_PAPER.clients)
            for strategy in ("fedlap", "fedlap-func")
            for split in FEDLAP_PAPER.splits
        },
        paper_accuracy={
            **PAPER_ACCURACY,
            ("iid", "fedlap-func"): (73.7, 77.9, 80.0),
            ("dirichlet", "fedlap-func"): (72.2, 75.4, 78.1),
        },
        paper_nll=PAPER_NLL,
    ),
    # Paper Table 1 (CIFAR-10 heterogeneous, 10 clients) and Table 2 (CIFAR-100), accuracy % and NLL.
    "cifar10-zenke": Setup(
        "cifar10",
        1.0,
        {**_CNN, "model": "cnn-zenke"},
        CNN_PRESETS["cifar10-zenke"],
        paper_accuracy={
            ("dirichlet", "bayesadmm"): (71.5, 79.0, 80.3),
            ("dirichlet", "bayesadmm@mean"): (71.5, 78.9, 80.3),
            ("dirichlet", "fedavg"): (73.8, 75.0, 75.1),
            ("dirichlet", "feddyn"): (72.7, 77.4, 79.4),
        },
        paper_nll={
            ("dirichlet", "bayesadmm"): (0.8, 0.6, 0.6),
            ("dirichlet", "fedavg"): (0.9, 1.1, 1.5),
            ("dirichlet", "feddyn"): (1.0, 0.8, 0.7),
        },
    ),
    "cifar10-acar": Setup(
        "cifar10",
        1.0,
        {**_CNN, "model": "cnn-acar"},
        CNN_PRESETS["cifar10-acar"],
        paper_accuracy={
            ("dirichlet", "bayesadmm"): (63.8, 69.5, 70.3),
            ("dirichlet", "bayesadmm@mean"): (63.8, 69.5, 70.2),
            ("dirichlet", "fedavg"): (62.8, 65.4, 66.0),
            ("dirichlet", "fedprox"): (64.3, 65.9, 66.3),
            ("dirichlet", "feddyn"): (63.6, 64.7, 65.4),
        },
        paper_nll={
            ("dirichlet", "bayesadmm"): (1.0, 1.0, 1.4),
            ("dirichlet", "fedavg"): (1.1, 1.8, 2.3),
            ("dirichlet", "fedprox"): (1.7, 2.2, 2.6),
            ("dirichlet", "feddyn"): (2.0, 3.6, 2.6),
        },
    ),
    "cifar100-resnet20": Setup(
        "cifar100",
        1.0,
        {**_CNN, "model": "resnet20"},
        CNN_PRESETS["cifar100-resnet20"],
        report_rounds=(25, 50, 100),
        paper_accuracy={
            ("dirichlet", "bayesadmm"): (40.0, 46.2, 46.6),
            ("dirichlet", "fedavg"): (39.8, 39.8, 39.3),
            ("dirichlet", "feddyn"): (38.4, 39.2, 39.6),
        },
        paper_nll={("dirichlet", "fedavg"): (2.6, 3.3, 4.0), ("dirichlet", "feddyn"): (3.5, 3.2, 3.2)},
    ),
}


def results_dir(setup: str, tag: str) -> Path:
    base = RESULTS if setup == "fmnist-mlp" else RESULTS.parent / setup
    return base / "tuning" if tag else base


def run_name(split: str, strategy: str, seed: int, tag: str) -> str:
    return f"{split}-{strategy}{'-' + tag if tag else ''}-seed{seed}"


def run(setup: str, strategy: str, split: str, args: argparse.Namespace, extra: dict) -> dict:
    spec = SETUPS[setup]
    if (strategy, split) not in spec.presets:
        raise SystemExit(
            f"setup {setup!r} has no preset for {strategy} on the {split} split; "
            f"it has {', '.join(f'{s}/{p}' for s, p in spec.presets)}"
        )
    name = run_name(split, strategy, args.seed, args.tag)
    data = {"data-root": args.data_root} if args.data_root else {}
    started = time.monotonic()
    local_run = LocalRun(
        strategy=strategy,
        clients=args.clients or spec.clients,
        rounds=args.rounds,
        dataset=spec.dataset,
        fraction=spec.fraction,
        split=split,
        seed=args.seed,
        results=results_dir(setup, args.tag) / f"{name}.jsonl",
        workdir=Path("runs") / run_directory(setup, name, spec.engine),
        overrides={
            **spec.common,
            **spec.presets[(strategy, split)],
            **data,
            **extra,
            "results-exists": "replace",
        },  # a rerun of a run replaces its rows
    )
    if spec.engine == "deployment":
        if args.stop_after or args.resume:
            raise SystemExit("--stop-after and --resume are for the simulation setups (fmnist-100*)")
        rows = run_local(local_run)
    else:
        rows = run_simulated(local_run, args.stop_after, args.resume)
    return {
        "strategy": strategy,
        "split": split,
        "seed": args.seed,
        "tag": args.tag,
        "overrides": extra,
        "rows": rows,
        "wall_seconds": time.monotonic() - started,
        "rounds_run": len(rows),
        "rounds_planned": args.rounds,
    }


def run_directory(setup: str, name: str, engine: str) -> str:
    """A run's workdir under runs/: a simulation's is named by its setup and run alone, so that `--resume` finds it;
    a deployment run's is new every time."""
    if engine == "simulation":
        return f"{setup}-{name}"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{'table1' if setup == 'fmnist-mlp' else setup}-{name}"


def run_simulated(spec: LocalRun, stop_after: int = 0, resume: bool = False) -> list[dict]:
    """The same run config under Flower's simulation engine: `fedbayes run <app> local` with `spec.clients` virtual
    clients (Ray), client state and server checkpoints under the run's workdir; the rows the ServerApp wrote.
    `stop_after` > 0 interrupts the run (Ctrl-C: `fedbayes run` stops all it started) once that many rounds are
    written: rounds 1..stop_after of a `spec.rounds`-round run, whose cosine schedule spans all of them; the
    federation's checkpoint stays in the workdir. An interrupted run (stop_after, Ctrl-C, a machine that went away)
    continues from its last checkpoint with `resume`: the ServerApp keeps the rows up to it and the clients their
    state; `fedbayes run` refuses it if the settings differ from the checkpoint's."""
    workdir, results = spec.workdir.resolve(), spec.results.resolve()
    try:
        check_workdir(workdir, resume=resume)
    except ValueError as refused:  # its --workdir is this script's runs/<setup>-<run>/, its --resume is ours
        raise SystemExit(str(refused).replace("--workdir ", "", 1)) from None
    run_config = {**spec.run_config(workdir, results), "server-state-dir": str(workdir / "server-state")}
    check_run_config(run_config, spec.clients, new_federation=not resume)
    if not resume:
        results.unlink(missing_ok=True)
    workdir.mkdir(parents=True, exist_ok=resume)
    config_file = workdir / "run-config.toml"
    config_file.write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items()))
    app = write_app(workdir / APP, spec.strategy)
    env = {**os.environ, "FLWR_HOME": str(workdir / "flwr-home"), "FEDBAYES_STATE_DIR": str(workdir / "client-state")}
    command = [
        str(Path(sys.executable).with_name("fedbayes")),
        "run",
        str(app),
        "local",
        "--stream",
        "--federation-config",
        f"num-supernodes={spec.clients} client-resources-num-cpus=1",
        "-c",
        str(config_file),
    ]
    print(f"simulation: {spec.clients} virtual clients, log in {workdir / 'simulation.log'}", flush=True)
    with open(workdir / "simulation.log", "a" if resume else "w") as log:
        run = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while run.poll() is None:
                time.sleep(5)
                if stop_after and len(_rows(results)) >= stop_after:
                    break
        finally:  # also when this script is interrupted: else `fedbayes run` and its Ray cluster outlive it
            if run.poll() is None:
                run.send_signal(signal.SIGINT)  # Ctrl-C: `fedbayes run` stops everything it started
                run.wait()
        if stop_after and len(_rows(results)) >= stop_after:
            return _rows(results)[:stop_after]
    rows = _rows(results)
    if run.returncode != 0 or len(rows) != spec.rounds:
        raise SystemExit(
            f"the simulation ended after {len(rows)} of {spec.rounds} rounds (exit {run.returncode}); "
            f"see {workdir / 'simulation.log'}"
        )
    return rows


def _rows(results: Path) -> list[dict]:
    lines = results.read_text().splitlines() if results.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]  # a row being written is not yet one


def last_three(rows: list[dict], round_: int, key: str) -> float | None:
    values = [row[key] for row in rows if round_ - 2 <= row["round"] <= round_ and key in row]
    return sum(values) / len(values) if len(values) == 3 else None


def table(runs: list[dict], setup: str = "fmnist-mlp") -> str:
    spec = SETUPS[setup]
    at = "/".join(str(r) for r in spec.report_rounds)
    lines = [
        f"{'split':<10} {'method':<16} {f'acc@{at} (ours)':<22} {'paper':<18} {f'nll@{at} (ours)':<22} "
        f"{'paper nll':<16} wall"
    ]
    for result in runs:
        variants = [("", result["strategy"])]
        if result["strategy"] == "bayesadmm":
            variants = [("", "bayesadmm@mean"), ("_ensemble", "bayesadmm")]
        tag = f" [{result['tag']}]" if result.get("tag") else ""
        for suffix, method in variants:
            accuracy = [last_three(result["rows"], r, f"accuracy{suffix}") for r in spec.report_rounds]
            nll = [last_three(result["rows"], r, f"nll{suffix}") for r in spec.report_rounds]
            paper = spec.paper_accuracy.get((result["split"], method))
            paper_nll = spec.paper_nll.get((result["split"], method))
            lines.append(
                f"{result['split']:<10} {method + tag:<16} {_fmt(accuracy, 100, 1):<22} {_fmt(paper, 1, 1):<18} "
                f"{_fmt(nll, 1, 3):<22} {_fmt(paper_nll, 1, 2):<16} {result['wall_seconds'] / 60:.1f} min"
            )
    return "\n".join(lines)


def per_round(runs: list[dict]) -> str:
    """Every round of every run: accuracy, NLL, ECE (and the ensemble's, where there is one), seconds."""
    lines = []
    for result in runs:
        ensemble = "accuracy_ensemble" in result["rows"][0]
        lines.append(
            f"{result['split']} {result['strategy']}: round  acc    nll    ece"
            + ("   | ens acc  nll    ece" if ensemble else "")
            + "   round_s"
        )
        for row in result["rows"]:
            line = f"  {row['round']:>5}  {row['accuracy']:.4f} {row['nll']:.4f} {row['ece']:.4f}"
            if ensemble:
                line += f" | {row['accuracy_ensemble']:.4f} {row['nll_ensemble']:.4f} {row['ece_ensemble']:.4f}"
            lines.append(line + f"  {row['round_seconds']:.1f}")
    return "\n".join(lines)


def _fmt(values, scale: float, digits: int) -> str:
    if values is None:
        return "-"
    return " / ".join("-" if v is None else f"{v * scale:.{digits}f}" for v in values)


def plot(runs: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    for result in runs:
        rounds = [row["round"] for row in result["rows"]]
        label = f"{result['split']} {result['strategy']}"
        for axis, key in zip(axes, ("accuracy", "nll", "ece")):
            axis.plot(rounds, [row[key] for row in result["rows"]], label=label + " @mean")
            if f"{key}_ensemble" in result["rows"][0]:
                axis.plot(rounds, [row[f"{key}_ensemble"] for row in result["rows"]], "--", label=label + " ensemble")
    axes[0].set(xlabel="round", ylabel="test accuracy", title=title)
    axes[1].set(xlabel="round", ylabel="test NLL")
    axes[2].set(xlabel="round", ylabel="test ECE (15 bins)")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def plot_path(setup: str, seed: int) -> Path:
    return (
        RESULTS / f"table1-seed{seed}.png"
        if setup == "fmnist-mlp"
        else results_dir(setup, "") / f"{setup}-seed{seed}.png"
    )


def runs_on_disk(setup: str, seed: int, tag: str, splits: list[str], strategies: list[str]) -> list[dict]:
    """The runs of `seed` recorded in the setup's summary, with their rows, in the order of `splits` x `strategies`."""
    directory = results_dir(setup, tag)
    summary_path = directory / f"summary-seed{seed}.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else []
    walls = {(r["split"], r["strategy"], r.get("tag", "")): r["wall_seconds"] for r in summary}
    runs = []
    for split in splits:
        for strategy in strategies:
            path = directory / f"{run_name(split, strategy, seed, tag)}.jsonl"
            if path.exists() and (split, strategy, tag) in walls:
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                runs.append(
                    {
                        "strategy": strategy,
                        "split": split,
                        "seed": seed,
                        "tag": tag,
                        "rows": rows,
                        "wall_seconds": walls[(split, strategy, tag)],
                    }
                )
    return runs


def plot_seed(setup: str, seed: int) -> None:
    """The seed's plot with every run on disk, so that a run of one strategy does not replace the others' curves."""
    splits = list(dict.fromkeys(split for _, split in SETUPS[setup].presets))
    strategies = list(dict.fromkeys(strategy for strategy, _ in SETUPS[setup].presets))
    plot(runs_on_disk(setup, seed, "", splits, strategies), plot_path(setup, seed), setup)


def report(args: argparse.Namespace) -> None:
    runs = runs_on_disk(args.setup, args.seed, args.tag, args.splits.split(","), args.strategies.split(","))
    print(table(runs, args.setup))
    if args.setup != "fmnist-mlp":
        print(per_round(runs))
    if not args.tag:
        plot_seed(args.setup, args.seed)


def seed_table(args: argparse.Namespace) -> str:
    """Mean ± standard deviation over `--seeds` of the paper's metric (mean of rounds t-2..t) at its report rounds,
    for every split and strategy with a run of each seed on disk (the paper reports 3 seeds so)."""
    spec, directory = SETUPS[args.setup], results_dir(args.setup, args.tag)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    lines = [
        f"{'split':<10} {'method':<16} {'metric':<9} "
        + " ".join(f"{f'round {r}':<15}" for r in spec.report_rounds)
        + f"  seeds {args.seeds}"
    ]
    for split in args.splits.split(","):
        for strategy in args.strategies.split(","):
            paths = [directory / f"{run_name(split, strategy, seed, args.tag)}.jsonl" for seed in seeds]
            if not all(path.exists() for path in paths):
                continue
            runs = [[json.loads(line) for line in path.read_text().splitlines() if line.strip()] for path in paths]
            suffixes = (
                [("", "bayesadmm@mean"), ("_ensemble", "bayesadmm")] if strategy == "bayesadmm" else [("", strategy)]
            )
            for suffix, method in suffixes:
                for metric, scale, digits in (("accuracy", 100, 1), ("nll", 1, 3)):
                    cells = []
                    for round_ in spec.report_rounds:
                        values = [last_three(rows, round_, metric + suffix) for rows in runs]
                        if None in values:
                            cells.append("-")
                            continue
                        mean = statistics.fmean(values) * scale
                        spread = statistics.stdev(values) * scale if len(values) > 1 else 0.0
                        cells.append(f"{mean:.{digits}f} ± {spread:.{digits}f}")
                    lines.append(f"{split:<10} {method:<16} {metric:<9} " + " ".join(f"{c:<15}" for c in cells))
    return "\n".join(lines)


def record_summary(result: dict, path: Path) -> None:
    """Add one run (without its rows) to the seed's summary, replacing an earlier run of the same pair."""
    summary = json.loads(path.read_text()) if path.exists() else []
    key = (result["split"], result["strategy"], result.get("tag", ""))
    summary = [r for r in summary if (r["split"], r["strategy"], r.get("tag", "")) != key]
    summary.append({k: v for k, v in result.items() if k != "rows"})
    path.write_text(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", default="fmnist-mlp", choices=list(SETUPS))
    parser.add_argument("--strategies", default="bayesadmm,fedavg,fedprox")
    parser.add_argument("--splits", default="dirichlet,iid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument(
        "--stop-after",
        type=int,
        default=0,
        metavar="R",
        help="simulation setups: stop after R of the --rounds rounds (the schedule spans --rounds)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="simulation setups: continue each run from its checkpoint in runs/<setup>-<run>/ (after --stop-after, "
        "Ctrl-C or a lost machine)",
    )
    parser.add_argument("--clients", type=int, default=0, help="default: the setup's (10; fmnist-100: 100)")
    parser.add_argument("--data-root", default="", help="torchvision dataset folder (CIFAR setups)")
    parser.add_argument("--report", action="store_true", help="only tabulate and plot the runs already on disk")
    parser.add_argument(
        "--seeds", default="", metavar="0,1,2", help="with --report: mean ± standard deviation over these seeds' runs"
    )
    parser.add_argument("--tag", default="", help="a tuning run's name (results go to <results>/tuning/)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset value")
    args = parser.parse_args()
    if SETUPS[args.setup].dataset.startswith("cifar") and not args.data_root:
        parser.error(
            f"--setup {args.setup} needs --data-root: a torchvision folder holding CIFAR "
            "(these machines cannot download it)"
        )
    if args.report:
        print(seed_table(args)) if args.seeds else report(args)
        return
    stop_processes_on_signals()
    if args.set and not args.tag:
        parser.error("--set changes the presets: name the tuning run with --tag")
    directory = results_dir(args.setup, args.tag)
    directory.mkdir(parents=True, exist_ok=True)
    extra = dict(parse_override(item) for item in args.set)
    runs = []
    for split in args.splits.split(","):
        for strategy in args.strategies.split(","):
            runs.append(run(args.setup, strategy, split, args, extra))
            record_summary(runs[-1], directory / f"summary-seed{args.seed}.json")
            print(table(runs[-1:], args.setup), flush=True)
    print()
    print(table(runs, args.setup))
    if args.setup != "fmnist-mlp":
        print(per_round(runs))
    if not args.tag:
        plot_seed(args.setup, args.seed)


if __name__ == "__main__":
    main()
