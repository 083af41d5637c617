"""The server's evaluation of the global model: at its mean and, for a Bayesian strategy, as an ensemble over its
posterior samples; every `eval-every` rounds and always in the last, on a fixed seeded `eval-fraction` of the test
set in between and on all of it in the last, with `eval-threads` CPU threads.

Besides accuracy, NLL and ECE, each predictive's uncertainty metrics (posterior/uncertainty.py uncertainty_metrics:
misclassification and OOD AUROC, selective accuracy) come from the same probabilities; only the OOD inputs
(run config ood-inputs, tasks/ood.py: 1,000 of them) add a pass per member.

What it costs (benchmarks/evaluation_cost.py): one pass of cnn-zenke over FMNIST's 10,000 test images is ~8 s of one
core, so the 33 passes of every round before these keys (the mean and 32 samples) were ~270 s of CPU a round, and 782 s
of wall time at nice 19 in a 2-client run. The model's cost therefore picks the defaults (`evaluation_defaults`).
Running the samples as one vmapped model (`eval-batched`) was no faster on the CPU for any model measured, so the
default is one pass each.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.func import functional_call, vmap

from fedbayes.bayes.metrics import classification_metrics, member_probs
from fedbayes.posterior.uncertainty import predictive, uncertainty_metrics
from fedbayes.tasks.config import EvaluationSettings, RunSettings, round_seed
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.ood import ood_inputs

Weights = dict[str, np.ndarray]

# A model costlier than this per example (multiply-adds of its Linear and Conv layers) gets the light defaults: every
# built-in CNN (cnn-acar 7.9 M on FMNIST, cnn-zenke 14.9 M, resnet20 30.8 M); logreg (7,840) and the MLP (178 K; 635 K
# on CIFAR) keep the full evaluation every round, whose 33 passes over 10,000 images then take seconds.
COSTLY_MULTIPLY_ADDS = 2_000_000


@dataclass(frozen=True)
class EvaluationDefaults:
    every: int  # eval-every
    fraction: float  # eval-fraction
    samples: int  # ensemble-samples
    threads: int  # eval-threads; 0: the cores this process may use


# One thread, as before eval-threads: MKL's results can change in the last bit with the thread count (measured for
# the MLP on batches of 128 images), and these rows stay what they were.
FULL = EvaluationDefaults(every=1, fraction=1.0, samples=32, threads=1)
# An evaluated round before the last: 5 passes over 1,000 images (~4 s of one core for cnn-zenke), every 5th round, so
# 1,000 image-passes a round on average: less than one client's epoch on FMNIST-10% (600 images, forward and backward
# ~3 passes each). The last round: 5 passes over the whole test set. On every core. The 1,000 OOD inputs (ood-inputs,
# tasks/ood.py) add 5 passes to each, so 2,000 image-passes a round on average: about one such epoch.
LIGHT = EvaluationDefaults(every=5, fraction=0.1, samples=4, threads=0)

NOT_EVALUATED = {
    "accuracy": None,
    "nll": None,
    "ece": None,
    "reliability": None,
    "eval_examples": 0,
    "eval_fraction": 0.0,
    "eval_samples": 0,
    "misclassification_auroc": None,
    "selective_accuracy_80": None,
    "ood_auroc": None,
    "ood_inputs": None,
}


def multiply_adds(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-adds of one example's forward pass through the model's Linear and Conv layers (a dry run in eval
    mode; torch's RNG state is left as it was, whatever the model's forward does).

    Args:
        model: the model; its training mode is restored afterwards.
        input_shape: one example's shape, without the batch dimension.

    Returns:
        The multiply-adds of its Linear and Conv layers for one example.
    """
    total = 0

    def count(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            total += output.numel() * module.in_features
        elif isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):  # the layers hooked below, all of them
            total += output.numel() * module.in_channels // module.groups * math.prod(module.kernel_size)

    layers = [module for module in model.modules() if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
    hooks = [layer.register_forward_hook(count) for layer in layers]
    training = model.training
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            model.eval()(torch.zeros(1, *input_shape))
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    return total


def evaluation_defaults(model: nn.Module, input_shape: tuple[int, ...]) -> EvaluationDefaults:
    """The evaluation a model's cost allows: LIGHT for one of over COSTLY_MULTIPLY_ADDS per example, else FULL.

    Args:
        model: the run's model.
        input_shape: one example's shape, without the batch dimension.

    Returns:
        LIGHT or FULL.
    """
    return LIGHT if multiply_adds(model, input_shape) > COSTLY_MULTIPLY_ADDS else FULL


def with_evaluation_defaults(settings: RunSettings, model: nn.Module, input_shape: tuple[int, ...]) -> RunSettings:
    """`settings` with each evaluation key left to the model (eval-every, eval-fraction and eval-threads 0,
    ensemble-samples -1) set by `evaluation_defaults`; the threads a number, not 0. It resolves the run's settings,
    not their evaluation group alone: the ensemble's size as resolved is also what a checkpoint records.

    Args:
        settings: the run's settings, as parsed.
        model: the run's model.
        input_shape: one example's shape, without the batch dimension.

    Returns:
        The settings with those keys resolved; the others as they were.
    """
    defaults = evaluation_defaults(model, input_shape)
    return settings.replace(
        eval_every=settings.eval_every or defaults.every,
        eval_fraction=settings.eval_fraction or defaults.fraction,
        ensemble_samples=defaults.samples if settings.ensemble_samples == -1 else settings.ensemble_samples,
        eval_threads=settings.eval_threads or defaults.threads or len(os.sched_getaffinity(0)),
    )


def evaluates(server_round: int, num_rounds: int, every: int) -> bool:
    """Whether a round is evaluated: every `every`-th, and the last.

    Args:
        server_round: the round, from 1.
        num_rounds: the run's rounds.
        every: run config eval-every, resolved (>= 1).

    Returns:
        True where the round is evaluated.
    """
    return server_round % every == 0 or server_round == num_rounds


def evaluation_subset(size: int, fraction: float, seed: int) -> torch.Tensor:
    """The indices, ascending, of a `fraction` of a test set of `size` examples (at least one): drawn from the run's
    seed, so the same examples in every round, on every resume.

    Args:
        size: the test set's examples.
        fraction: the share to keep, in (0, 1].
        seed: the run's seed.

    Returns:
        The kept indices, ascending.
    """
    count = max(1, round(fraction * size))
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:count].sort().values


