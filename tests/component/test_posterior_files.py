"""A posterior file is data (posterior/file.py, posterior/predictive.py): loading it imports and calls nothing it
names; a user model is used only when the user names it; every size its header claims is bounded before memory is
spent on it (each refusal measured in a child process: its peak RSS over the interpreter with torch imported);
precisions must be positive (definite); `fedbayes predict` refuses NaN; and a signed file verifies only with its key,
whatever else an editor recomputes.

The files here are written as an attacker writes them: any header, a valid checksum (tests/support/crafted.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP384R1, generate_private_key
from safetensors.numpy import save_file

from fedbayes.bayes.params import buffer_layout, parameter_layout
from fedbayes.deploy.cli import main
from fedbayes.posterior import PosteriorFileError, load
from fedbayes.posterior.file import PosteriorLimits, read_signing_key, write_posterior_file
from fedbayes.tasks.models import MODELS, build_model, build_model_holding, planned_layouts
from fedbayes.tasks.storage import checksum
from tests.support.crafted import edit_json_metadata, in_child, key_pair, rewrite_safetensors, write_user_models

# Peak RSS a refused file may cost over the interpreter with torch imported: the red team's files cost 1-2 GiB
# before their refusal; torch's meta-device kernels take some 160 MiB the first time a convolution is laid out.
SMALL_MIB = 256
LOGREG = {"mean/1.weight": (2, 5), "mean/1.bias": (2,)}  # logreg on (1, 1, 5) inputs, 2 classes
HEADER = {
    "strategy": "fedavg",
    "kind": "point",
    "note": "a test posterior",
    "model": {"model": "logreg", "hidden": [], "activation": "sigmoid", "pool": 1},
    "input_shape": [1, 1, 5],
    "num_classes": 2,
    "input_scale": 1.0,
    "pixel_scale": 1.0,
    "dataset": "npz:/data",
    "round": 1,
    "federation": "fed",
    "seed": 0,
    "ensemble_samples": 4,
    "eval_batch_size": 100,
    "parameters": [["1.weight", [2, 5]], ["1.bias", [2]]],
    "buffers": [],
    "particles": 0,
    "fedbayes_version": "test",
}
CANARY_MODULE = """
import pathlib
pathlib.Path(__file__).with_name("canary").write_text("imported")


def build(input_shape, num_classes):
    pathlib.Path(__file__).with_name("canary").write_text("called")
