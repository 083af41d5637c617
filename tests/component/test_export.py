"""`fedbayes export` / `fedbayes predict`: every strategy's posterior exported from a real server half's checkpoint
(in-process federation), read back as the server holds it, predicting bit for bit as the server evaluates (at the
mean, and its ensemble with the round's seed); damaged, edited, newer and unbuildable files refused by name; and
one real federation end to end (integration)."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from fedbayes.bayes.metrics import predict_probs
from fedbayes.bayes.params import flatten, set_parameters
from fedbayes.deploy.cli import main
from fedbayes.posterior import PosteriorFileError, load
from fedbayes.posterior.export import ExportError, RunLocation, export_posterior, locate_run
from fedbayes.server.checkpoint import Checkpoint, CheckpointError, CheckpointStore
from fedbayes.tasks.config import round_seed
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import build_model
from tests.support import DEFAULTS, InProcessFederation
from tests.support.crafted import edit_json_metadata, in_child, key_pair, write_user_models
from tests.support.crafted import rewrite_safetensors as rewrite

KINDS = {
    "fedavg": "point",
    "fedprox": "point",
    "feddyn": "point",
    "fedpa": "point",
    "fedadmm": "point",
    "bayesadmm": "gaussian-diagonal",
    "bayesadmm-full": "gaussian-full",
    "fedlap": "gaussian-diagonal",
    "fedlap-cov": "gaussian-diagonal",
    "fedlap-func": "gaussian-diagonal",
    "dsvgd": "particles",
    "p-dsvgd": "particles",
    "u-dsvgd": "particles",
}
DSVGD = {"particles": 3, "local-steps": 2, "distill-steps": 2, "server-steps": 2}


class Trained:
    """Two rounds of an in-process federation on synthetic data whose test set is `<tmp>/data/test.npz`, round 1
    and 2 checkpointed as server/loop.py checkpoints them."""

    def __init__(self, tmp_path, strategy: str, **overrides):
        data = tmp_path / "data"
        data.mkdir()
        rng = np.random.default_rng(7)
        x = rng.normal(size=(60, 1, 1, 5)).astype(np.float32)
        np.savez(data / "test.npz", x=x, y=(x.reshape(60, 5) @ rng.normal(size=5) > 0).astype(np.int64))
        self.x, self.data = x, data
        self.overrides = {
            "strategy": strategy,
            "dataset": f"npz:{data}",
            "ensemble-samples": 3,
            "seed": 5,
            "eval-batch-size": 16,
            **(DSVGD if strategy.endswith("dsvgd") else {}),
            **({"server-fit-steps": 20} if strategy == "fedlap-func" else {}),
            **overrides,
        }
        self.federation = InProcessFederation(tmp_path, self.overrides, sizes=[10, 14])
        self.state_dir = tmp_path / "server-state"
        store = CheckpointStore(self.state_dir, "fed", {**DEFAULTS, "model": "logreg", **self.overrides})
        for server_round in (1, 2):
            self.federation.round(server_round, [1, 2])
            store.save(Checkpoint(server_round, self.arrays(), self.federation.core.state_dict(), 1.0))

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: self.federation.arrays[name].numpy() for name in self.federation.arrays}

    def export(self, out, server_round=0):
        # A server state directory does not record the evaluation batch size (a resumed run may change it).
        return export_posterior(RunLocation(self.state_dir, "fed", {}), out, server_round, eval_batch_size=16)

    def server_evaluation(self, server_round: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The probabilities server/app.py's `evaluate` computes for the round just trained: at the global arrays,
        and its ensemble of the strategy's posterior samples (None for a point estimate)."""
        settings, server = self.federation.settings, self.federation.server
        test = load_dataset(settings.dataset, train=False).scaled(settings.input_scale)
        model = build_model("logreg", test.input_shape, test.num_classes)

        def predict(weights):
            set_parameters(model, weights)
            return predict_probs(model, test.images, settings.eval_batch_size, torch.device("cpu"))

        at_mean = predict(self.arrays())
        generator = torch.Generator().manual_seed(round_seed(settings.seed, server_round))
        samples = server.posterior_samples(settings.ensemble_samples, generator)
        return at_mean, torch.stack([predict(sample) for sample in samples]).mean(0) if samples else None