@contextmanager
def compute_threads(count: int) -> Iterator[None]:
    """torch's CPU threads for the block, then as before. Elsewhere the ServerApp keeps one thread
    (tasks/compute.py); the evaluation thread runs at nice 19 (server/loop.py yield_cpu) and so do the OpenMP threads
    it starts, so they take only the cores that clients on this machine leave idle.

    Args:
        count: the threads torch uses in the block.

    Yields:
        Nothing; the block runs with `count` threads.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@torch.no_grad()
def batched_member_probs(
    model: nn.Module, members: list[Weights], images: torch.Tensor, batch_size: int, device: torch.device
) -> torch.Tensor:
    """member_probs as one vmapped model over the members' stacked weights (torch.func), equal to round-off. Each
    pass takes batch_size // S images, so it holds as many (member, image) activations as one pass of member_probs.

    Args:
        model: the model whose weights the members replace; moved to `device` and back to the CPU.
        members: S weights of the model, parameters and buffers by name.
        images: the N inputs.
        batch_size: the images of one pass of one member (run config eval-batch-size).
        device: where to compute.

    Returns:
        (S, N, C) class probabilities, on the CPU.
    """
    model.to(device).eval()
    state = model.state_dict()
    stacked = {
        name: torch.stack([torch.as_tensor(weights[name], dtype=state[name].dtype) for weights in members]).to(device)
        for name in members[0]
    }
    probs = vmap(lambda weights, x: torch.softmax(functional_call(model, weights, (x,)), dim=1), in_dims=(0, None))
    step = max(1, batch_size // len(members))
    chunks = [probs(stacked, images[i : i + step].to(device)).cpu() for i in range(0, len(images), step)]
    model.cpu()
    return torch.cat(chunks, dim=1)


class ServerEvaluation:
    """The round loop's `evaluate(arrays, round)` (server/loop.py): the round's row metrics, `accuracy`, `nll`, `ece`,
    `reliability` (bayes/metrics.py) and the uncertainty metrics (`misclassification_auroc`, `selective_accuracy_80`,
    `ood_auroc`, and with more than one member their `_mi` variants: posterior/uncertainty.py) at the global model, the
    same with `_ensemble` over the strategy's posterior samples, and what they were computed on: `eval_examples`,
    `eval_fraction` (of the test set), `eval_samples` (the ensemble's members; 0: none), `ood_inputs` (run config
    ood-inputs, tasks/ood.py). A round not evaluated gets NOT_EVALUATED: those keys, metrics None. `settings` are the
    run's evaluation group (`RunSettings.evaluation`) once through with_evaluation_defaults."""

    def __init__(
        self, model: nn.Module, test: Dataset, strategy, settings: EvaluationSettings, device: torch.device
    ) -> None:
        self.model, self.strategy, self.settings, self.device = model, strategy, settings, device
        self.full = test
        self.subset = (
            test
            if settings.eval_fraction == 1
            else test.subset(evaluation_subset(len(test), settings.eval_fraction, settings.seed))
        )
        self.names = list(model.state_dict())  # the global model's arrays: parameters and buffers
        self.ood = ood_inputs(settings.ood_inputs, test, settings.seed)  # the same ones every round

    def test_set(self, server_round: int) -> Dataset:
        """The examples a round is evaluated on: the whole test set in the last round, the seeded subset before.

        Args:
            server_round: the round, from 1.

        Returns:
            The test set or its subset.
        """
        return self.full if server_round == self.settings.num_rounds else self.subset

    def __call__(self, arrays: ArrayRecord, server_round: int) -> dict[str, Any]:
        if not evaluates(server_round, self.settings.num_rounds, self.settings.eval_every):
            return dict(NOT_EVALUATED)
        test = self.test_set(server_round)
        with compute_threads(self.settings.eval_threads):
            mean = {name: arrays[name].numpy() for name in self.names}
            metrics = self.predictive_metrics([mean], test)
            # samples drawn with a per-round seed: a resumed run evaluates exactly like an uninterrupted one
            generator = torch.Generator().manual_seed(round_seed(self.settings.seed, server_round))
            samples = self.strategy.posterior_samples(self.settings.ensemble_samples, generator)
            if samples:
                buffers = {name: mean[name] for name in self.strategy.buffer_layout}  # samples are parameters
                ensemble = self.predictive_metrics([sample | buffers for sample in samples], test)
                metrics |= {f"{key}_ensemble": value for key, value in ensemble.items()}
        return metrics | {
            "eval_examples": len(test),
            "eval_fraction": len(test) / len(self.full),
            "eval_samples": len(samples),
            "ood_inputs": self.settings.ood_inputs,
        }

    def predictive_metrics(self, members: list[Weights], test: Dataset) -> dict[str, Any]:
        """The row metrics of the predictive that averages `members` on `test`, and on the OOD inputs if any.

        Args:
            members: weights of the global model (parameters and buffers by name): the mean alone, or samples.
            test: the examples to score.

        Returns:
            classification_metrics and uncertainty_metrics of that predictive, by name.
        """
        prediction = predictive(self.probs(members, test.images))
        ood = None if self.ood is None else predictive(self.probs(members, self.ood))
        return classification_metrics(prediction.probs, test.labels) | uncertainty_metrics(prediction, test.labels, ood)

    def probs(self, members: list[Weights], images: torch.Tensor) -> torch.Tensor:
        """(S, N, C) of `members` on `images`: one pass each, or (eval-batched) one vmapped pass over them all.

        Args:
            members: S weights of the global model, parameters and buffers by name.
            images: the N inputs.

        Returns:
            The members' class probabilities on the CPU.
        """
        passes = batched_member_probs if self.settings.eval_batched and len(members) > 1 else member_probs
        return passes(self.model, members, images, self.settings.eval_batch_size, self.device)
