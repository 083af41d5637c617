"""An exported posterior as a predictive: `load(FILE).predict(x, samples=S)`.

The predictions are the server's own evaluation, reused: the model from the header's spec (tasks/models.py), inputs
scaled as the run scaled its data (tasks/datasets.py scaled_images), softmax probabilities in batches of the run's
evaluation batch size (bayes/metrics.py predict_probs), weight samples drawn by bayes/gaussian.py and split into
tensors as BayesADMM's `posterior_samples` splits them, members averaged as the server averages its ensemble. So at
the mean (`samples=0`) a prediction is bit for bit the server's plain evaluation of that round, and with the run's
ensemble-samples and the default seed (the server's round seed) its `*_ensemble` evaluation, on the same device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.bayes.metrics import predict_probs
from fedbayes.bayes.params import buffer_layout, flatten, parameter_layout, set_parameters, unflatten
from fedbayes.posterior.file import (
    BUFFER,
    DEFAULT_LIMITS,
    MEAN,
    PARTICLES,
    PRECISION,
    PRECISION_MATRIX,
    Header,
    PosteriorFileError,
    PosteriorLimits,
    read_posterior_file,
)
from fedbayes.posterior.uncertainty import Prediction, predictive
from fedbayes.tasks.compute import resolve_device
from fedbayes.tasks.config import round_seed, unnamed_code
from fedbayes.tasks.datasets import scaled_images
from fedbayes.tasks.models import ModelBuilder, build_model_holding, is_user_model
from fedbayes.tasks.npzdata import pixel_scale_of

Weights = dict[str, np.ndarray]


def load(
    path: str | Path,
    model: str | ModelBuilder | None = None,
    verify: str | Path | None = None,
    limits: PosteriorLimits = DEFAULT_LIMITS,
) -> Posterior:
    """The posterior `fedbayes export` wrote to `path`.

    A file is data: loading it imports and runs nothing it names. Its model is built from the header's spec when that
    is a built-in model, once the spec's layout is the file's (laid out on the meta device first). A user model is
    used only when you name it.

    Args:
        path: the posterior file.
        model: the user model the header names, as a "<module>:<callable>" reference or the callable(input_shape,
            num_classes) itself; its parameter and buffer layout must be the file's. None: the header's built-in model.
        verify: a public key file (PEM or OpenSSH) the file's Ed25519 signature must verify with (`fedbayes export
            --sign`); None: the signature is not checked.
        limits: the largest sizes the header may claim before it is believed (posterior/file.py PosteriorLimits).

    Returns:
        The posterior, its model built and its tensors loaded, ready to `predict`.

    Raises:
        PosteriorFileError: the file is unreadable, damaged or edited (checksum), unsigned or not signed with
            `verify`'s key, of a newer format, over `limits`, its header names a user model `model` does not name, or
            the model does not build here or does not fit the file's tensors.
        ValueError: `verify` is not an Ed25519 public key file, or `model` is a string that is not
            "<module>:<callable>".
    """
    path = Path(path)
    header, tensors = read_posterior_file(path, limits, Path(verify) if verify is not None else None)
    return Posterior(path, header, tensors, model)


class Posterior:
    """The global posterior of one round: `header` says what it is (posterior/file.py), `predict` uses it."""

    def __init__(
        self, path: Path, header: Header, tensors: dict[str, np.ndarray], model: str | ModelBuilder | None = None
    ) -> None:
        self.path, self.header = path, header
        self.model = self._model(model)
        layout = header.parameters
        self.mean: Weights = {name: tensors[f"{MEAN}{name}"] for name in layout}
        self.buffers: Weights = {name: tensors[f"{BUFFER}{name}"] for name in header.buffers}
        self.gaussian: Gaussian | None = None
        self.particles: list[Weights] = []
        if header.kind == "gaussian-diagonal":
            precision = flatten({name: tensors[f"{PRECISION}{name}"] for name in layout}, layout)
            self.gaussian = Gaussian(torch.from_numpy(flatten(self.mean, layout)), torch.from_numpy(precision))
        elif header.kind == "gaussian-full":
            self.gaussian = Gaussian(
                torch.from_numpy(flatten(self.mean, layout)),
                torch.from_numpy(tensors[PRECISION_MATRIX].astype(np.float64)),
            )
        elif header.kind == "particles":
            self.particles = [
                {name: tensors[f"{PARTICLES}{name}"][index] for name in layout} for index in range(header.particles)
            ]

    def _model(self, named: str | ModelBuilder | None) -> torch.nn.Module:
        """The header's built-in model, or the user model `named`; either only once it holds the file's tensors."""
        spec, header = self.header.model, self.header
        if isinstance(named, str) and not is_user_model(named):
            raise ValueError(
                f"model {named!r} is not '<module>:<callable>': a built-in model is the one the file's header names"
            )
        if named is None and (problem := unnamed_code(f"{self.path}'s header", {"model": spec.model}, {}, _how)):
            raise PosteriorFileError(problem)
        try:
            model = build_model_holding(
                named or spec.model,
                header.input_shape,
                header.num_classes,
                spec.hidden,
                spec.activation,
                spec.pool,
                header.parameters | header.buffers,
            )
        except Exception as error:  # a user's model builder may raise anything
            raise PosteriorFileError(
                f"{self.path}: its model spec {spec}{_built_as(named)} does not fit here: "
                f"{type(error).__name__}: {error}"
            ) from None
        built = {"parameters": parameter_layout(model), "buffers": buffer_layout(model)}
        for part, layout in built.items():
            if list(layout.items()) != list(getattr(header, part).items()):  # the order is the flat vectors' order
                raise PosteriorFileError(
                    f"{self.path}: its model spec {spec}{_built_as(named)} builds a model whose {part} differ from "
                    f"the file's ({_first_difference(layout, getattr(header, part))})"
                )
        return model

    def members(self, samples: int, seed: int | None = None) -> list[Weights]:
        """The parameter settings a prediction averages.

        Args:
            samples: weight samples to draw, >= 0; 0: the mean alone. A point estimate is always its mean alone and a
                particle posterior always all of its particles, whatever `samples` (> 0) is.
            seed: the generator seed of the Gaussian's draws; None: the server's seed for this round, round_seed(run
                seed, round), which reproduces its ensemble evaluation.

        Returns:
            One parameter name -> array mapping per member, in the header's layout.

        Raises:
            ValueError: `samples` is negative.
        """
        if samples < 0:
            raise ValueError(f"samples must be >= 0, got {samples}")
        if samples == 0 or self.header.kind == "point":
            return [self.mean]
        if self.header.kind == "particles":
            return self.particles
        seed = round_seed(self.header.seed, self.header.round) if seed is None else seed
        assert self.gaussian is not None  # a Gaussian kind (the header's kind was checked when the file was read)
        draws = self.gaussian.sample(samples, torch.Generator().manual_seed(seed))
        return [unflatten(draw.numpy(), self.header.parameters) for draw in draws]

    def inputs(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        """What the model sees of examples `x`.

        Args:
            x: examples (N, *input_shape), or (N, H, W) for one-channel images; uint8 as 0-255 pixels, or floats.

        Returns:
            The model's inputs (N, *input_shape) float32: uint8 scaled to [0, 1], floats as they are, then times the
                run's
            input-scale.

        Raises:
            ValueError: `x`'s example shape is not the model's, its dtype is neither uint8 nor floating point, or it
                holds
                NaN or Inf.
        """
        x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        shape = self.header.input_shape
        if x.ndim == len(shape) and shape[0] == 1 and x.shape[1:] == shape[1:]:
            x = x[:, None]
        if x.shape[1:] != shape:
            raise ValueError(f"examples have shape {x.shape[1:]}; the model of {self.path} takes {shape}")
        if not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating)):
            raise ValueError(f"examples have dtype {x.dtype}; they must be uint8 (0-255 pixels) or float")
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            raise ValueError("examples hold NaN or Inf")
        return scaled_images(torch.from_numpy(x), pixel_scale_of(x.dtype) * self.header.input_scale)

    def predict(
        self,
        x: np.ndarray | torch.Tensor,
        samples: int | None = None,
        seed: int | None = None,
        batch_size: int | None = None,
        device: str = "cpu",
    ) -> Prediction:
        """The posterior predictive on `x` and its uncertainty per example (posterior/uncertainty.py).

        Args:
            x: examples (N, *input_shape), or (N, H, W) for one-channel images; uint8 0-255 pixels or floats (inputs).
            samples: weight samples to average (members); None: the run's ensemble-samples; 0: the mean alone.
            seed: the samples' generator seed; None: the server's seed for this round.
            batch_size: examples per forward pass; None: the run's evaluation batch size, with which the float rounding
                is the server's.
            device: "cpu", "cuda" or "auto" (CUDA when there is one).

        Returns:
            The mean class probabilities (N, C) with their total, expected and mutual-information entropies (N,), and
                the
            number of members averaged.

        Raises:
            ValueError: `x` is not examples the model takes (inputs), or `samples` is negative.
        """
        images = self.inputs(x)
        members = self.members(self.header.ensemble_samples if samples is None else samples, seed)
        return predictive(
            self.member_probs(members, images, batch_size or self.header.eval_batch_size, resolve_device(device))
        )

    def member_probs(
        self, members: list[Weights], images: torch.Tensor, batch_size: int, device: torch.device
    ) -> torch.Tensor:
        """Each member's softmax probabilities on `images`, computed as server/app.py computes them.

        Args:
            members: parameter settings (members), parameter name -> array; the file's buffers go with each.
            images: model inputs (N, *input_shape), already scaled (inputs).
            batch_size: examples per forward pass, >= 1.
            device: where the model runs; it is moved back to the CPU after each member.

        Returns:
            The probabilities (S, N, C), S = len(members), on the CPU.
        """
        probs = []
        for weights in members:
            set_parameters(self.model, weights | self.buffers)
            probs.append(predict_probs(self.model.to(device), images, batch_size, device))
            self.model.cpu()
        return torch.stack(probs)


def _how(key: str, reference: str) -> str:
    """How a user names the model a posterior's header names."""
    return f"fedbayes predict FILE DATA --{key} {reference}, or fedbayes.posterior.load(FILE, {key}={reference!r})"


def _built_as(named: str | ModelBuilder | None) -> str:
    if named is None:
        return ""
    return f", built as {named if isinstance(named, str) else getattr(named, '__qualname__', repr(named))}"


def _first_difference(built: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]]) -> str:
    for (built_name, built_shape), (saved_name, saved_shape) in zip(built.items(), saved.items()):
        if (built_name, built_shape) != (saved_name, saved_shape):
            return f"built {built_name} {built_shape}, the file has {saved_name} {saved_shape}"
    return f"the model has {len(built)}, the file {len(saved)}"