@pytest.mark.parametrize("strategy", list(KINDS))
def test_every_strategy_exports_what_it_holds_and_predicts_as_its_server_evaluates(tmp_path, strategy):
    trained = Trained(tmp_path, strategy)
    header = trained.export(tmp_path / "q.safetensors")
    posterior = load(tmp_path / "q.safetensors")
    assert header == posterior.header and header.kind == KINDS[strategy]
    assert (header.strategy, header.round, header.federation, header.seed) == (strategy, 2, "fed", 5)
    assert (header.input_shape, header.num_classes, header.model.model) == ((1, 1, 5), 2, "logreg")
    assert (header.ensemble_samples, header.eval_batch_size, header.pixel_scale) == (3, 16, 1.0)
    server = trained.federation.server
    at_mean, ensemble = trained.server_evaluation(2)
    prediction = posterior.predict(trained.x, samples=0)
    assert torch.equal(prediction.probs, at_mean)  # bit for bit
    default = posterior.predict(trained.x)  # the run's ensemble-samples, the server's seed for the round
    if ensemble is None:
        assert KINDS[strategy] in ("point", "gaussian-diagonal")  # FedLap's server evaluates at the mean only
    else:
        assert torch.equal(default.probs, ensemble)  # bit for bit
    if KINDS[strategy] == "point":
        assert default.members == 1 and torch.equal(default.probs, at_mean)
        assert torch.all(default.mutual_information == 0)
    else:
        assert default.members == 3 and (default.mutual_information > 0).any()
    if strategy in ("bayesadmm", "bayesadmm-full"):
        assert torch.equal(posterior.gaussian.precision, server.global_.precision)
    if strategy in ("fedlap", "fedlap-cov"):
        assert torch.equal(posterior.gaussian.precision, server.global_precision)
    if strategy == "fedlap-func":  # N(w_g, I/δ), and none of the memory inputs the server holds
        assert torch.equal(posterior.gaussian.precision, server.state.sites.global_precision)
        with safe_open(tmp_path / "q.safetensors", framework="np") as exported:
            assert {name.split("/")[0] for name in exported.keys()} == {"mean", "precision"}
    if KINDS[strategy] == "particles":
        stacked = np.stack([flatten(particle, header.parameters, np.float32) for particle in posterior.particles])
        assert np.array_equal(stacked, server.particles)


def test_the_header_is_open_json_and_says_what_the_posterior_is(tmp_path):
    trained = Trained(tmp_path, "fedpa")
    trained.export(tmp_path / "q.safetensors")
    with safe_open(tmp_path / "q.safetensors", framework="np") as exported:
        metadata = exported.metadata()
        names = set(exported.keys())
    assert metadata["format"] == "fedbayes-posterior" and metadata["format_version"] == "1"
    header = json.loads(metadata["header"])
    assert header["kind"] == "point" and "no posterior estimate beyond it" in header["note"]
    assert header["model"] == {"model": "logreg", "hidden": [200, 100], "activation": "sigmoid", "pool": 1}
    assert header["parameters"] == [["1.weight", [2, 5]], ["1.bias", [2]]]
    assert names == {"mean/1.weight", "mean/1.bias"}


def test_a_kept_round_is_exported_and_a_missing_one_refused_naming_the_kept(tmp_path):
    trained = Trained(tmp_path, "bayesadmm")
    assert trained.export(tmp_path / "r1.safetensors", server_round=1).round == 1
    with pytest.raises(CheckpointError, match=r"no checkpoint of round 5 \(kept rounds: 1, 2"):
        trained.export(tmp_path / "r5.safetensors", server_round=5)
    assert not (tmp_path / "r5.safetensors").exists()


def test_a_run_is_found_from_its_workdir_or_its_state_directory_and_federation(tmp_path):
    trained = Trained(tmp_path, "fedavg")
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "run-config.toml").write_text(
        f'federation = "fed"\nserver-state-dir = "{trained.state_dir}"\neval-batch-size = 8\n'
    )
    location = locate_run(workdir, None)
    assert (location.state_dir, location.federation) == (trained.state_dir, "fed")
    assert export_posterior(location, tmp_path / "q.safetensors").eval_batch_size == 8  # the workdir's run config
    listed = r"not a `fedbayes local` workdir .* --federation \(federations with checkpoints in .*: fed\)"
    with pytest.raises(ExportError, match=listed):
        locate_run(trained.state_dir, None)
    with pytest.raises(ExportError, match="holds no server checkpoint"):
        locate_run(trained.state_dir, "other")


def edit_header(**fields):
    return edit_json_metadata("header", **fields)


@pytest.fixture
def exported(tmp_path):
    Trained(tmp_path, "bayesadmm").export(tmp_path / "q.safetensors")
    return tmp_path / "q.safetensors"


def test_a_truncated_file_is_refused(exported):
    exported.write_bytes(exported.read_bytes()[:-40])
    with pytest.raises(PosteriorFileError, match=f"{exported} is unreadable"):
        load(exported)