"""


def crafted(path, tensors=None, shapes=LOGREG, **header):
    """A posterior file with `header`'s fields over HEADER's and a valid checksum; tensors of `shapes` (normal draws)
    unless `tensors` are given."""
    rng = np.random.default_rng(0)
    tensors = tensors or {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    metadata = {"format": "fedbayes-posterior", "format_version": "1", "header": json.dumps(HEADER | header)}
    metadata["checksum"] = checksum(tensors, metadata)
    save_file(tensors, path, metadata=metadata)
    return path


def examples(count: int = 30) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(count, 1, 1, 5)).astype(np.float32)


# ---- what a header names is never imported or called --------------------------------------------------------------
@pytest.mark.parametrize(
    "reference, trace",
    [
        ("builtins:print", "(1, 1, 5) 2"),  # print((1, 1, 5), 2), had it been called
        ("this:s", "The Zen of Python"),  # `import this` prints it
        ("operator:mul", None),  # (1, 1, 5) * 2
        ("evil:build", None),  # a module next to the posterior, importable from its directory
    ],
)
def test_a_header_naming_code_is_refused_without_importing_or_calling_it(tmp_path, reference, trace):
    crafted(tmp_path / "q.safetensors", model={**HEADER["model"], "model": reference})
    (tmp_path / "evil.py").write_text(CANARY_MODULE)
    child = in_child("from fedbayes.posterior import load\nload('q.safetensors')", cwd=tmp_path)
    assert child.error is not None and child.error.startswith("PosteriorFileError: q.safetensors's header names")
    assert f"name it yourself: fedbayes predict FILE DATA --model {reference}" in child.error
    assert f"fedbayes.posterior.load(FILE, model={reference!r})" in child.error
    assert not (tmp_path / "canary").exists()
    if trace:
        assert trace not in child.stdout + child.stderr
    assert child.extra_mib < SMALL_MIB


def test_predict_refuses_a_header_naming_code_and_says_how_to_name_it(tmp_path, capsys):
    crafted(tmp_path / "q.safetensors", model={**HEADER["model"], "model": "evil:build"})
    np.savez(tmp_path / "d.npz", x=examples())
    assert main(["predict", str(tmp_path / "q.safetensors"), str(tmp_path / "d.npz")]) == 1
    assert "--model evil:build" in capsys.readouterr().err


def test_a_user_model_is_used_when_the_user_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    write_user_models(tmp_path)
    import user_models

    builtin = crafted(tmp_path / "builtin.safetensors")
    own = crafted(tmp_path / "own.safetensors", model={**HEADER["model"], "model": "user_models:linear"})
    expected = load(builtin).predict(examples(), samples=0).probs
    with pytest.raises(PosteriorFileError, match="header names model 'user_models:linear'"):
        load(own)
    for named in ("user_models:linear", user_models.linear):
        assert torch.equal(load(own, model=named).predict(examples(), samples=0).probs, expected)
    with pytest.raises(PosteriorFileError, match=r"built as user_models:wider .* the model's 1.weight is \(2, 6\)"):
        load(own, model="user_models:wider")
    with pytest.raises(ValueError, match="'mlp' is not '<module>:<callable>'"):
        load(own, model="mlp")
    np.savez(tmp_path / "d.npz", x=examples())
    assert main(["predict", str(own), str(tmp_path / "d.npz"), "--model", "user_models:linear"]) == 0
    assert "mutual information" in capsys.readouterr().out


# ---- sizes are bounded before memory is spent on them -------------------------------------------------------------
MLP_SHAPES = {  # an mlp of hidden (3, 3) on (1, 1, 5) inputs: Flatten, then Linear layers at 1, 3 and 5
    "mean/1.weight": (3, 5),
    "mean/1.bias": (3,),
    "mean/3.weight": (3, 3),
    "mean/3.bias": (3,),
    "mean/5.weight": (2, 3),
    "mean/5.bias": (2,),
}
MLP_LAYOUT = [[name.removeprefix("mean/"), list(shape)] for name, shape in MLP_SHAPES.items()]
HUGE_MLP = {"model": "mlp", "hidden": [12000, 12000], "activation": "sigmoid", "pool": 1}


@pytest.mark.parametrize(
    "case, header, shapes, load_arguments, refusal",
    [
        (
            "mlp 12000x12000, the file's two tensors",
            {"model": HUGE_MLP},
            LOGREG,
            "",
            "mlp with 2 hidden layers has 6 parameter tensors, more than the 2 there are",
        ),
        (
            "mlp 12000x12000, as many tensors as it has",
            {"model": HUGE_MLP, "parameters": MLP_LAYOUT},
            MLP_SHAPES,
            "",
            r"the model's 1.bias is (12000,), the one held (3,)",
        ),
        (
            "an input of 1x12000x12000",
            {"input_shape": [1, 12000, 12000]},
            LOGREG,
            "",
            "header.input_shape claims 144,000,000, over the limit of 16,777,216 input values",
        ),
        (
            "an input of 1x12000x12000, the limit raised",
            {"input_shape": [1, 12000, 12000]},
            LOGREG,
            ", limits=PosteriorLimits(input_values=10**9)",
            "the model's 1.weight is (2, 144000000), the one held (2, 5)",
        ),
        (
            "a CNN on 3x4000x4000, the limit raised",
            {"input_shape": [3, 4000, 4000], "model": {**HUGE_MLP, "model": "cnn-zenke"}},
            LOGREG,
            ", limits=PosteriorLimits(input_values=10**9)",
            "the model has 0.bias (32,), which is not held",
        ),
        (
            "operator:mul, named, with 2e8 classes",
            {"model": {**HUGE_MLP, "model": "operator:mul"}, "num_classes": 200_000_000},
            LOGREG,
            ", model='operator:mul'",
            "header.num_classes claims 200,000,000, over the limit of 100,000 classes",
        ),
        (
            "an ensemble of 1e9 samples",
            {"ensemble_samples": 10**9},
            LOGREG,
            "",
            "header.ensemble_samples claims 1,000,000,000, over the limit of 1,024 ensemble samples",
        ),
    ],
)
def test_a_small_file_claiming_gigabytes_is_refused_before_they_are_spent(
    tmp_path, case, header, shapes, load_arguments, refusal
):
    path = crafted(tmp_path / "q.safetensors", shapes=shapes, **header)
    assert path.stat().st_size < 4096
    code = "from fedbayes.posterior import load\nfrom fedbayes.posterior.file import PosteriorLimits\n"
    child = in_child(f"{code}load('q.safetensors'{load_arguments})", cwd=tmp_path)
    assert child.error is not None and child.error.startswith("PosteriorFileError: ") and refusal in child.error, case
    assert child.extra_mib < SMALL_MIB, (case, child.extra_mib)


def test_a_safetensors_header_length_over_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "q.safetensors"
    path.write_bytes((2**40).to_bytes(8, "little") + b"{" + b" " * 100)  # claims a 1 TiB header
    child = in_child("from fedbayes.posterior import load\nload('q.safetensors')", cwd=tmp_path)
    assert "safetensors header length declares 1099511627776 bytes, more than the 101 bytes after it" in child.error
    assert child.extra_mib < SMALL_MIB
    crafted(path)
    with pytest.raises(PosteriorFileError, match=r"over the limit of 100: if you trust the file, raise it \(fedbayes"):
        load(path, limits=PosteriorLimits(header_bytes=100))


def test_predict_raises_a_limit_with_its_option(tmp_path, capsys):
    crafted(tmp_path / "q.safetensors", ensemble_samples=2000)
    np.savez(tmp_path / "d.npz", x=examples())
    assert main(["predict", str(tmp_path / "q.safetensors"), str(tmp_path / "d.npz")]) == 1
    assert "raise it (fedbayes predict --max-ensemble-samples" in capsys.readouterr().err
    assert (
        main(["predict", str(tmp_path / "q.safetensors"), str(tmp_path / "d.npz"), "--max-ensemble-samples", "2000"])
        == 0
    )


@pytest.mark.parametrize("name", MODELS)
def test_every_built_in_model_is_laid_out_on_the_meta_device_as_it_is_built(name):
    for shape in ((1, 28, 28), (3, 32, 32)):
        model = build_model(name, shape, 10)
        assert planned_layouts(name, shape, 10) == (parameter_layout(model), buffer_layout(model))
        held = {**parameter_layout(model), **buffer_layout(model)}
        built = build_model_holding(name, shape, 10, (200, 100), "sigmoid", 1, held)
        assert next(built.parameters()).device.type == "cpu"  # built for real once it fits


# ---- precisions and NaN -------------------------------------------------------------------------------------------
def gaussian_header(kind: str) -> dict:
    return {"kind": kind, "strategy": "bayesadmm"}


@pytest.mark.parametrize("value, count", [(0.0, 1), (-2.0, 1)])
def test_precisions_that_are_not_positive_are_refused(tmp_path, value, count):
    precision = np.full((2, 5), 4.0)
    precision[1, 3] = value
    tensors = {
        "mean/1.weight": np.zeros((2, 5), np.float32),
        "mean/1.bias": np.zeros(2, np.float32),
        "precision/1.weight": precision,
        "precision/1.bias": np.ones(2),
    }
    path = crafted(tmp_path / "q.safetensors", tensors, **gaussian_header("gaussian-diagonal"))
    with pytest.raises(PosteriorFileError, match=f"'precision/1.weight' holds {count} precisions that are not > 0"):
        load(path)


@pytest.mark.parametrize(
    "matrix, problem",
    [
        (np.diag(np.r_[np.ones(11), -1.0]), "is not positive definite"),
        (np.eye(12) + np.triu(np.full((12, 12), 0.1), 1), "is not symmetric"),
    ],
)
def test_a_precision_matrix_must_be_symmetric_positive_definite(tmp_path, matrix, problem):
    tensors = {
        "mean/1.weight": np.zeros((2, 5), np.float32),
        "mean/1.bias": np.zeros(2, np.float32),
        "precision_matrix": matrix,
    }
    path = crafted(tmp_path / "q.safetensors", tensors, **gaussian_header("gaussian-full"))
    with pytest.raises(PosteriorFileError, match=f"'precision_matrix' {problem}"):
        load(path)
    with pytest.raises(ValueError, match=f"not writing .*'precision_matrix' {problem}"):
        write_posterior_file(tmp_path / "w.safetensors", load_header(tmp_path, matrix), tensors)
    assert not (tmp_path / "w.safetensors").exists()


def load_header(tmp_path, matrix):
    """The header of a valid full-covariance file like the one refused (the writer checks what it writes)."""
    good = {
        "mean/1.weight": np.zeros((2, 5), np.float32),
        "mean/1.bias": np.zeros(2, np.float32),
        "precision_matrix": np.eye(len(matrix)),
    }
    return load(crafted(tmp_path / "good.safetensors", good, **gaussian_header("gaussian-full"))).header


def test_predict_refuses_nan_predictions_and_writes_nothing(tmp_path, capsys):
    """Positive, finite, but 1e-300 precisions: draws of about 1e150 overflow float32 weights, the logits are NaN."""
    tensors = {
        "mean/1.weight": np.zeros((2, 5), np.float32),
        "mean/1.bias": np.zeros(2, np.float32),
        "precision/1.weight": np.full((2, 5), 1e-300),
        "precision/1.bias": np.full(2, 1e-300),
    }
    path = crafted(tmp_path / "q.safetensors", tensors, **gaussian_header("gaussian-diagonal"))
    np.savez(tmp_path / "d.npz", x=examples(), y=np.zeros(30, np.int64))
    out = tmp_path / "preds.npz"
    assert main(["predict", str(path), str(tmp_path / "d.npz"), "--samples", "3", "--out", str(out)]) == 1
    error = capsys.readouterr().err
    assert "gave NaN or Inf probabilities for 30 of 30 examples (the mean over 3 weight samples" in error
    assert not out.exists()
    assert main(["predict", str(path), str(tmp_path / "d.npz"), "--samples", "0"]) == 0  # the mean is fine
    assert not math.isnan(float(capsys.readouterr().out.split("nll ")[1].split()[0]))


# ---- signatures ---------------------------------------------------------------------------------------------------
def signed_file(tmp_path, signing_key):
    """A valid point posterior, written and signed by the writer."""
    header = load(crafted(tmp_path / "template.safetensors")).header
    tensors = {name: np.full(shape, 0.25, np.float32) for name, shape in LOGREG.items()}
    write_posterior_file(tmp_path / "signed.safetensors", header, tensors, read_signing_key(signing_key))
    return tmp_path / "signed.safetensors"


@pytest.mark.parametrize("encoding", ["pem", "openssh"])
def test_a_signed_file_verifies_with_its_key_and_with_no_other(tmp_path, encoding):
    private, public = key_pair(tmp_path, "signer", encoding)
    _, other = key_pair(tmp_path, "other", encoding)
    path = signed_file(tmp_path, private)
    assert load(path, verify=public).header.strategy == "fedavg"
    assert load(path).header.strategy == "fedavg"  # unverified: the signature is not asked for
    with pytest.raises(PosteriorFileError, match=f"signature does not verify with {other}"):
        load(path, verify=other)
    with pytest.raises(PosteriorFileError, match=f"is not signed, and {public} was to verify it"):
        load(crafted(tmp_path / "unsigned.safetensors"), verify=public)


def test_a_tampered_file_with_its_checksum_recomputed_is_refused_by_the_signature(tmp_path):
    private, public = key_pair(tmp_path, "signer")
    path = signed_file(tmp_path, private)
    rewrite_safetensors(path, change_tensors=lambda t: t["mean/1.bias"].__setitem__(0, 0.5))
    assert load(path).mean["1.bias"][0] == 0.5  # the checksum alone does not see it
    with pytest.raises(PosteriorFileError, match="changed after it was signed"):
        load(path, verify=public)
    path = signed_file(tmp_path, private)
    rewrite_safetensors(path, change_metadata=edit_json_metadata("header", round=9))
    with pytest.raises(PosteriorFileError, match="changed after it was signed"):
        load(path, verify=public)


def test_key_files_that_are_not_the_right_key_are_refused_by_name(tmp_path):
    private, public = key_pair(tmp_path, "signer")
    path = signed_file(tmp_path, private)
    with pytest.raises(ValueError, match="holds a private key: verify with the public key"):
        load(path, verify=private)
    ecdsa = tmp_path / "ecdsa.key"
    ecdsa.write_bytes(
        generate_private_key(SECP384R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    with pytest.raises(ValueError, match=f"signing key {ecdsa} holds a .*, not an Ed25519 private key"):
        read_signing_key(ecdsa)
    with pytest.raises(ValueError, match=f"signing key {public}: not an unencrypted PEM or OpenSSH private key"):
        read_signing_key(public)
