"""The exported posterior's file: safetensors, whose metadata is a JSON header, checked in full when read.

Metadata (all strings, as safetensors holds them):
  format          "fedbayes-posterior"
  format_version  FORMAT_VERSION; a reader refuses a newer one
  header          JSON, `Header`: strategy, what the posterior is, the model spec, input shape, classes,
                  preprocessing, round, federation, seed, how the server evaluated the round, fedbayes' version
  checksum        SHA-256 over every tensor and the other metadata (tasks/storage.py `checksum`, as server checkpoints)
Tensors, by posterior kind (parameters are the model's, in the order `Header.parameters` lists them):
  every kind          mean/<parameter>       the global model as the server evaluates it (DSVGD: the particle mean)
                      buffer/<buffer>        the model's buffers (BatchNorm statistics), averaged by the round core
  gaussian-diagonal   precision/<parameter>  per-entry precision (inverse variance) of N(mean, diag(precision)^-1)
  gaussian-full       precision_matrix       (P, P) precision over the parameters flattened in that order
  particles           particles/<parameter>  (N, *shape): particle i is every tensor's entry i
  point               nothing more: the global model is all the strategy holds
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from fedbayes.tasks.storage import checksum, write_atomically

FORMAT = "fedbayes-posterior"
FORMAT_VERSION = 1
KINDS = ("point", "gaussian-diagonal", "gaussian-full", "particles")
MEAN, BUFFER, PRECISION, PARTICLES = "mean/", "buffer/", "precision/", "particles/"
PRECISION_MATRIX = "precision_matrix"
Layout = dict[str, tuple[int, ...]]  # tensor name -> shape, in the model's order


class PosteriorFileError(ValueError):
    """An exported posterior cannot be read or used; the message names the file and the problem."""


@dataclass(frozen=True)
class ModelSpec:
    """What tasks/models.py build_model needs besides the data's shape and classes."""

    model: str
    hidden: tuple[int, ...]
    activation: str
    pool: int