def test_edited_values_or_header_are_refused_by_the_checksum(exported):
    original = exported.read_bytes()
    rewrite(exported, change_tensors=lambda t: t["mean/1.bias"].__setitem__(0, 1.0), keep_checksum=True)
    with pytest.raises(PosteriorFileError, match=f"{exported} is damaged: 'checksum' does not match"):
        load(exported)
    exported.write_bytes(original)
    rewrite(exported, change_metadata=edit_header(round=9), keep_checksum=True)
    with pytest.raises(PosteriorFileError, match="'checksum' does not match"):
        load(exported)


def test_a_newer_format_is_refused_asking_for_a_newer_fedbayes(exported):
    rewrite(exported, change_metadata=lambda metadata: metadata.update(format_version="2"))
    with pytest.raises(PosteriorFileError, match=f"{exported} has posterior format version 2, .* upgrade fedbayes"):
        load(exported)


def test_a_model_spec_that_does_not_build_or_fit_is_refused(exported):
    spec = {"model": "mlp", "hidden": [3], "activation": "sigmoid", "pool": 1}
    rewrite(exported, change_metadata=edit_header(model=spec))  # deeper than the file's two tensors allow
    with pytest.raises(PosteriorFileError, match=f"{exported}: its model spec .* does not fit here: .* 4 parameter"):
        load(exported)
    rewrite(exported, change_metadata=edit_header(model={**spec, "model": "resnet20"}))
    with pytest.raises(PosteriorFileError, match="does not fit here: .*the model's tensors are not those held"):
        load(exported)
    rewrite(exported, change_metadata=edit_header(model={**spec, "model": "logreg", "activation": "gelu"}))
    with pytest.raises(PosteriorFileError, match="does not fit here: .*unknown activation 'gelu'"):
        load(exported)
    with pytest.raises(PosteriorFileError, match=r"built as no_such_module:build does not fit here: .*cannot load"):
        load(exported, model="no_such_module:build")


def test_a_header_inconsistent_with_the_tensors_is_refused(exported):
    rewrite(exported, change_metadata=edit_header(kind="particles", particles=4))
    with pytest.raises(PosteriorFileError, match="'particles/1.bias' is missing"):
        load(exported)


def test_a_server_checkpoint_is_not_an_export(tmp_path):
    trained = Trained(tmp_path, "fedavg")
    checkpoint = CheckpointStore(trained.state_dir, "fed", {}).path
    with pytest.raises(PosteriorFileError, match="is not a fedbayes posterior export"):
        load(checkpoint)


def test_export_and_predict_commands(tmp_path, capsys):
    trained = Trained(tmp_path, "bayesadmm")
    out, preds = tmp_path / "q.safetensors", tmp_path / "preds.npz"
    assert main(["export", str(trained.state_dir), "--federation", "fed", "--out", str(out)]) == 0
    assert "does not record the evaluation batch size; the header says 2000" in capsys.readouterr().out
    assert main(["predict", str(out), str(trained.data / "test.npz"), "--out", str(preds), "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "most uncertain 3 (by mutual information" in printed
    written = np.load(preds)
    expected = load(out).predict(trained.x)
    assert np.array_equal(written["probs"], expected.probs.numpy())
    assert np.array_equal(written["mutual_information"], expected.mutual_information.numpy())
    assert set(written.files) == {"probs", "entropy", "expected_entropy", "mutual_information", "preds"}
    np.savez(tmp_path / "unlabelled.npz", x=trained.x)  # no labels: no metrics, the uncertainty still
    assert main(["predict", str(out), str(tmp_path / "unlabelled.npz")]) == 0
    printed = capsys.readouterr().out
    assert "accuracy" not in printed and "mutual information" in printed
    out.write_bytes(out.read_bytes()[:100])
    assert main(["predict", str(out), str(trained.data / "test.npz")]) == 1
    assert f"fedbayes: error: exported posterior {out} is unreadable" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["predict", "f", "d.npz", "--samples", "-1"], "argument --samples: must be >= 0, got '-1'"),
        (["predict", "f", "d.npz", "--batch-size", "0"], "argument --batch-size: must be >= 1, got '0'"),
        (["export", "run", "--out", "f", "--round", "0"], "argument --round: must be >= 1, got '0'"),
    ],
)
def test_options_out_of_range_are_refused_naming_them(capsys, args, message):
    with pytest.raises(SystemExit) as refused:
        main(args)
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {message}")


