"""benchmarks/dsvgd_logreg.py, the DSVGD paper's logistic-regression protocol: a trial run inside a batch of trials
gives the numbers it gives alone; the splits of Figs. 4 and 5; the generated datasets' definitions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks import dsvgd_logreg as logreg

SHORT = dataclasses.replace(logreg.SETTINGS, local_steps=10, distill_steps=10)


@pytest.mark.parametrize(
    ("dataset", "agents", "particles", "split"),
    [("twonorm", 2, 3, "iid"), ("waveform", 2, 2, "heterogeneous")],  # the latter: agents' sizes differ by trial
)
def test_a_trial_in_a_batch_gives_what_it_gives_alone(dataset, agents, particles, split):
    together = logreg.run_trials(dataset, agents, particles, split, [0, 1], 3, SHORT)
    for position, trial in enumerate([0, 1]):
        alone = logreg.run_trials(dataset, agents, particles, split, [trial], 3, SHORT)
        for method in logreg.METHODS:
            for metric in logreg.METRICS:
                torch.testing.assert_close(
                    together[method][metric][:, position], alone[method][metric][:, 0], rtol=1e-10, atol=1e-10
                )
    accuracy = together["dsvgd"]["accuracy"]
    assert accuracy.shape == (3, 2) and (accuracy > 0.5).all()  # 3 rounds of 10 steps already learn something


def test_splits_of_figures_4_and_5():
    labels = torch.tensor([1.0] * 100 + [-1.0] * 60)[torch.randperm(160, generator=torch.Generator().manual_seed(0))]
    for split in ("iid", "homogeneous", "heterogeneous"):
        parts = logreg.partition(labels, 4, split)
        assert torch.equal(torch.cat(parts).sort().values, torch.arange(160)), split  # every row, once
    positives = [int((labels[p] > 0).sum()) for p in logreg.partition(labels, 4, "homogeneous")]
    assert positives == [25, 25, 25, 25]
    heterogeneous = logreg.partition(labels, 4, "heterogeneous")
    assert [int((labels[p] > 0).sum()) for p in heterogeneous] == [40, 40, 10, 10]  # 40% / 10% of label +1
    assert [int((labels[p] < 0).sum()) for p in heterogeneous] == [6, 6, 24, 24]  # and the reverse of label -1
    assert [len(p) for p in logreg.partition(labels, 4, "iid")] == [40] * 4


def test_generated_datasets_follow_their_definitions():
    generator = torch.Generator().manual_seed(1)
    inputs, labels = logreg.ringnorm(generator, count=20_000)
    positive, negative = inputs[labels > 0], inputs[labels < 0]
    assert abs(positive.var().item() - 4) < 0.1 and abs(negative.var().item() - 1) < 0.05
    assert abs(negative.mean().item() - 20**-0.5) < 0.02 and abs(positive.mean().item()) < 0.03
    inputs, labels = logreg.waveform(generator, count=30_000)
    assert inputs.shape == (30_000, 21) and abs((labels > 0).double().mean().item() - 1 / 3) < 0.01
    # class 1 = u·h1 + (1-u)·h2 + ε, u ~ U(0, 1): mean (h1 + h2)/2, with h1 peaked at i = 11 and h2 at i = 15
    i = torch.arange(1, 22, dtype=torch.float64)
    h1, h2 = (6 - (i - 11).abs()).clamp_min(0), (6 - (i - 15).abs()).clamp_min(0)
    torch.testing.assert_close(inputs[labels > 0].mean(0), (h1 + h2) / 2, rtol=0, atol=0.1)
