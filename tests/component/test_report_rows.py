"""`fedbayes report` on a damaged results file (tasks/report.py read_rows): every line it cannot use is named by file
and line on stderr and left out, the report is drawn from the others; a file with no usable line is an error naming
it; and every row the real round loop writes is usable."""

from __future__ import annotations

import json

import pytest

from fedbayes.deploy.cli import main
from fedbayes.server.evaluation import NOT_EVALUATED
from fedbayes.tasks.report import REPORT_FILES, ReportError, read_rows
from tests.support import fedavg_reply, improving_metrics, run_loop


def row(number: int, **fields) -> str:
    return json.dumps({"round": number, "accuracy": 0.5, "nll": 1.0, "ece": 0.1, **fields})


def read_warned(path) -> tuple[list[dict], list[str]]:
    warnings: list[str] = []
    return read_rows(path, warnings.append), warnings


DAMAGED = {
    "round a string": (row(1).replace("1", '"2"', 1), "field 'round' is \"2\", not a round"),
    "round true": (row(1).replace("1", "true", 1), "field 'round' is true, not a round"),
    "round 0": (row(0), "field 'round' is 0, not a round number (an integer >= 1)"),
    "accuracy a string": (row(2, accuracy="0.7"), "field 'accuracy' is \"0.7\", not a finite number or null"),
    "nll NaN": (row(2, nll=float("nan")), "field 'nll' is NaN, not a finite number or null"),
    "ece infinite": (row(2, ece=float("inf")), "field 'ece' is Infinity, not a finite number"),
    "ensemble a string": (row(2, nll_ensemble="x"), "field 'nll_ensemble' is \"x\", not a finite number"),
    "half evaluated": (row(2, nll=None), "accuracy, nll and ece must be numbers (an evaluated round) or null"),
    "missing keys": ('{"round": 2, "accuracy": 0.5}', "not a results row (no nll, ece)"),
    "not JSON": ('{"round": 2, "accur', "not a JSON row (Unterminated string"),
    "not an object": ("[2, 0.5, 1.0, 0.1]", "not a results row (a JSON list, not an object)"),
    "wall seconds a string": (row(2, wall_seconds="12 s"), "field 'wall_seconds' is \"12 s\", not a finite number"),
    "negative clients": (row(2, clients=-1), "field 'clients' is -1, not a count"),
    "an AUROC a string": (
        row(2, ood_auroc_ensemble="0.9"),
        "field 'ood_auroc_ensemble' is \"0.9\", not a finite number or null",
    ),
    "phases a list": (row(2, phase_seconds=[1.0]), "field 'phase_seconds' is [1.0], not an object of seconds"),
    "client phase null": (row(2, client_phase_seconds={"train": None}), "field 'client_phase_seconds' is"),
    "bins of unequal length": (
        row(2, reliability={"confidence": [0.5, None], "accuracy": [1.0], "count": [3, 0]}),
        'field \'reliability\' is {"confidence": [0.5, null], "accuracy": [1.0], "count":  ..., not null or',
    ),
    "a bin with examples and no accuracy": (
        row(2, reliability={"confidence": [0.5], "accuracy": [None], "count": [3]}),
        "not null or reliability bins",
    ),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_line_is_named_by_file_and_line_and_the_others_are_kept(tmp_path, case):
    line, problem = DAMAGED[case]
    results = tmp_path / "r.jsonl"
    results.write_text(f"{row(1)}\n{line}\n\n{row(3)}\n")
    rows, warnings = read_warned(results)
    assert [kept["round"] for kept in rows] == [1, 3]
    assert len(warnings) == 1 and warnings[0].startswith(f"{results}:2: ") and problem in warnings[0], warnings
    assert warnings[0].endswith("; the report leaves this line out")


def test_the_report_is_drawn_from_the_usable_rows_and_warns_of_each_other_on_stderr(tmp_path, capsys):
    results, out = tmp_path / "r.jsonl", tmp_path / "out"
    results.write_text("\n".join([row(1), DAMAGED["round a string"][0], row(2), row(3, nll="x"), row(4)]) + "\n")
    assert main(["report", str(results), "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"warning: {results}:2: field 'round' is \"2\", not a round number (an integer >= 1); the report leaves this "
        "line out",
        f"warning: {results}:4: field 'nll' is \"x\", not a finite number or null; the report leaves this line out",
    ]
    assert sorted(path.name for path in out.iterdir()) == sorted(REPORT_FILES)
    assert "<td>1–4</td>" in (out / "index.html").read_text()  # rounds 1, 2 and 4


def test_a_file_with_no_usable_line_is_an_error_naming_it(tmp_path, capsys):
    results, out = tmp_path / "r.jsonl", tmp_path / "out"
    results.write_text(f"{DAMAGED['round a string'][0]}\nnot json\n")
    with pytest.raises(ReportError, match=f"{results}: none of its 2 lines is a usable results row"):
        read_rows(results, lambda message: None)
    assert main(["report", str(results), "--out", str(out)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.partition(": ")[2].partition(":")[0] for line in err[:2]] == [str(results)] * 2
    assert err[-1] == f"fedbayes: error: {results}: none of its 2 lines is a usable results row (each is named above)"
    assert not out.exists()


def test_every_row_the_round_loop_writes_is_usable(tmp_path):
    """Evaluated rows with reliability bins and ensemble metrics, rows of rounds not evaluated (as the server's
    evaluation leaves them under eval-every), phases, a quarantined node."""

    def reply(server_round, node):
        return fedavg_reply(f"client-{node}", server_round, value=1e30 if node == 1 else 1.0)

    def evaluate(arrays, server_round):
        return improving_metrics(arrays, server_round) if server_round % 2 == 0 else dict(NOT_EVALUATED)

    run_loop(tmp_path, reply, rounds=4, evaluate=evaluate, **{"max-client-rejections": 1, "quarantine-rounds": 1})
    rows, warnings = read_warned(tmp_path / "r.jsonl")
    assert warnings == [] and [kept["round"] for kept in rows] == [1, 2, 3, 4]
    assert rows[0]["accuracy"] is None and rows[1]["reliability"]["count"] and rows[1]["accuracy_ensemble"] > 0
    assert any(kept["quarantined"] for kept in rows)