@dataclass(frozen=True)
class Header:
    strategy: str
    kind: str  # one of KINDS
    note: str  # what the strategy's posterior is, in one line (strategies/base.py GlobalPosterior)
    model: ModelSpec
    input_shape: tuple[int, ...]  # of one example
    num_classes: int
    # The model's inputs are x * pixel_scale * input_scale, pixel_scale following x's dtype (uint8: 1/255, float: 1);
    # `pixel_scale` here is that of the data the run evaluated on.
    input_scale: float
    pixel_scale: float
    dataset: str
    round: int
    federation: str
    seed: int
    # How the server evaluated this round: ensemble of `ensemble_samples` draws seeded with round_seed(seed, round),
    # batches of `eval_batch_size` (the batch size changes float rounding, not the model).
    ensemble_samples: int
    eval_batch_size: int
    parameters: Layout
    buffers: Layout
    particles: int  # N for the particles kind, else 0
    fedbayes_version: str

    def to_json(self) -> str:
        fields = asdict(self)
        fields["parameters"] = [[name, list(shape)] for name, shape in self.parameters.items()]
        fields["buffers"] = [[name, list(shape)] for name, shape in self.buffers.items()]
        return json.dumps(fields)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a file with this header holds, and its shape."""
        shapes = {f"{MEAN}{name}": shape for name, shape in self.parameters.items()}
        shapes |= {f"{BUFFER}{name}": shape for name, shape in self.buffers.items()}
        if self.kind == "gaussian-diagonal":
            shapes |= {f"{PRECISION}{name}": shape for name, shape in self.parameters.items()}
        elif self.kind == "gaussian-full":
            size = sum(math.prod(shape) for shape in self.parameters.values())
            shapes[PRECISION_MATRIX] = (size, size)
        elif self.kind == "particles":
            shapes |= {f"{PARTICLES}{name}": (self.particles, *shape) for name, shape in self.parameters.items()}
        return shapes


def write_posterior_file(path: Path, header: Header, tensors: dict[str, np.ndarray]) -> None:
    """Write atomically (a crash leaves no torn file) after checking `tensors` against `header`."""
    _check_tensors(tensors, header, lambda field, problem: ValueError(f"not writing {path}: '{field}' {problem}"))
    tensors = {name: np.require(value, requirements="C") for name, value in tensors.items()}
    metadata = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "header": header.to_json()}
    metadata["checksum"] = checksum(tensors, metadata)
    write_atomically(path, save(tensors, metadata=metadata))


def read_posterior_file(path: Path) -> tuple[Header, dict[str, np.ndarray]]:
    """The header and tensors of an exported posterior, refused with PosteriorFileError when unreadable, of another
    format or a newer version, changed since it was written (checksum), or inconsistent with its header."""

    def damaged(field: str, problem: str) -> PosteriorFileError:
        return PosteriorFileError(f"exported posterior {path} is damaged: '{field}' {problem}")

    try:
        with safe_open(path, framework="np") as posterior_file:
            tensors = {name: posterior_file.get_tensor(name) for name in posterior_file.keys()}
            metadata = posterior_file.metadata() or {}
    except (SafetensorError, OSError, ValueError) as error:
        raise PosteriorFileError(
            f"exported posterior {path} is unreadable (truncated, or not a safetensors file): {error}"
        ) from None
    if metadata.get("format") != FORMAT:
        raise PosteriorFileError(
            f"{path} is not a fedbayes posterior export (its metadata 'format' is "
            f"{metadata.get('format')!r}, not {FORMAT!r}); `fedbayes export` writes them"
        )
    _check_version(path, metadata.get("format_version", ""), damaged)
    if "checksum" not in metadata:
        raise damaged("checksum", "is missing")
    if metadata["checksum"] != checksum(tensors, metadata):
        raise damaged("checksum", "does not match the file's contents (changed or corrupted after it was written)")
    header = _parse_header(metadata.get("header", ""), damaged)
    _check_tensors(tensors, header, damaged)
    return header, tensors


def _check_version(path: Path, text: str, damaged) -> None:
    if not text.isdigit() or int(text) < 1:
        raise damaged("format_version", f"is {text!r}, not a version number")
    if int(text) > FORMAT_VERSION:
        raise PosteriorFileError(
            f"{path} has posterior format version {text}, written by a newer fedbayes; this one "
            f"reads version {FORMAT_VERSION} and older: upgrade fedbayes to read it"
        )


def _parse_header(text: str, damaged) -> Header:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise damaged("header", f"is not valid JSON ({error})") from None
    if not isinstance(fields, dict):
        raise damaged("header", "is not a JSON object")

    def take(name: str, kind: type, container: dict[str, Any] = fields, prefix: str = "") -> Any:
        value = container.get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise damaged(f"header.{prefix}{name}", f"is {value!r}, not a {kind.__name__}")
        return value

    model = take("model", dict)
    spec = ModelSpec(
        take("model", str, model, "model."),
        _shape(take("hidden", list, model, "model."), "model.hidden", damaged),
        take("activation", str, model, "model."),
        take("pool", int, model, "model."),
    )
    header = Header(
        strategy=take("strategy", str),
        kind=take("kind", str),
        note=take("note", str),
        model=spec,
        input_shape=_shape(take("input_shape", list), "input_shape", damaged),
        num_classes=take("num_classes", int),
        input_scale=take("input_scale", float),
        pixel_scale=take("pixel_scale", float),
        dataset=take("dataset", str),
        round=take("round", int),
        federation=take("federation", str),
        seed=take("seed", int),
        ensemble_samples=take("ensemble_samples", int),
        eval_batch_size=take("eval_batch_size", int),
        parameters=_layout(take("parameters", list), "parameters", damaged),
        buffers=_layout(take("buffers", list), "buffers", damaged),
        particles=take("particles", int),
        fedbayes_version=take("fedbayes_version", str),
    )
    if header.kind not in KINDS:
        raise damaged("header.kind", f"is {header.kind!r}, not one of {', '.join(KINDS)}")
    if (header.kind == "particles") != (header.particles > 0):
        raise damaged("header.particles", f"is {header.particles} for a posterior of kind {header.kind!r}")
    if header.eval_batch_size < 1 or header.ensemble_samples < 0 or header.num_classes < 2:
        raise damaged(
            "header", "has an evaluation batch size below 1, negative ensemble samples or fewer than 2 classes"
        )
    return header


def _shape(value: list, field: str, damaged) -> tuple[int, ...]:
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in value):
        raise damaged(f"header.{field}", f"is {value!r}, not a list of sizes")
    return tuple(value)


def _layout(entries: list, field: str, damaged) -> Layout:
    if not all(isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) for entry in entries):
        raise damaged(f"header.{field}", "is not a list of [name, shape] pairs")
    layout = {name: _shape(shape, f"{field}.{name}", damaged) for name, shape in entries}
    if len(layout) != len(entries):
        raise damaged(f"header.{field}", "names a tensor twice")
    return layout


def _check_tensors(tensors: dict[str, np.ndarray], header: Header, damaged) -> None:
    """The tensors are exactly those the header implies, in its shapes, finite, and floating point (buffers may be
    integers: BatchNorm counts its batches)."""
    expected = header.tensor_shapes()
    for name in sorted(expected.keys() | tensors.keys()):
        if name not in tensors:
            raise damaged(name, f"is missing (a {header.kind} posterior holds it)")
        if name not in expected:
            raise damaged(name, f"is not a tensor of a {header.kind} posterior of this model")
        value = tensors[name]
        if value.shape != expected[name]:
            raise damaged(name, f"has shape {value.shape}, the header says {expected[name]}")
        if not (np.issubdtype(value.dtype, np.floating) or name.startswith(BUFFER)):
            raise damaged(name, f"has dtype {value.dtype}, not floating point")
        if np.issubdtype(value.dtype, np.inexact) and not np.isfinite(value).all():
            raise damaged(name, "holds NaN or Inf")
