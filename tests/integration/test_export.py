"""`fedbayes export` / `fedbayes predict`: every strategy's posterior exported from a real server half's checkpoint
(in-process federation), read back as the server holds it, predicting bit for bit as the server evaluates (at the
mean, and its ensemble with the round's seed); damaged, edited, newer and unbuildable files refused by name; and
one real federation end to end (integration)."""

import json
import tomllib

import numpy as np
import pytest
import torch

from fedbayes.bayes.metrics import classification_metrics, predict_probs
from fedbayes.bayes.params import set_parameters
from fedbayes.posterior import load
from fedbayes.posterior.export import RunLocation, export_posterior
from fedbayes.server.checkpoint import Checkpoint, CheckpointStore
from fedbayes.tasks.config import round_seed
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.models import build_model
from fedbayes.tasks.npzdata import write_npz
from tests.support import DEFAULTS, InProcessFederation
from tests.support.processes import fedbayes

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


@pytest.fixture
def exported(tmp_path):
    Trained(tmp_path, "bayesadmm").export(tmp_path / "q.safetensors")
    return tmp_path / "q.safetensors"


@pytest.mark.integration
def test_a_real_bayesadmm_federation_exported_and_predicted_as_its_server_evaluated(tmp_path):
    """`fedbayes local` (logreg, 2 clients, 2 rounds, 4-sample ensemble), `fedbayes export` of round 2 and
    `fedbayes predict` on the FMNIST test set give round 2's row: at the mean and as the ensemble, bit for bit."""
    workdir = tmp_path / "run"
    result = fedbayes(
        [
            "local",
            "--strategy",
            "bayesadmm",
            "--clients",
            "2",
            "--rounds",
            "2",
            "--fraction",
            "0.02",
            "--workdir",
            str(workdir),
            "--set",
            "model=logreg",
            "--set",
            "ensemble-samples=4",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    row = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()][-1]
    assert row["round"] == 2
    test_npz = tmp_path / "test.npz"
    write_npz(test_npz, load_dataset("fmnist", train=False))
    exported = tmp_path / "posterior.safetensors"
    assert fedbayes(["export", str(workdir), "--round", "2", "--out", str(exported)]).returncode == 0
    for samples, suffix in (("0", ""), ("4", "_ensemble")):
        preds = tmp_path / f"preds-{samples}.npz"
        result = fedbayes(["predict", str(exported), str(test_npz), "--samples", samples, "--out", str(preds)])
        assert result.returncode == 0, result.stderr[-3000:]
        metrics = classification_metrics(
            torch.from_numpy(np.load(preds)["probs"]), load_dataset("fmnist", train=False).labels
        )
        for key in ("accuracy", "nll", "ece"):
            assert metrics[key] == row[f"{key}{suffix}"], (key, suffix, metrics, row)
    assert tomllib.loads((workdir / "run-config.toml").read_text())["federation"] == load(exported).header.federation
