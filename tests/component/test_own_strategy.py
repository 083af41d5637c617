"""Bring your own strategy: one defined outside fedbayes (tests/plugins/fedmedian_plugin.py) is found by
"<module>:<attribute>" or through an entry point, and runs like a built-in one, over loopback too."""

from __future__ import annotations

import pytest

from fedbayes import strategies
from fedbayes.strategies import get_algorithm, run_settings
from fedbayes.tasks.config import ConfigError
from tests.support import DEFAULTS, LAYOUT, answers, fedavg_reply, round_core

REFERENCE = "fedmedian_plugin:FEDMEDIAN"


def test_a_strategy_by_module_and_attribute_aggregates_with_its_own_math(plugin_path):
    algorithm = get_algorithm(REFERENCE)
    core = round_core(algorithm.build_server(run_settings({**DEFAULTS, "strategy": REFERENCE}), LAYOUT))
    replies = {
        node: fedavg_reply(f"client-{node}", num_examples=10 * node, value=value)
        for node, value in ((1, 1.0), (2, 5.0), (3, 100.0))
    }
    outcome = core.aggregate(*answers(core, 1, replies))
    assert all((outcome.arrays[name].numpy() == 5.0).all() for name in LAYOUT)  # the median, not FedAvg's 62.5
    assert outcome.report.accepted == ["client-1", "client-2", "client-3"]


def test_an_installed_strategy_is_found_by_its_entry_point_name(plugin_path, monkeypatch):
    monkeypatch.setattr(strategies, "_installed", lambda: {"fedmedian": REFERENCE})
    assert get_algorithm("fedmedian").server.__name__ == "FedMedian"
    assert "fedmedian" in strategies.algorithm_names()


@pytest.mark.parametrize(
    "reference, words",
    [
        ("no_such_module:X", "cannot load 'no_such_module:X'"),
        ("fedbayes.strategies.fedavg.server:FedAvg", "FedAvg'>, not a fedbayes.strategies.Algorithm"),
        ("fedmedian", "must be one of fedavg"),
    ],
)
def test_a_strategy_that_is_not_there_is_refused_naming_the_key(reference, words):
    with pytest.raises(ConfigError, match="run config 'strategy'") as error:
        get_algorithm(reference)
    assert words in str(error.value)
