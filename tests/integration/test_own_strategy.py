"""Bring your own strategy: one defined outside fedbayes runs like a built-in one over loopback, on fedbayes'
messages (tests/plugins/fedmedian_plugin.py) or on messages of its own (tests/plugins/fedavgm_plugin)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.processes import run_loopback


@pytest.mark.parametrize("reference", ["fedmedian_plugin:FEDMEDIAN", "fedavgm_plugin:FEDAVGM"])
def test_an_out_of_tree_strategy_runs_over_loopback(plugin_path, tmp_path, reference):
    workdir = tmp_path / "fed"
    config = {
        "strategy": reference,
        "num-server-rounds": 2,
        "federation": "plugin",
        "fraction": 0.05,
        "model": "logreg",
        "results-path": str(workdir / "results.jsonl"),
        "wait-for-clients": 3,
    }
    run = run_loopback(workdir, config, rounds=2, clients=3)
    assert [row["clients"] for row in run.rows] == [3, 3]
    assert run.rows[-1]["accuracy"] > 0.6 and np.isfinite(run.rows[-1]["nll"])
