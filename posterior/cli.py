"""`fedbayes export` and `fedbayes predict` (deploy/cli.py adds them). Heavy imports wait for the command to run."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from fedbayes.posterior.file import DEFAULT_LIMITS, PosteriorLimits
from fedbayes.tasks.config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, checked_number, run_config_number

if TYPE_CHECKING:
    import numpy as np

    from fedbayes.posterior.file import Header
    from fedbayes.posterior.uncertainty import Prediction

TOP_DEFAULT = 10


class PredictionError(ValueError):
    """`fedbayes predict` made numbers that mean nothing (NaN); the message says which."""


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `fedbayes export`'s arguments to `parser`, and run_export as its handler.

    Args:
        parser: the `export` subcommand's parser; its `handler` default is set to run_export.
    """
    parser.add_argument(
        "run",
        type=Path,
        metavar="RUN",
        help="a `fedbayes local` workdir, or a server state directory (with --federation)",
    )
    parser.add_argument("--federation", help="RUN is a server state directory: the federation in it")
    parser.add_argument(
        "--round",
        type=checked_number(int, AT_LEAST_ONE),
        default=0,
        help="a kept round (keep-checkpoints); default: the newest",
    )
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="the .safetensors file to write")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists (refused otherwise)")
    parser.add_argument("--data-root", help="where the run's dataset is (default: the run config's)")
    parser.add_argument(
        "--eval-batch-size",
        type=run_config_number("eval-batch-size"),
        help="the run's evaluation batch size, for bit-equal predictions (default: the run config's)",
    )
    add_named_code_arguments(parser)
    parser.add_argument(
        "--sign",
        type=Path,
        metavar="KEYFILE",
        help="sign the file with this Ed25519 private key (PEM or OpenSSH); `predict --verify` checks it",
    )
    parser.set_defaults(handler=run_export)


