"""`fedbayes compare` in process (deploy/compare.py, tasks/validation.py): the grids are data with the same budget
for every strategy, an unknown strategy is refused before anything runs, the validation split is carved from the
clients' own examples and shares none with their kept data or the test set, tuning never reads the test set, the
winner is the best validation score (ties to the earlier point), each strategy is read at its own predictive, and a
finished run is not run again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedbayes.deploy import compare as cmp
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.npzdata import client_file
from fedbayes.tasks.partitions import partition_dataset
from fedbayes.tasks.validation import carve, write_validation_folder
from tests.support import write_digits

TINY = {"model": "logreg", "batch-size": 64, "input-scale": 0.0625}


def spec(tmp_path, **fields) -> cmp.CompareSpec:
    values = {
        "dataset": f"npz:{write_digits(tmp_path / 'digits')}",
        "clients": 2,
        "strategies": ("fedavg", "bayesadmm"),
        "rounds": 2,
        "seeds": 1,
        "out": tmp_path / "out",
        "overrides": TINY,
        **fields,
    }
    return cmp.CompareSpec(**values)


def rows(accuracies: list[float | None], **extra) -> list[dict]:
    return [
        {"round": number, "accuracy": accuracy, "nll": 1.0, "ece": 0.1, **extra}
        for number, accuracy in enumerate(accuracies, 1)
    ]


def test_the_grids_give_every_strategy_the_same_budget():
    defaults, small, paper = cmp.load_grid("defaults"), cmp.load_grid("small"), cmp.load_grid("paper")
    assert set(defaults) == set(small) == set(paper)
    assert all(points == [{}] for points in defaults.values())  # every key at its default
    assert {len(points) for points in small.values()} == {2}
    sizes = {len(points) for points in paper.values()}
    assert len(sizes) == 1 and 8 <= sizes.pop() <= 12
    for points in (*small.values(), *paper.values()):
        assert {point["lr-schedule"] for point in points} == {"constant", "cosine"}
        assert len({json.dumps(point, sort_keys=True) for point in points}) == len(points)  # no point twice
    # an axis of tables sets its keys together; the product runs the first axis slowest
    assert paper["bayesadmm"][:2] == [
        {"hess-init": 0.001, "beta2": 0.9998, "lr": 1e-3, "lr-schedule": "constant"},
        {"hess-init": 0.001, "beta2": 0.9998, "lr": 1e-3, "lr-schedule": "cosine"},
    ]


def test_an_unknown_strategy_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match=r"no small grid for 'fedlap-cv' \(did you mean 'fedlap-cov'\?\)"):
        cmp.compare(spec(tmp_path, strategies=("fedavg", "fedlap-cv")))
    with pytest.raises(ValueError, match="run config 'local-epochs'"):  # a bad --set: refused before any run too
        cmp.compare(spec(tmp_path, overrides={**TINY, "local-epochs": 0}))
    with pytest.raises(ValueError, match=r"--set seed \(that is --seeds\): give it as the option"):
        cmp.compare(spec(tmp_path, overrides={**TINY, "seed": 3}))
    with pytest.raises(ValueError, match="--set lr: the small grid tunes it"):
        cmp.compare(spec(tmp_path, overrides={**TINY, "lr": 0.1}))
    with pytest.raises(ValueError, match="--set client-eval-fraction: the comparison sets it"):
        cmp.compare(spec(tmp_path, overrides={**TINY, "client-eval-fraction": 0.2}))
    assert not (tmp_path / "out").exists()


def test_the_best_point_is_the_best_score_and_a_tie_goes_to_the_earlier_point():
    assert cmp.best_point([0.5, 0.7, 0.7, 0.6]) == 1
    assert cmp.best_point([None, 0.2]) == 1
    tail = cmp.tail_mean(rows([0.9, 0.1, 0.2, None, 0.3]), "accuracy")  # the last 3 evaluated rounds
    assert tail == pytest.approx(0.2)
    assert cmp.tail_mean(rows([0.4, 0.6]), "accuracy") == pytest.approx(0.5)  # fewer rounds than 3: all of them


def test_each_strategy_is_read_at_its_own_predictive_and_absent_keys_show_as_a_dash(tmp_path):
    compare = spec(tmp_path, seeds=2)
    grid = {"fedavg": [{"lr": 1e-3}, {"lr": 3e-3}], "bayesadmm": [{"lr": 1e-3}, {"lr": 3e-3}]}
    tuned = {
        "tune-fedavg-p0": rows([0.5, 0.5]),
        "tune-fedavg-p1": rows([0.6, 0.6]),
        "tune-bayesadmm-p0": rows([0.5, 0.5], accuracy_ensemble=0.9),
        "tune-bayesadmm-p1": rows([0.6, 0.6]),
    }
    finals = {
        "fedavg": [rows([0.7, 0.8], misclassification_auroc=0.6), rows([0.7, 0.6], misclassification_auroc=0.8)],
        "bayesadmm": [rows([0.5, 0.5], accuracy_ensemble=0.9, ece_ensemble=0.02)] * 2,
    }
    summary = cmp.summarise(compare, grid, tuned, finals, {"fedavg": 1, "bayesadmm": 0})
    fedavg, bayesadmm = summary["strategies"]["fedavg"], summary["strategies"]["bayesadmm"]
    assert bayesadmm["grid"][0]["validation_accuracy"] == pytest.approx(0.9)  # the ensemble's, not the mean's
    assert fedavg["test"]["accuracy"]["mean"] == pytest.approx(0.7)
    assert fedavg["test"]["accuracy"]["sd"] == pytest.approx(np.std([0.75, 0.65], ddof=1))
    assert bayesadmm["test"]["ece"]["mean"] == pytest.approx(0.02)
    assert fedavg["test"]["misclassification_auroc"]["mean"] == pytest.approx(0.7)
    lines = cmp.markdown_table(summary).splitlines()
    header, fedavg_row, bayesadmm_row = (
        next(line for line in lines if line.startswith(f"| {first} |")) for first in ("strategy", "fedavg", "bayesadmm")
    )
    assert "misclass. AUROC" in header and "OOD AUROC" not in header  # a column only for keys some row holds
    assert bayesadmm_row.split(" | ")[-2] == "-"  # bayesadmm's rows hold no misclassification AUROC
    assert "0.7000 ± 0.0707" in fedavg_row
    written = cmp.write_report(summary, finals, tmp_path / "report", print)
    assert [path.name for path in written] == [cmp.SUMMARY_FILE, cmp.TABLE_FILE, *cmp.PLOT_FILES]
    assert all(path.stat().st_size > 1000 for path in written[2:])


def test_the_validation_split_is_carved_from_each_clients_own_examples():
    """Fashion-MNIST, 3 clients of a Dirichlet split: by index, each client's kept and given parts are disjoint and
    together its partition; the files hold exactly those rows; no validation image is a test image."""
    train = load_dataset("fmnist", train=True)
    parts = partition_dataset(train.labels.numpy(), 3, "dirichlet", 0, fraction=0.03)
    carved = carve([len(part) for part in parts], 0.1, seed=0)
    given_rows = []
    for part, split in zip(parts, carved):
        kept, given = part[split.kept], part[split.given]
        assert not set(kept) & set(given) and sorted([*kept, *given]) == sorted(part)
        assert len(given) == round(0.1 * len(part))
        given_rows.append(given)
    everyone_kept = {index for part, split in zip(parts, carved) for index in part[split.kept]}
    validation_rows = np.concatenate(given_rows)
    assert not everyone_kept & set(validation_rows)
    again = carve([len(part) for part in parts], 0.1, seed=0)  # seeded
    assert all(np.array_equal(a.kept, b.kept) and np.array_equal(a.given, b.given) for a, b in zip(again, carved))


def test_the_validation_folder_holds_the_carved_rows_and_no_test_example(tmp_path):
    train = load_dataset("fmnist", train=True)
    parts = partition_dataset(train.labels.numpy(), 2, "iid", 0, fraction=0.02)
    carved = write_validation_folder(tmp_path, [train.subset(part) for part in parts], 0.1, seed=0)
    validation = np.load(tmp_path / "test.npz")
    given = np.concatenate([part[split.given] for part, split in zip(parts, carved)])
    assert np.array_equal(validation["x"], train.pixels[given].numpy())
    assert np.array_equal(validation["y"], train.labels[given].numpy())
    for index, (part, split) in enumerate(zip(parts, carved)):
        kept = np.load(client_file(tmp_path, index))
        assert np.array_equal(kept["x"], train.pixels[part[split.kept]].numpy())
    test_images = {image.tobytes() for image in load_dataset("fmnist", train=False).pixels.numpy()}
    assert not test_images & {image.tobytes() for image in validation["x"]}


def test_tuning_reads_no_test_set_and_a_finished_run_is_not_run_again(tmp_path):
    """The validation folder of an npz:DIR dataset, then one tuning run with the real test.npz gone: it trains on
    the kept rows and evaluates on the given ones. Run again, a finished run is read; one cut short or run with
    other settings is run afresh."""
    compare = spec(tmp_path)
    base = cmp.job_config(compare, "fedavg", {}, 0, compare.dataset)
    dataset = cmp.validation_dataset(compare, base)
    digits, folder = tmp_path / "digits", Path(dataset[len("npz:") :])
    kept = {row.tobytes() for index in (0, 1) for row in np.load(client_file(folder, index))["x"]}
    assert not kept & {row.tobytes() for row in np.load(folder / "test.npz")["x"]}
    shutil.move(digits / "test.npz", tmp_path / "test-elsewhere.npz")
    jobs = cmp.tuning_jobs(compare, {"fedavg": [{"lr": 0.01}], "bayesadmm": []}, dataset)
    progress = cmp.ProgressLine()
    ran = []

    def runner(job, clients, out):
        ran.append(job.name)
        return cmp.run_job(job, clients, out)

    first = cmp.run_jobs(jobs, compare, "tune", progress, runner)["tune-fedavg-p0"]
    assert [row["round"] for row in first] == [1, 2] and all(0 <= row["accuracy"] <= 1 for row in first)
    assert first[0]["compare"]["settings"] == {"lr": 0.01}
    path = compare.out / "runs" / "tune-fedavg-p0.jsonl"
    stamp = path.stat().st_mtime_ns
    assert cmp.run_jobs(jobs, compare, "tune", progress, runner)["tune-fedavg-p0"] == first
    assert ran == ["tune-fedavg-p0"] and path.stat().st_mtime_ns == stamp
    whole = path.read_text()
    path.write_text(whole.splitlines()[0] + "\n")  # a run cut short
    cmp.run_jobs(jobs, compare, "tune", progress, lambda job, clients, out: ran.append(job.name) or first)
    path.write_text(whole)
    other = cmp.tuning_jobs(compare, {"fedavg": [{"lr": 0.02}], "bayesadmm": []}, dataset)  # the same run's name
    cmp.run_jobs(other, compare, "tune", progress, lambda job, clients, out: ran.append(job.name) or first)
    assert ran == ["tune-fedavg-p0"] * 3


def test_a_run_the_server_fails_keeps_its_rows_is_not_run_again_and_never_wins(tmp_path, monkeypatch):
    """A grid point that diverges (the server's RunFailed after its rows are written, as run_federation does) is
    recorded with the server's reason instead of stopping the comparison; read again it is not rerun; it wins only
    where every point failed; a final seed that failed is counted in the table."""
    from fedbayes.deploy import inprocess
    from fedbayes.server.loop import RunFailed

    compare = spec(tmp_path)
    jobs = cmp.tuning_jobs(compare, {"fedavg": [{"lr": 0.01}], "bayesadmm": []}, compare.dataset)
    reason = "accuracy fell from 0.95 (round 1) to 0.40 (round 2), under 0.5 x its first value: training diverged"

    def diverging(run_config, clients, root):
        (root / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows([0.95, 0.40])))
        raise RunFailed(reason)

    monkeypatch.setattr(inprocess, "run_inprocess", diverging)
    progress = cmp.ProgressLine()
    kept = cmp.run_jobs(jobs, compare, "tune", progress)["tune-fedavg-p0"]
    assert [row["round"] for row in kept] == [1, 2] and all(row[cmp.FAILED_KEY] == reason for row in kept)
    assert cmp.failed(kept) == reason and cmp.failed(rows([0.5])) is None

    def never(job, clients, out):
        raise AssertionError(f"{job.name} ran again")

    assert cmp.run_jobs(jobs, compare, "tune", progress, never)["tune-fedavg-p0"] == kept
    early = [kept[0]]  # a run stopped by max-failed-rounds after one round: fewer rows, still finished
    (compare.out / "runs" / "tune-fedavg-p0.jsonl").write_text(json.dumps(early[0]) + "\n")
    assert cmp.run_jobs(jobs, compare, "tune", progress, never)["tune-fedavg-p0"] == early

    fine = rows([0.5, 0.5])
    assert cmp.best_point(cmp.tuning_scores([kept, fine])) == 1  # 0.675 diverged, 0.5 did not
    assert cmp.best_point(cmp.tuning_scores([kept, kept])) == 0  # every point failed: the best of them

    def nothing_written(run_config, clients, root):
        raise RunFailed("no row")

    monkeypatch.setattr(inprocess, "run_inprocess", nothing_written)
    shutil.rmtree(compare.out / "runs")
    with pytest.raises(RunFailed, match="no row"):
        cmp.run_jobs(jobs, compare, "tune", progress)

    grid = {"fedavg": [{"lr": 0.01}, {"lr": 0.02}], "bayesadmm": [{"lr": 0.01}]}
    tuned = {"tune-fedavg-p0": kept, "tune-fedavg-p1": fine, "tune-bayesadmm-p0": fine}
    summary = cmp.summarise(
        compare, grid, tuned, {"fedavg": [kept], "bayesadmm": [fine]}, {"fedavg": 1, "bayesadmm": 0}
    )
    fedavg = summary["strategies"]["fedavg"]
    assert fedavg["grid"][0]["failed"] == reason and fedavg["grid"][1]["failed"] is None
    assert fedavg["failed_seeds"] == {"0": reason} and summary["strategies"]["bayesadmm"]["failed_seeds"] == {}
    fedavg_row = next(line for line in cmp.markdown_table(summary).splitlines() if line.startswith("| fedavg |"))
    assert fedavg_row.endswith("| 1 (1 failed) |")


def test_the_defaults_grid_tunes_nothing_and_runs_every_key_at_its_default(tmp_path, monkeypatch):
    """A grid of one point has nothing to choose: no tuning run, the final runs at that point, and the table says
    nothing was tuned."""
    from fedbayes.deploy import inprocess

    configs = []

    def federation(run_config, clients, root):
        configs.append(run_config)
        (root / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows([0.5, 0.6])))
        return rows([0.5, 0.6])

    monkeypatch.setattr(inprocess, "run_inprocess", federation)
    compare = spec(tmp_path, grid="defaults")
    summary = cmp.compare(compare, say=lambda line: None)
    assert sorted(path.name for path in (compare.out / "runs").iterdir()) == [
        "final-bayesadmm-s0.jsonl",
        "final-fedavg-s0.jsonl",
    ]
    assert [config["strategy"] for config in configs] == ["fedavg", "bayesadmm"]
    assert not {"lr", "lr-schedule"} & {key for config in configs for key in config}  # nothing set: the defaults
    fedavg = summary["strategies"]["fedavg"]
    assert fedavg["settings"] == {} and fedavg["grid"] == [
        {"settings": {}, "validation_accuracy": None, "validation_nll": None, "failed": None}
    ]
    assert fedavg["test"]["accuracy"]["mean"] == pytest.approx(0.55)  # the mean of the last rounds, read as usual
    assert "at the one point of the `defaults` grid, nothing tuned" in (compare.out / "table.md").read_text()


def test_a_fedlap_func_point_runs_in_the_compare_engine_with_its_memory(tmp_path):
    """FedLap-Func's paper grid is δ × τ_f × schedule at lr 1e-3, and one of its points runs as a tuning job: the
    server fits w_g to the clients' memory points (one per class a client holds) every round."""
    paper = cmp.load_grid("paper")["fedlap-func"]
    assert {(p["prior-precision"], p["function-weight"]) for p in paper} == {
        (0.1, 1e-3),
        (0.1, 1e-2),
        (1.0, 1e-3),
        (1.0, 1e-2),
    }
    assert {p["lr"] for p in paper} == {1e-3}
    compare = spec(tmp_path, strategies=("fedlap-func",), overrides={**TINY, "server-fit-steps": 20})
    dataset = cmp.validation_dataset(compare, cmp.job_config(compare, "fedlap-func", {}, 0, compare.dataset))
    (job,) = cmp.tuning_jobs(compare, {"fedlap-func": [paper[0]]}, dataset)
    rows = cmp.run_job(job, compare.clients, compare.out)
    assert [row["round"] for row in rows] == [1, 2] and all(0 <= row["accuracy"] <= 1 for row in rows)
    assert all(row["memory_points"] == 20 for row in rows), rows  # 2 clients, the 10 digit classes each


def test_dsvgd_gets_the_others_client_work_one_client_a_round(tmp_path):
    """DSVGD trains one client a round: it runs `clients` rounds for each of the others', evaluated every `clients`
    rounds, and its L = L' SVGD steps are local-epochs epochs of the mean client's minibatches; P-DSVGD trains every
    client each round and keeps the rounds. The comparison's own keys may not be --set."""
    compare = spec(tmp_path, strategies=("dsvgd", "p-dsvgd"), overrides={**TINY, "particles": 2, "local-epochs": 2})
    with pytest.raises(ValueError, match="--set local-steps: the comparison sets it for dsvgd, to make client work"):
        cmp.compare(spec(tmp_path, strategies=("fedavg", "dsvgd"), overrides={**TINY, "local-steps": 5}))
    base = cmp.job_config(compare, "dsvgd", {}, 0, compare.dataset)
    dataset = cmp.validation_dataset(compare, base)
    kept = cmp.mean_client_examples(dataset, compare.clients)
    train = len(np.load(tmp_path / "digits" / "train.npz")["y"])
    assert kept == pytest.approx(0.9 * train / 2, abs=1)
    steps = cmp.epoch_steps(cmp.check_run_config(base, compare.clients), kept)
    assert steps == 2 * -(-kept // 64)
    grid = {strategy: cmp.load_grid("small")[strategy][:1] for strategy in compare.strategies}
    dsvgd, pdsvgd = cmp.tuning_jobs(compare, grid, dataset, steps)
    assert (dsvgd.rounds, dsvgd.run_config["eval-every"]) == (4, 2)
    assert (pdsvgd.rounds, "eval-every" in pdsvgd.run_config) == (2, False)
    (final,) = cmp.final_jobs(compare, grid, {"dsvgd": 0}, steps)[:1]
    for job in (dsvgd, pdsvgd, final):
        assert job.run_config["local-steps"] == job.run_config["distill-steps"] == steps
    # the final runs hold out each client's validation share to evaluate on, so train on as many examples as tuning
    assert (final.rounds, final.run_config["client-eval-fraction"], "client-eval-fraction" in dsvgd.run_config) == (
        4,
        0.1,
        False,
    )
    rows = cmp.run_job(dsvgd, compare.clients, compare.out)
    assert [row["round"] for row in rows] == [1, 2, 3, 4]
    assert [row.get("accuracy_ensemble") is not None for row in rows] == [False, True, False, True]
    assert cmp.finished_rows(dsvgd, compare.out) == rows  # all 4 of its rounds: read, not run again


def test_each_clients_metrics_are_its_own_last_evaluations_then_the_mean_or_the_worst():
    """Every client every round: each client's mean over its last 3 rounds; one client a round (DSVGD): each
    client's own last turns, not the last 3 rows' single clients."""

    def held_out(**accuracy):
        return {"client_metrics": {client: {"accuracy": a, "ece": 1 - a} for client, a in accuracy.items()}}

    every_round = [held_out(a=0.1, b=0.9), held_out(a=0.5, b=0.6), held_out(a=0.6, b=0.7), held_out(a=0.7, b=0.8)]
    assert cmp.client_tail(every_round, "client_accuracy_mean") == pytest.approx((0.6 + 0.7) / 2)
    assert cmp.client_tail(every_round, "client_accuracy_worst") == pytest.approx(0.6)  # a: (0.5 + 0.6 + 0.7) / 3
    assert cmp.client_tail(every_round, "client_ece_worst") == pytest.approx(0.4)
    turns = [held_out(a=0.2), held_out(b=0.9), held_out(a=0.4), held_out(b=0.7), {"round": 5}]
    assert cmp.client_tail(turns, "client_accuracy_worst", count=1) == pytest.approx(0.4)  # a's last turn, then b's
    assert cmp.client_tail(turns, "client_accuracy_mean", count=2) == pytest.approx((0.3 + 0.8) / 2)
    assert cmp.client_tail([{"round": 1}], "client_accuracy_mean") is None
