"""The screen judges a reply by what is expected of a client of its size (bayes/robust.py screen_bounds, each
strategy's `update_scale`): honest clients of 1,000 and 30 examples pass it under every strategy family at the
defaults, and a rogue that claims more examples than it holds still cannot hide a scaled or sign-flipped update."""

from __future__ import annotations

import pytest

from fedbayes.strategies.fedavg.server import FedAvg
from tests.component.test_fedavg import configured
from tests.support import LAYOUT, InProcessFederation, answers, fedavg_reply, rogue, settings
from tests.support.rogue import UPDATE_GROUP, RogueRound, assert_rejected_without_trace

FAMILIES = [
    "fedavg",
    "fedprox",
    "feddyn",
    "fedlap",
    "fedlap-cov",
    "fedlap-func",
    "fedpa",
    "bayesadmm",
    "bayesadmm-full",
    "fedadmm",
    "dsvgd",
    "p-dsvgd",
    "u-dsvgd",
]


@pytest.mark.parametrize("strategy", FAMILIES)
def test_clients_of_1000_and_30_examples_all_pass_the_screen_at_the_defaults(tmp_path, strategy):
    """Real client halves (logistic regression on seeded data) and the real round core, every key at its default:
    no reply is refused in 4 rounds, and both clients' replies are used (DSVGD schedules one a round)."""
    federation = InProcessFederation(tmp_path, {"strategy": strategy}, sizes=[1000, 30])
    accepted: set[str] = set()
    for server_round in range(1, 5):
        federation.round(server_round, [1, 2])
        report = federation.report
        assert report.rejected == {}, (server_round, report.rejected)
        accepted.update(report.accepted)
    assert accepted == {"client-1", "client-2"}


def fedavg_round(replies: dict[int, tuple[int, float]]):
    """A FedAvg round from w_g = 0 on LAYOUT (15 weights): node -> (num_examples, every weight's value); the round
    core's report."""
    core = configured(FedAvg(settings(), LAYOUT), list(replies))
    made = {
        node: fedavg_reply(f"client-{node}", num_examples=examples, value=value)
        for node, (examples, value) in replies.items()
    }
    return core.aggregate(*answers(core, 1, made)).report


def test_a_large_client_is_measured_by_its_steps_not_against_the_small_ones_raw():
    """Clients of 30 examples (one SGD step an epoch at batch size 32) change every weight by 1; the client of 1000
    (32 steps) by 160, five times theirs per step. Against their raw norms (√15) its norm 160·√15 is over the old
    bound, 100 x √15; per step it is within 100 x theirs (its bound 100 x 32 x √15), so it is accepted. The same
    update from a client of 30 is refused."""
    report = fedavg_round({1: (1000, 160.0), 2: (30, 1.0), 3: (30, 1.0)})
    assert report.rejected == {} and report.accepted == ["client-1", "client-2", "client-3"]
    report = fedavg_round({1: (30, 160.0), 2: (30, 1.0), 3: (30, 1.0)})
    assert "refused by the screen" in report.rejected["client 'client-1' (node 1)"]
    assert "for a client of its size" in report.rejected["client 'client-1' (node 1)"]


@pytest.mark.parametrize("claimed", [1000, 100_000_000])
@pytest.mark.parametrize("factor", [1e6, -1e6])
def test_claiming_more_examples_hides_no_scaled_or_sign_flipped_update(claimed, factor):
    """A client claiming 1000 or max-client-examples (10^8) examples sends 10^6 or −10^6 x the honest change: its
    claim widens its bound by at most screen-ratio x the others' steps (100 x √15 x 100), and it is refused."""
    report = fedavg_round({1: (claimed, factor), 2: (30, 1.0), 3: (30, 1.0)})
    assert "refused by the screen" in report.rejected["client 'client-1' (node 1)"]
    assert report.accepted == ["client-2", "client-3"]


def claiming(game: RogueRound, node: int, examples: int, factor: float):
    """Node `node`'s honest round-2 reply claiming `examples` examples, its update x `factor`, kept consistent with
    what the server replays from it (BayesADMM's duals, FedDyn's λ sketch, with the claimed examples)."""
    server, layout = game.federation.server, game.federation.layout
    group = UPDATE_GROUP[server.settings.strategy]
    reference = rogue.sent_reference(server, layout, f"client-{node}")
    claim = rogue.with_num_examples(server, game.replies[node], examples)
    return rogue.consistent_reply(server, claim, rogue.scaled_update(reference, group, factor), 2)


@pytest.mark.parametrize("factor", [1e6, -1e6])
@pytest.mark.parametrize("strategy", ["fedavg", "feddyn", "fedpa", "bayesadmm", "fedlap-cov", "p-dsvgd"])
def test_a_rogue_claiming_max_client_examples_is_refused_for_a_scaled_or_flipped_update(tmp_path, strategy, factor):
    """Every strategy's own update and expected size, the real halves: client-1 claims 10^8 examples (the default
    max-client-examples) and sends its honest update x 10^6 or x −10^6; it is refused by the screen and the round is
    committed from the honest two, bit-equal to a server that never saw it."""
    game = RogueRound(tmp_path, strategy)
    server, result, expected = game.aggregate({1: claiming(game, 1, 100_000_000, factor)}, honest_nodes=[2, 3])
    assert_rejected_without_trace(
        server, result, expected, game.control, "client 'client-1' (node 1)", "refused by the screen"
    )


@pytest.mark.parametrize("strategy", ["fedavg", "feddyn", "fedpa", "bayesadmm", "fedlap-cov", "p-dsvgd"])
def test_the_claim_alone_is_accepted(tmp_path, strategy):
    """What the test above refuses is the update: the honest one claiming 10^8 examples passes the screen."""
    game = RogueRound(tmp_path, strategy)
    _, result, _ = game.aggregate({1: claiming(game, 1, 100_000_000, 1.0)}, honest_nodes=[2, 3])
    assert result.report.rejected == {}