def add_named_code_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --strategy and --model: the code a run's files may name (a file is data: fedbayes imports only code you
    name). `named_code` reads them.

    Args:
        parser: the subcommand's parser.
    """
    parser.add_argument(
        "--strategy",
        metavar="MODULE:ATTRIBUTE",
        help="the run's own strategy, when its run config names one ('<module>:<attribute>'): importing it runs it, "
        "so it is imported only when you name it",
    )
    parser.add_argument(
        "--model",
        metavar="MODULE:CALLABLE",
        help="the run's own model, when its run config names one ('<module>:<callable>'), likewise",
    )


def named_code(args: argparse.Namespace) -> dict[str, str]:
    """The code references --strategy and --model named.

    Args:
        args: parsed arguments of a parser add_named_code_arguments added to.

    Returns:
        "strategy" and/or "model" -> the "<module>:<attribute>" reference given; a key only where its option was given.
    """
    return {key: getattr(args, key) for key in ("strategy", "model") if getattr(args, key) is not None}


def run_export(args: argparse.Namespace) -> int:
    """`fedbayes export`: write the posterior of a run's kept round to --out and say what it is.

    Args:
        args: the arguments add_export_arguments parsed.

    Returns:
        The exit status, 0.

    Raises:
        OutputExists: --out exists (without --force), or cannot be written; before any other work.
        ExportError: the run or round cannot be exported (posterior/export.py export_posterior).
        CheckpointError: the checkpoint is unreadable or damaged.
        ValueError: --sign is not an Ed25519 private key file.
    """
    from fedbayes.posterior.export import export_posterior, locate_run
    from fedbayes.tasks.storage import check_new_files

    check_new_files([args.out], args.force)
    location = locate_run(args.run, args.federation, named_code(args))
    header = export_posterior(location, args.out, args.round, args.data_root, args.eval_batch_size, args.sign)
    print(
        f"wrote {args.out}: {header.strategy}, round {header.round} of federation {header.federation}; "
        f"{header.kind}: {header.note}" + (f"; signed with {args.sign}" if args.sign else "")
    )
    if args.eval_batch_size is None and not location.run_config:  # a workdir's run config is the run's
        print(
            f"note: a server state directory does not record the evaluation batch size; the header says "
            f"{header.eval_batch_size} (the default): pass --eval-batch-size if the run set another"
        )
    return 0


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `fedbayes predict`'s arguments to `parser`, and run_predict as its handler.

    Args:
        parser: the `predict` subcommand's parser; its `handler` default is set to run_predict.
    """
    parser.add_argument("file", type=Path, metavar="FILE", help="a posterior `fedbayes export` wrote")
    parser.add_argument(
        "data",
        type=Path,
        metavar="DATA.npz",
        help="`x` (uint8 0-255 pixels or float) and, "
        "optionally, `y` (labels), as `fedbayes export-partitions` writes them",
    )
    parser.add_argument(
        "--samples",
        type=checked_number(int, NON_NEGATIVE),
        help="weight samples (particles: all of them; a point estimate: its one model); 0: at the "
        "posterior mean; default: the run's ensemble-samples",
    )
    parser.add_argument(
        "--seed",
        type=checked_number(int, NON_NEGATIVE),
        help="the samples' generator seed; default: the server's for that round, which reproduces "
        "its ensemble evaluation",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="write probs, entropy, expected_entropy, mutual_information and preds to this .npz",
    )
    parser.add_argument("--force", action="store_true", help="replace --out if it exists (refused otherwise)")
    parser.add_argument(
        "--top",
        type=checked_number(int, NON_NEGATIVE),
        default=TOP_DEFAULT,
        help=f"list this many most uncertain examples (default {TOP_DEFAULT})",
    )
    parser.add_argument(
        "--batch-size",
        type=checked_number(int, AT_LEAST_ONE),
        help="default: the run's evaluation batch size (rounding then matches the server's)",
    )
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument(
        "--model",
        metavar="MODULE:CALLABLE",
        help="your own model, callable(input_shape, num_classes) -> nn.Module, for a file whose header names one: "
        "a file is data, so the code it names is never imported; its layout must be the file's",
    )
    parser.add_argument(
        "--verify",
        type=Path,
        metavar="KEYFILE",
        help="refuse the file unless it is signed (`export --sign`) with the private key of this Ed25519 public key",
    )
    defaults = DEFAULT_LIMITS
    parser.add_argument(
        "--max-header-mb",
        type=checked_number(float, POSITIVE),
        default=defaults.header_bytes / 2**20,
        help="the largest safetensors header to read (default %(default)g)",
    )
    for name, claim in (
        ("input-values", "values in one example"),
        ("classes", "classes"),
        ("ensemble-samples", "ensemble samples (the weight samples drawn when --samples is not given)"),
    ):
        parser.add_argument(
            f"--max-{name}",
            type=checked_number(int, AT_LEAST_ONE),
            default=getattr(defaults, name.replace("-", "_")),
            help=f"refuse a file whose header claims more {claim} (default %(default)s)",
        )
    parser.set_defaults(handler=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    """`fedbayes predict`: the posterior predictive of an exported posterior on an .npz of examples; print its summary
    and, with --out, write the predictions.

    Args:
        args: the arguments add_predict_arguments parsed.

    Returns:
        The exit status, 0.

    Raises:
        OutputExists: --out exists (without --force), or cannot be written; before any other work.
        PosteriorFileError: the posterior file cannot be read or used (posterior/predictive.py load).
        PredictionError: the prediction made NaN or Inf numbers; nothing is written.
        ValueError: the examples cannot be read or do not fit the model, a label is out of the model's range, or
            --verify is not an Ed25519 public key file.
    """
    from fedbayes.posterior import load
    from fedbayes.tasks.compute import configure_threads
    from fedbayes.tasks.npzdata import read_examples
    from fedbayes.tasks.storage import check_new_files

    if args.out:
        check_new_files([args.out], args.force)
    configure_threads()
    limits = PosteriorLimits(
        header_bytes=int(args.max_header_mb * 2**20),
        input_values=args.max_input_values,
        classes=args.max_classes,
        ensemble_samples=args.max_ensemble_samples,
    )
    posterior = load(args.file, args.model, args.verify, limits)
    x, labels = read_examples(args.data)
    if labels is not None and labels.max() >= posterior.header.num_classes:
        raise ValueError(
            f"{args.data}: label {labels.max()} is out of range for the model's {posterior.header.num_classes} classes"
        )
    samples = posterior.header.ensemble_samples if args.samples is None else args.samples
    prediction = posterior.predict(x, samples, args.seed, args.batch_size, args.device)
    if args.verify:
        print(f"{args.file}: signature verified with {args.verify}")
    print(summary(args, posterior.header, x, labels, samples, prediction))
    if args.out:
        write_predictions(args.out, prediction)
        print(f"wrote {args.out}: probs, entropy, expected_entropy, mutual_information, preds")
    return 0


def summary(
    args: argparse.Namespace,
    header: Header,
    x: np.ndarray,
    labels: np.ndarray | None,
    samples: int,
    prediction: Prediction,
) -> str:
    """What the posterior is, how the prediction was made, its metrics (with labels) and the most uncertain examples.

    Args:
        args: `fedbayes predict`'s arguments: the file, data, seed and --top are named in the summary.
        header: the posterior file's header.
        x: the examples predicted, (N, ...); their dtype says how they were scaled.
        labels: the examples' labels (N,), or None: no accuracy, NLL or ECE.
        samples: the weight samples asked for (0: the posterior mean).
        prediction: the prediction on `x`.

    Returns:
        The lines to print, joined by newlines: also a note when `x`'s pixel scale is not the run's.

    Raises:
        PredictionError: the probabilities hold NaN or Inf, or a metric is NaN.
    """
    import torch

    from fedbayes.bayes.metrics import classification_metrics
    from fedbayes.tasks.npzdata import pixel_scale_of

    lines = [
        f"{args.file}: {header.strategy}, round {header.round} of federation {header.federation}; "
        f"{header.kind}: {header.note}",
        f"predictive: {_members_line(header, samples, args.seed, prediction.members)}",
    ]
    if pixel_scale_of(x.dtype) != header.pixel_scale:
        lines.append(
            f"note: {args.data} holds {x.dtype} examples, scaled by {pixel_scale_of(x.dtype):g}; the run's "
            f"data were scaled by {header.pixel_scale:g} (then both by input-scale {header.input_scale:g}): "
            "make sure the values are in the same range"
        )
    if not torch.isfinite(prediction.probs).all():
        bad = int((~torch.isfinite(prediction.probs)).any(dim=1).sum())
        raise PredictionError(
            f"predicting {args.data} with {args.file} gave NaN or Inf probabilities for {bad} of {len(x)} examples "
            f"({_members_line(header, samples, args.seed, prediction.members)}): its weights make non-finite "
            "logits; nothing was written"
        )
    numbers = {
        "mean entropy": float(prediction.entropy.mean()),
        "expected entropy": float(prediction.expected_entropy.mean()),
        "mutual information": float(prediction.mutual_information.mean()),
    }
    if labels is not None:
        metrics = classification_metrics(prediction.probs, torch.from_numpy(labels))
        numbers |= {name: float(metrics[name]) for name in ("accuracy", "nll", "ece")}
    if nan := [name for name, value in numbers.items() if math.isnan(value)]:
        raise PredictionError(f"predicting {args.data} with {args.file} gave NaN {', '.join(nan)}; nothing was written")
    if labels is not None:
        lines.append(
            f"{len(x)} examples: accuracy {numbers['accuracy']:.4f}  nll {numbers['nll']:.4f}  ece {numbers['ece']:.4f}"
        )
    lines.append(
        f"mean entropy {numbers['mean entropy']:.4f}, expected entropy {numbers['expected entropy']:.4f}, "
        f"mutual information {numbers['mutual information']:.4f} (nats)"
    )
    return "\n".join([*lines, most_uncertain(prediction, labels, args.top)])


def write_predictions(path: Path, prediction: Prediction) -> None:
    """Write the predictions as an .npz, replacing a file there atomically.

    Args:
        path: the file, as named (no suffix added).
        prediction: the prediction; written as probs (N, C), entropy, expected_entropy, mutual_information (N,) in nats
            and preds (N,): the predicted classes.
    """
    import io

    import numpy as np

    from fedbayes.tasks.storage import OUTPUT_MODE, write_atomically

    buffer = io.BytesIO()
    np.savez(
        buffer,
        probs=prediction.probs.numpy(),
        entropy=prediction.entropy.numpy(),
        expected_entropy=prediction.expected_entropy.numpy(),
        mutual_information=prediction.mutual_information.numpy(),
        preds=prediction.predicted.numpy(),
    )
    write_atomically(path, buffer.getvalue(), OUTPUT_MODE)


def _members_line(header: Header, samples: int, seed: int | None, members: int) -> str:
    if samples == 0:
        return "at the posterior mean (the server's plain evaluation)"
    if header.kind == "point":
        return "the one model of a point estimate (no epistemic uncertainty: mutual information 0)"
    if header.kind == "particles":
        return f"the mean over all {members} particles"
    drawn = f"seed {seed}" if seed is not None else "the server's seed for this round"
    return f"the mean over {members} weight samples drawn with {drawn}"


def most_uncertain(prediction: Prediction, labels: np.ndarray | None, top: int) -> str:
    """A table of the examples with the largest mutual information (ties: largest entropy).

    Args:
        prediction: the prediction on N examples.
        labels: the examples' labels (N,), or None: the label column shows "-".
        top: the rows to list, >= 0 (at most N).

    Returns:
        A title line, a column header, then one row per example: index, mutual information, entropy, predicted class,
        label.
    """
    import numpy as np

    order = np.lexsort((-prediction.entropy.numpy(), -prediction.mutual_information.numpy()))[:top]
    lines = [
        f"most uncertain {len(order)} (by mutual information, then entropy):",
        f"{'index':>7} {'MI':>8} {'entropy':>8} {'predicted':>9} {'label':>5}",
    ]
    predicted = prediction.predicted.numpy()
    for index in order:
        label = "-" if labels is None else str(labels[index])
        lines.append(
            f"{index:>7} {prediction.mutual_information[index]:>8.4f} {prediction.entropy[index]:>8.4f} "
            f"{predicted[index]:>9} {label:>5}"
        )
    return "\n".join(lines)
