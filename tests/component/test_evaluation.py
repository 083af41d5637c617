"""The server's evaluation (server/evaluation.py): the ensemble batched or one pass per sample agrees; the default
MLP evaluation computes what it computed before; rounds between `eval-every` evaluations write rows without test
metrics that every reader of rows copes with; the `eval-fraction` subset is seeded, fixed and gives way to the whole
test set in the last round; defaults follow the model's cost; bad values are refused naming the key."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from torch import nn

from fedbayes.bayes.metrics import classification_metrics, predict_probs
from fedbayes.bayes.params import set_parameters
from fedbayes.deploy.launcher import format_row
from fedbayes.deploy.progress import Progress, RoundDone
from fedbayes.posterior.uncertainty import predictive, uncertainty_metrics
from fedbayes.server.checkpoint import CheckpointStore
from fedbayes.server.evaluation import (
    ServerEvaluation,
    batched_member_probs,
    compute_threads,
    evaluation_subset,
    member_probs,
    with_evaluation_defaults,
)
from fedbayes.server.loop import progress_line
from fedbayes.tasks.config import ConfigError, round_seed
from fedbayes.tasks.datasets import Dataset
from fedbayes.tasks.models import build_model
from fedbayes.tasks.ood import ood_inputs
from fedbayes.tasks.report import load_runs, read_rows, summary
from tests.support import DEFAULTS, NO_GPU, fedavg_reply, rows, settings
from tests.support import run_loop as run

CPU = torch.device("cpu")
IMAGE = (1, 28, 28)


def images(count: int, shape=IMAGE, classes: int = 10) -> Dataset:
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(count, *shape, generator=generator)
    return Dataset("test", pixels, torch.randint(0, classes, (count,), generator=generator), classes, pixel_scale=1.0)


class GaussianStrategy:
    """What the evaluation asks of a strategy: posterior samples (N(the model's weights, 0.05²)) and its buffers."""

    def __init__(self, model: nn.Module) -> None:
        self.mean = {name: value.detach().numpy().copy() for name, value in model.named_parameters()}
        self.buffer_layout = {name: tuple(value.shape) for name, value in model.named_buffers()}

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        return [
            {
                name: value + 0.05 * torch.randn(value.shape, generator=generator).numpy()
                for name, value in self.mean.items()
            }
            for _ in range(count)
        ]


def global_arrays(model: nn.Module) -> dict:
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({name: Array(value.detach().numpy().copy()) for name, value in model.state_dict().items()})


def evaluation(
    model_name: str, count: int = 40, device: torch.device = CPU, **overrides
) -> tuple[ServerEvaluation, nn.Module, Dataset]:
    torch.manual_seed(0)
    model, test = build_model(model_name, IMAGE, 10), images(count)
    run_settings = with_evaluation_defaults(settings(model=model_name, **overrides), model, IMAGE)
    return ServerEvaluation(model, test, GaussianStrategy(model), run_settings.evaluation, device), model, test


@pytest.mark.parametrize("model_name", ["mlp", "cnn-zenke", "resnet20"])
def test_batched_and_one_pass_per_sample_ensembles_agree_to_round_off(model_name):
    torch.manual_seed(0)
    model, test = build_model(model_name, IMAGE, 10), images(30)
    members = GaussianStrategy(model).posterior_samples(3, torch.Generator().manual_seed(1))
    one_each = member_probs(model, members, test.images, 16, CPU)
    batched = batched_member_probs(model, members, test.images, 16, CPU)  # 5 images x 3 members per pass
    assert batched.shape == one_each.shape == (3, 30, 10)
    torch.testing.assert_close(batched, one_each, rtol=0, atol=1e-6)
    assert not torch.equal(one_each[0], one_each[1])  # the members differ: each one's weights were used
    exact, rounded = (classification_metrics(probs.mean(0), test.labels) for probs in (one_each, batched))
    assert rounded["accuracy"] == exact["accuracy"] and rounded["reliability"]["count"] == exact["reliability"]["count"]
    assert rounded["nll"] == pytest.approx(exact["nll"], rel=1e-6) and rounded["ece"] == pytest.approx(
        exact["ece"], abs=1e-6
    )


def test_eval_batched_rows_agree_with_one_pass_per_sample():
    one_each, model, _ = evaluation("cnn-zenke", **{"eval-fraction": 1.0, "ensemble-samples": 3})
    batched, _, _ = evaluation("cnn-zenke", **{"eval-fraction": 1.0, "ensemble-samples": 3, "eval-batched": True})
    arrays = global_arrays(model)  # before an evaluation loads its samples into the model
    row, batched_row = one_each(arrays, 3), batched(arrays, 3)  # the last round
    assert batched_row.keys() == row.keys() and batched_row["eval_samples"] == 3
    for key in ("accuracy", "nll", "ece", "accuracy_ensemble", "nll_ensemble", "ece_ensemble"):
        assert batched_row[key] == pytest.approx(row[key], rel=1e-6, abs=1e-7), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("batched", [False, True])
def test_the_evaluation_on_a_gpu_gives_the_rows_of_the_cpu(batched):
    keys = {"eval-fraction": 1.0, "ensemble-samples": 3, "eval-batched": batched}
    on_cpu, model, _ = evaluation("cnn-zenke", **keys)
    on_gpu, _, _ = evaluation("cnn-zenke", device=torch.device("cuda"), **keys)
    arrays = global_arrays(model)
    row, gpu_row = on_cpu(arrays, 3), on_gpu(arrays, 3)
    assert gpu_row.keys() == row.keys() and gpu_row["eval_samples"] == 3
    # cuDNN may use TF32 in convolutions: agreement to its round-off, not to float32's
    for key in ("nll", "nll_ensemble"):
        assert gpu_row[key] == pytest.approx(row[key], rel=1e-2), key
    for key in ("accuracy", "accuracy_ensemble"):
        assert abs(gpu_row[key] - row[key]) <= 0.05, key


def test_the_default_mlp_evaluation_computes_what_the_server_computed_before():
    """The ServerApp's evaluation before eval-* (server/app.py's `evaluate`), against the default one now."""
    evaluate, model, test = evaluation("mlp", count=300, **{"eval-batch-size": 128})
    strategy, run_settings = evaluate.strategy, evaluate.settings
    assert (run_settings.eval_every, run_settings.eval_fraction, run_settings.ensemble_samples) == (1, 1.0, 32)

    def predict(weights):
        set_parameters(model, weights)
        return predict_probs(model, test.images, 128, CPU)

    arrays = global_arrays(model)
    before = classification_metrics(predict({name: arrays[name].numpy() for name in arrays}), test.labels)
    samples = strategy.posterior_samples(32, torch.Generator().manual_seed(round_seed(run_settings.seed, 2)))
    ensemble = torch.stack([predict(sample) for sample in samples]).mean(0)
    before |= {f"{key}_ensemble": value for key, value in classification_metrics(ensemble, test.labels).items()}
    now = evaluate(arrays, 2)
    assert {key: now[key] for key in before} == before  # bit for bit
    assert (now["eval_examples"], now["eval_fraction"], now["eval_samples"]) == (300, 1.0, 32)


def test_the_uncertainty_metrics_are_those_of_each_predictive_on_the_test_and_ood_inputs():
    evaluate, model, test = evaluation("mlp", count=120, **{"ensemble-samples": 3, "ood-inputs": "inverted"})
    arrays = global_arrays(model)
    mean = {name: arrays[name].numpy() for name in arrays}
    samples = evaluate.strategy.posterior_samples(3, torch.Generator().manual_seed(round_seed(0, 1)))
    ood = ood_inputs("inverted", test, seed=0)
    row = evaluate(arrays, 1)
    for suffix, members in (("", [mean]), ("_ensemble", samples)):
        on_test, on_ood = (predictive(member_probs(model, members, inputs, 2000, CPU)) for inputs in (test.images, ood))
        expected = uncertainty_metrics(on_test, test.labels, on_ood)
        assert {f"{key}{suffix}": value for key, value in expected.items()} == {
            f"{key}{suffix}": row[f"{key}{suffix}"] for key in expected
        }
    assert "misclassification_auroc_mi" not in row and "ood_auroc_mi" not in row  # the mean is one model
    assert 0 <= row["ood_auroc_mi_ensemble"] <= 1 and row["ood_inputs"] == "inverted"
    assert evaluation("mlp", count=120, **{"ensemble-samples": 3, "ood-inputs": "inverted"})[0](arrays, 1) == row


def test_without_ood_inputs_the_ood_aurocs_are_null_and_the_row_says_why():
    evaluate, model, _ = evaluation("logreg", count=60, **{"ensemble-samples": 2, "ood-inputs": "none"})
    row = evaluate(global_arrays(model), 1)
    assert row["ood_inputs"] == "none"
    assert [row[key] for key in ("ood_auroc", "ood_auroc_ensemble", "ood_auroc_mi_ensemble")] == [None, None, None]
    assert 0 <= row["misclassification_auroc_mi_ensemble"] <= 1 and 0 <= row["selective_accuracy_80"] <= 1


def test_defaults_follow_the_model_cost_and_what_is_set_is_kept():
    cores = len(os.sched_getaffinity(0))
    for model_name, defaults in (
        ("logreg", (1, 1.0, 32, 1)),
        ("mlp", (1, 1.0, 32, 1)),
        ("cnn-zenke", (5, 0.1, 4, cores)),
        ("cnn-acar", (5, 0.1, 4, cores)),
        ("resnet20", (5, 0.1, 4, cores)),
    ):
        resolved = with_evaluation_defaults(settings(), build_model(model_name, IMAGE, 10), IMAGE)
        assert (
            resolved.eval_every,
            resolved.eval_fraction,
            resolved.ensemble_samples,
            resolved.eval_threads,
        ) == defaults, model_name
    chosen = {"eval-every": 3, "eval-fraction": 0.5, "ensemble-samples": 0, "eval-threads": 1}
    resolved = with_evaluation_defaults(settings(**chosen), build_model("cnn-zenke", IMAGE, 10), IMAGE)
    assert (resolved.eval_every, resolved.eval_fraction, resolved.ensemble_samples, resolved.eval_threads) == (
        3,
        0.5,
        0,
        1,
    )


def test_the_subset_is_drawn_from_the_run_seed_and_fixed():
    subset = evaluation_subset(10_000, 0.1, seed=7)
    assert len(subset) == 1000 and len(set(subset.tolist())) == 1000
    assert torch.equal(subset, subset.sort().values) and 0 <= subset.min() and subset.max() < 10_000
    assert torch.equal(subset, evaluation_subset(10_000, 0.1, seed=7))
    assert not torch.equal(subset, evaluation_subset(10_000, 0.1, seed=8))
    assert len(evaluation_subset(10, 0.01, seed=0)) == 1  # never empty
    assert torch.equal(evaluation_subset(50, 1.0, seed=3), torch.arange(50))


def test_rounds_before_the_last_evaluate_the_seeded_subset_and_the_last_the_whole_test_set():
    evaluate, model, test = evaluation(
        "mlp", count=200, **{"eval-fraction": 0.25, "num-server-rounds": 4, "ensemble-samples": 2}
    )
    arrays = global_arrays(model)
    subset = test.subset(evaluation_subset(200, 0.25, seed=0))
    early, last = evaluate(arrays, 3), evaluate(arrays, 4)
    assert (early["eval_examples"], early["eval_fraction"], early["eval_samples"]) == (50, 0.25, 2)
    assert (last["eval_examples"], last["eval_fraction"], last["eval_samples"]) == (200, 1.0, 2)
    expected = classification_metrics(
        member_probs(model, [{n: arrays[n].numpy() for n in arrays}], subset.images, 2000, CPU)[0], subset.labels
    )
    assert {key: early[key] for key in expected} == expected
    assert evaluate(arrays, 2)["accuracy"] == early["accuracy"]  # the same examples every round


def test_the_evaluation_runs_on_eval_threads_and_gives_the_others_back():
    seen = []

    class Recording(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            seen.append(torch.get_num_threads())
            return self.fc(x.flatten(1))

    model, test = Recording(), images(8, shape=(1, 2, 2), classes=3)
    evaluate = ServerEvaluation(
        model,
        test,
        GaussianStrategy(model),
        with_evaluation_defaults(settings(**{"eval-threads": 3, "ensemble-samples": 2}), model, (1, 2, 2)).evaluation,
        CPU,
    )
    before = torch.get_num_threads()
    evaluate(global_arrays(model), 1)
    assert seen[-3:] == [3, 3, 3] and torch.get_num_threads() == before  # the mean and 2 samples
    with compute_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


class Tiny(nn.Module):
    """tests/support LAYOUT as a model: fc.weight (3, 4), fc.bias (3,)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(x.flatten(1))


def test_eval_every_writes_rows_without_test_metrics_that_every_reader_of_rows_copes_with(tmp_path):
    model, test = Tiny(), images(40, shape=(1, 2, 2), classes=3)
    run_settings = with_evaluation_defaults(
        settings(**{"num-server-rounds": 5, "eval-every": 2, "eval-fraction": 0.5, "ensemble-samples": 2}),
        model,
        (1, 2, 2),
    )
    evaluate = ServerEvaluation(model, test, GaussianStrategy(model), run_settings.evaluation, CPU)
    run(
        tmp_path,
        lambda server_round, node: fedavg_reply(f"client-{node}", server_round, value=0.1 * server_round),
        rounds=5,
        evaluate=evaluate,
    )
    written = rows(tmp_path)
    evaluated = [row["round"] for row in written if row["accuracy"] is not None]
    assert evaluated == [2, 4, 5]
    for row in written:
        if row["round"] in (1, 3):
            assert (row["nll"], row["ece"], row["reliability"], row["eval_examples"], row["eval_samples"]) == (
                None,
                None,
                None,
                0,
                0,
            ) and "accuracy_ensemble" not in row
            assert [row[key] for key in ("misclassification_auroc", "selective_accuracy_80", "ood_auroc")] == [None] * 3
            assert row["ood_inputs"] is None and "ood_auroc_ensemble" not in row
        else:
            full = row["round"] == 5
            assert (row["eval_examples"], row["eval_fraction"], row["eval_samples"]) == (
                (40, 1.0, 2) if full else (20, 0.5, 2)
            )
            assert 0 <= row["accuracy_ensemble"] <= 1
    # the ServerApp's log line, and the progress line `fedbayes local` makes of the rows
    lines = [progress_line(row, 5) for row in written]
    assert "acc - | nll - | ece -" in lines[0] and "on 20 test examples" in lines[1] and "test examples" not in lines[4]
    done = [RoundDone(row["round"], 5, row["accuracy"], row["clients"], row["clients_sent"]) for row in written]
    assert [d.accuracy is None for d in done] == [True, False, True, False, False]

    class Stream:
        text = ""

        def write(self, text):
            self.text += text

        def flush(self):
            pass

        def isatty(self):
            return False

    stream = Stream()
    with Progress(stream) as progress:
        for parsed in done[:3]:
            progress.round_done(parsed)
    assert f"accuracy {written[1]['accuracy']:.4f} (round 2)" in stream.text.splitlines()[-1]
    assert "accuracy -" in stream.text.splitlines()[0]
    # `fedbayes local`'s table
    table = [format_row(row) for row in written]
    assert table[0].split()[1:4] == ["-", "-", "-"] and "(on 20 test examples)" in table[1]
    assert "test examples" not in table[4]
    # `fedbayes report`: the last evaluated row's metrics
    results = tmp_path / "r.jsonl"
    assert read_rows(results, pytest.fail) == written  # every field one the report can read
    lines = summary(load_runs([results])[0])
    assert lines["last accuracy / NLL / ECE"].startswith(f"{written[4]['accuracy']:.4f}")
    last = written[4]
    assert lines["last AUROC errors / OOD (noise), accuracy at 80%"] == ", ".join(
        [f"{last['misclassification_auroc']:.4f} / {last['ood_auroc']:.4f}", f"{last['selective_accuracy_80']:.4f}"]
    )
    assert (
        f"(by MI {last['misclassification_auroc_mi_ensemble']:.4f} / "
        in (lines["ensemble AUROC errors / OOD (noise), accuracy at 80%"])
    )
    results.write_text("".join(json.dumps(row) + "\n" for row in written[:3]))  # a run still going: round 3 is last
    assert summary(load_runs([results])[0])["evaluated"] == "round 2, on 20 test examples"


def test_the_evaluation_keys_may_change_on_resume(tmp_path):
    from tests.support import checkpoint

    CheckpointStore(tmp_path, "fed", DEFAULTS).save(checkpoint())
    changed = {**DEFAULTS, "eval-every": 7, "eval-fraction": 0.3, "eval-threads": 1, "eval-batched": True}
    changed["ood-inputs"] = "none"
    assert CheckpointStore(tmp_path, "fed", changed).load().server_round == 3


@pytest.mark.parametrize(
    ("key", "value", "requirement"),
    [
        ("eval-every", -1, "must be >= 0"),
        ("eval-fraction", 1.5, r"must be in \(0, 1\], or 0"),
        ("eval-fraction", -0.1, r"must be in \(0, 1\], or 0"),
        ("eval-threads", -2, "must be >= 0"),
        ("ensemble-samples", -2, "must be >= 0, or -1"),
        ("eval-batched", "yes", "must be bool"),
        ("ood-inputs", "mnist", "must be one of noise, inverted, permuted, none"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(key, value, requirement):
    with pytest.raises(ConfigError, match=rf"run config '{key}' {requirement}"):
        settings(**{key: value})
