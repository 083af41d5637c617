"""Bring your own strategy: one defined outside fedbayes (tests/plugins/fedmedian_plugin.py) is found by
"<module>:<attribute>" or through an entry point, and runs like a built-in one, over loopback too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedbayes import strategies
from fedbayes.strategies import get_algorithm
from fedbayes.tasks.config import ConfigError, RunSettings
from tests.helpers import LAYOUT, fedavg_reply, reply_message, run_loopback
from tests.test_config import DEFAULTS
from tests.test_integration import with_pythonpath

PLUGINS = Path(__file__).resolve().parent / "plugins"
REFERENCE = "fedmedian_plugin:FEDMEDIAN"


@pytest.fixture
def plugin_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", with_pythonpath(PLUGINS))  # for every process a federation starts


def test_a_strategy_by_module_and_attribute_aggregates_with_its_own_math(plugin_path):
    algorithm = get_algorithm(REFERENCE)
    server = algorithm.server(RunSettings.from_run_config({**DEFAULTS, "strategy": REFERENCE}), LAYOUT)
    replies = [reply_message(fedavg_reply(f"client-{node}", num_examples=10 * node, value=value), node)
               for node, value in ((1, 1.0), (2, 5.0), (3, 100.0))]
    arrays, _ = server.aggregate_train(1, replies)
    assert all((arrays[name].numpy() == 5.0).all() for name in LAYOUT)  # the median, not FedAvg's 62.5
    assert server.round_report.accepted == ["client-1", "client-2", "client-3"]


def test_an_installed_strategy_is_found_by_its_entry_point_name(plugin_path, monkeypatch):
    monkeypatch.setattr(strategies, "_installed", lambda: {"fedmedian": REFERENCE})
    assert get_algorithm("fedmedian").server.__name__ == "FedMedian"
    assert "fedmedian" in strategies.algorithm_names()


@pytest.mark.parametrize("reference, words", [
    ("no_such_module:X", "cannot load 'no_such_module:X'"),
    ("fedbayes.strategies.fedavg:FedAvg", "FedAvg'>, not a fedbayes.strategies.Algorithm"),
    ("fedmedian", "must be one of fedavg"),
])
def test_a_strategy_that_is_not_there_is_refused_naming_the_key(reference, words):
    with pytest.raises(ConfigError, match="run config 'strategy'") as error:
        get_algorithm(reference)
    assert words in str(error.value)


@pytest.mark.integration
def test_an_out_of_tree_strategy_runs_over_loopback(plugin_path, tmp_path):
    workdir = tmp_path / "fed"
    config = {"strategy": REFERENCE, "num-server-rounds": 2, "federation": "plugin", "fraction": 0.05,
              "model": "logreg", "results-path": str(workdir / "results.jsonl"), "wait-for-clients": 3}
    run = run_loopback(workdir, config, rounds=2, clients=3)
    assert [row["clients"] for row in run.rows] == [3, 3]
    assert run.rows[-1]["accuracy"] > 0.6 and np.isfinite(run.rows[-1]["nll"])
