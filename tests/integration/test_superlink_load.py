"""The SuperLink load test, small (tests/support/superlink_load.py, which benchmarks/superlink_load.py sweeps): 200
nodes speaking Flower's Fleet API from two processes (tests/support/fleet_nodes.py: Flower's SuperNode connection,
fedbayes supernode's loop, replies built with the codec) against a real `fedbayes superlink` and ServerApp on
loopback, 20 of them sampled a round. The run completes, and every round commits the reply of every node it sampled:
the results rows accept as many clients as they sent work to and refuse none, and the nodes sent exactly those
replies."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.support.superlink_load import LoadSettings, read_jsonl, run_nodes

pytestmark = pytest.mark.integration

NODES, SAMPLED, ROUNDS = 200, 20, 3


def test_two_hundred_nodes_every_sampled_reply_is_committed(tmp_path):
    settings = LoadSettings(rounds=ROUNDS, compute_seconds=0.2, processes=2, idle_seconds=1.0, round_timeout=300.0)
    (case,) = run_nodes(NODES, [SAMPLED], settings, tmp_path)
    assert "failure" not in case, case.get("failure")
    assert case["status"] == "finished:completed"

    rows = read_jsonl(tmp_path / f"load-{NODES}" / f"results-m{SAMPLED}.jsonl")
    assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1))
    for row in rows:
        assert row["clients"] == row["clients_sent"] == SAMPLED, row
        assert row["rejected"] == {}, row["rejected"]
    replies = [
        reply
        for path in sorted((tmp_path / f"load-{NODES}" / "logs" / "nodes").glob("replies-*.jsonl"))
        for reply in read_jsonl(path)
        if reply["run_id"] == case["run_id"]
    ]
    assert Counter(reply["round"] for reply in replies) == {number: SAMPLED for number in range(1, ROUNDS + 1)}
    for number in range(1, ROUNDS + 1):
        assert len({reply["node_id"] for reply in replies if reply["round"] == number}) == SAMPLED
    assert case["committed"] == {"all": True, "problems": []}
    assert case["idle"]["pulls_per_s"] > 0 and case["superlink"]["cores"] > 0, "the nodes polled, /proc was read"