# ---- a checkpoint's run config names no code that is imported unless the user names it ---------------------------
def edit_run_config(trained: Trained, **fields) -> None:
    """The newest checkpoint's run config changed, its checksum recomputed: as anyone who edits the file can."""
    newest = CheckpointStore(trained.state_dir, "fed", {}).path.resolve()
    rewrite(newest, change_metadata=edit_json_metadata("run_config", **fields))


def test_a_model_a_checkpoint_names_is_imported_only_when_the_user_names_it(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_user_models(tmp_path)
    trained = Trained(tmp_path, "bayesadmm")
    expected = export_posterior(RunLocation(trained.state_dir, "fed", {}), tmp_path / "logreg.safetensors")
    edit_run_config(trained, model="user_models:linear")
    with pytest.raises(ExportError, match=r"checkpoint-2.safetensors names model 'user_models:linear', code") as error:
        export_posterior(RunLocation(trained.state_dir, "fed", {}), tmp_path / "q.safetensors")
    assert str(error.value).endswith("If you trust that code, name it yourself: --model user_models:linear")
    assert not (tmp_path / "imported").exists() and not (tmp_path / "q.safetensors").exists()
    with pytest.raises(ExportError, match="--model user_models:other was given, but .* names model 'user_models:li"):
        export_posterior(RunLocation(trained.state_dir, "fed", {}, {"model": "user_models:other"}), tmp_path / "q")
    named = RunLocation(trained.state_dir, "fed", {}, {"model": "user_models:linear"})
    header = export_posterior(named, tmp_path / "q.safetensors")
    assert (tmp_path / "imported").exists() and header.model.model == "user_models:linear"
    with pytest.raises(PosteriorFileError, match="header names model 'user_models:linear'"):
        load(tmp_path / "q.safetensors")
    own = load(tmp_path / "q.safetensors", model="user_models:linear").predict(trained.x)
    assert torch.equal(own.probs, load(tmp_path / "logreg.safetensors").predict(trained.x).probs)
    assert expected.parameters == header.parameters


def test_a_strategy_a_checkpoint_names_is_refused_before_it_is_imported(tmp_path, capsys):
    trained = Trained(tmp_path, "fedavg")
    (tmp_path / "evil.py").write_text("import pathlib\npathlib.Path(__file__).with_name('imported').touch()\n")
    edit_run_config(trained, strategy="evil:ALGORITHM")
    state, out = str(trained.state_dir), str(tmp_path / "q.safetensors")
    assert main(["export", state, "--federation", "fed", "--out", out]) == 1
    assert "names strategy 'evil:ALGORITHM', code that would be imported" in capsys.readouterr().err
    assert main(["export", state, "--federation", "fed", "--out", out, "--strategy", "fedavg"]) == 1
    assert "--strategy fedavg was given, but" in capsys.readouterr().err
    assert not (tmp_path / "imported").exists()


def test_a_checkpoint_whose_run_config_claims_a_huge_model_is_refused_before_it_is_built(tmp_path):
    trained = Trained(tmp_path, "fedavg")
    edit_run_config(trained, model="mlp", hidden="100000,100000")  # 40 GB of weights, had it been built
    export = ["export", "server-state", "--federation", "fed", "--out", "q.safetensors"]
    child = in_child(f"from fedbayes.deploy.cli import main\nrc = main({export!r})", cwd=tmp_path)
    assert child.rc == 1 and "mlp with 2 hidden layers has 6 parameter tensors, more than the 2" in child.stderr
    assert child.extra_mib < 256 and not (tmp_path / "q.safetensors").exists()


def test_export_signs_and_predict_verifies(tmp_path, capsys):
    trained = Trained(tmp_path, "bayesadmm")
    private, public = key_pair(tmp_path, "signer")
    _, other = key_pair(tmp_path, "other")
    out, data = tmp_path / "q.safetensors", str(trained.data / "test.npz")
    assert (
        main(["export", str(trained.state_dir), "--federation", "fed", "--out", str(out), "--sign", str(private)]) == 0
    )
    assert f"signed with {private}" in capsys.readouterr().out
    assert main(["predict", str(out), data, "--verify", str(public)]) == 0
    assert f"signature verified with {public}" in capsys.readouterr().out
    assert main(["predict", str(out), data, "--verify", str(other)]) == 1
    assert f"its signature does not verify with {other}" in capsys.readouterr().err
    assert (
        main(
            [
                "export",
                str(trained.state_dir),
                "--federation",
                "fed",
                "--out",
                str(tmp_path / "u"),
                "--sign",
                str(public),
            ]
        )
        == 1
    )
    assert "not an unencrypted PEM or OpenSSH private key" in capsys.readouterr().err
    assert not (tmp_path / "u").exists()
