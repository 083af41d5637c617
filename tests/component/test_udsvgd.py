"""U-DSVGD (Kassab & Simeone Sec. 5.1, Alg. 4): agents keep the particles of every round they were scheduled in.
On the paper's 1-D Gaussian toy (spec §7.1) against DSVGD and the exact posterior; then its client buffer over the
real client and server halves."""

import numpy as np
import pytest
import torch

from fedbayes.strategies.dsvgd.math import (
    SVGDSettings,
    Visit,
    agent_round,
    gaussian_prior_score,
    unconstrained_tilted_update,
)
from tests.component.test_dsvgd_federation import federation, run_round
from tests.support import newest_state
from tests.support.problems import gaussian_loss_gradient

SETTINGS = SVGDSettings(local_steps=200, distill_steps=200, kde_bandwidth=0.55, lr=0.05, distill_lr=0.05)
PRIOR_VARIANCE, LIKELIHOODS = 4.0, [(1.0, 2.0), (-0.5, 3.0)]  # p_0 = N(0, 4); agent k: N(θ; mean_k, var_k)
POSTERIOR_VARIANCE = 1 / (1 / 4 + 1 / 2 + 1 / 3)
POSTERIOR_MEAN = POSTERIOR_VARIANCE * (1 / 2 - 0.5 / 3)  # 0.3077


def start(count=100, seed=0):
    return PRIOR_VARIANCE**0.5 * torch.randn(
        count, 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def run_udsvgd(likelihoods, rounds):
    """Alg. 4 with agent k = (i-1) mod K in round i; Θ after every round."""
    particles, visits, history = start(), [[] for _ in likelihoods], []
    for i in range(rounds):
        k = i % len(likelihoods)
        initial = i == 0
        updated = unconstrained_tilted_update(
            particles,
            initial,
            visits[k],
            gaussian_prior_score(1 / PRIOR_VARIANCE),
            gaussian_loss_gradient(*likelihoods[k]),
            SETTINGS,
        )
        visits[k].append(Visit(None if initial else particles, updated))
        particles = updated
        history.append(particles)
    return history


def run_dsvgd(likelihoods, rounds):
    particles = start()
    local, history = [particles.clone() for _ in likelihoods], []
    for i in range(rounds):
        k = i % len(likelihoods)
        particles, local[k] = agent_round(
            particles,
            local[k],
            gaussian_prior_score(1 / PRIOR_VARIANCE),
            gaussian_loss_gradient(*likelihoods[k]),
            SETTINGS,
        )
        history.append(particles)
    return history


def idealised(rounds, likelihoods, bandwidth=0.55):
    """(mean, variance) per round for N -> ∞ and exact SVGD: every q^(j), j >= 1, is a KDE, a Gaussian widened
    by λ²; q^(0) = p_0. Natural parameters of the target: those of q^(i-1) minus Σ_{j∈I_k} (q^(j) - q^(j-1))
    plus the agent's likelihood."""
    means, variances, visits = [0.0], [PRIOR_VARIANCE], [[] for _ in likelihoods]

    def natural(j):
        precision = 1 / PRIOR_VARIANCE if j == 0 else 1 / (variances[j] + bandwidth**2)
        return precision * means[j], precision

    for i in range(1, rounds + 1):
        k = (i - 1) % len(likelihoods)
        eta, precision = natural(i - 1)
        for j in visits[k]:
            eta -= natural(j)[0] - natural(j - 1)[0]
            precision -= natural(j)[1] - natural(j - 1)[1]
        mean, variance = likelihoods[k]
        eta, precision = eta + mean / variance, precision + 1 / variance
        means.append(eta / precision)
        variances.append(1 / precision)
        visits[k].append(i)
    return list(zip(means[1:], variances[1:]))


def test_one_agent_is_svgd_dsvgd_drifts():
    """K = 1: U-DSVGD's later rounds keep SVGD's posterior N(2/3, 4/3) (A.6); DSVGD's shrink (spec §7.2)."""
    unconstrained = run_udsvgd(LIKELIHOODS[:1], rounds=4)
    distilled = run_dsvgd(LIKELIHOODS[:1], rounds=4)
    assert abs(unconstrained[0].var().item() - 4 / 3) < 0.1
    for particles in unconstrained:
        assert abs(particles.mean().item() - 2 / 3) < 0.05
        assert abs(particles.var().item() / unconstrained[0].var().item() - 1) < 0.03
    assert distilled[-1].var().item() < 0.85 * distilled[0].var().item()


def test_two_agents_match_the_exact_posterior_mean_and_the_kde_recursion():
    """Conjugate toy (test A): the mean converges to the exact posterior's, closer than DSVGD's; the variance
    follows the idealised recursion, whose fixed point (1.12) is wider than the exact 0.923 by the KDEs' λ²."""
    history = run_udsvgd(LIKELIHOODS, rounds=8)
    expected = idealised(8, LIKELIHOODS)
    for particles, (mean, variance) in zip(history, expected):
        assert abs(particles.mean().item() - mean) < 0.02
        assert abs(particles.var().item() - variance) < 0.1
    assert abs(expected[-1][0] - POSTERIOR_MEAN) < 1e-3 and 1.1 < expected[-1][1] < 1.14
    unconstrained_error = np.mean([abs(p.mean().item() - POSTERIOR_MEAN) for p in history[4:]])
    distilled_error = np.mean([abs(p.mean().item() - POSTERIOR_MEAN) for p in run_dsvgd(LIKELIHOODS, 8)[4:]])
    assert unconstrained_error < 0.01 < distilled_error


def test_client_buffer_grows_per_visit_and_is_bounded(tmp_path):
    core, runtimes, _ = federation(tmp_path, strategy="u-dsvgd", **{"udsvgd-max-visits": 2})
    visits = {}
    for server_round in range(1, 7):
        messages, replies, _ = run_round(core, runtimes, server_round)
        node = messages[0].metadata.dst_node_id
        state = newest_state(runtimes[node].state_store("fed"))
        visits[node] = len(state.tensors["visit_after"])
        assert state.tensors["visit_initial"].tolist()[-1] == (server_round == 1)  # only round 1 downloads Θ^(0)
        assert torch.equal(state.tensors["visit_after"][-1], torch.from_numpy(core.strategy.particles))  # what it sent
    assert visits == {11: 2, 12: 2, 13: 2}
    with pytest.raises(ValueError, match="'udsvgd-max-visits' = 2 allows no more"):
        run_round(core, runtimes, 7)
