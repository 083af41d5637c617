"""The checks made before anything starts (tasks/preflight.py), and the one that needs the strategy registry.

`fedbayes local` runs `preflight` before it starts a single process, and the ServerApp at its start. The checks that
need no strategy are tasks/preflight.py's; `check_model_and_strategy` builds the model and the strategy's server half,
so it lives here, above fedbayes.strategies, and fedbayes.tasks imports no strategy.
"""

from __future__ import annotations

from fedbayes.tasks.config import ConfigError, RunSettings
from fedbayes.tasks.preflight import (
    check_client_counts,
    check_dataset_files,
    check_device,
    check_memory,
    check_output_paths,
    check_payload_limit,
    check_split_file,
    check_tracking,
    input_shape_and_classes,
    reply_size,
)


def preflight(settings: RunSettings, clients: int | None = None, new_federation: bool = False) -> None:
    """Refuse (ConfigError naming the key) what the ServerApp or the clients would fail on later.
    `clients`: how many clients the caller starts on this machine (`fedbayes local`), where it does: their count,
    their files and their memory are checked too. `new_federation`: the caller knows the run starts a new
    federation (a run config that names none always does), so a results file holding rows is refused.

    Args:
        settings: the run's settings.
        clients: the clients the caller starts on this machine; None when it starts none (the ServerApp).
        new_federation: the run starts a new federation.

    Raises:
        ConfigError: naming the key: too few clients for min-clients or wait-for-clients, an unreadable split file,
            an output path that cannot be written or a results file with rows (results-exists "refuse"), an
            unusable tracking, missing dataset files, "cuda" without a GPU, or what check_model_and_strategy
            refuses.
    """
    if clients is not None:
        check_client_counts(settings, clients)
        check_split_file(settings.split_file)
    check_output_paths(settings, new_federation)
    check_tracking(settings.tracking)
    check_dataset_files(settings, clients)
    check_device(settings.device)
    check_model_and_strategy(settings, clients)


def check_model_and_strategy(settings: RunSettings, clients: int | None = None) -> None:
    """The model the settings describe builds, the strategy accepts it (e.g. bayesadmm-full's size cap), this
    machine's memory holds what the run needs (`clients`: those started here too), and a reply fits
    max-payload-mb. A built-in model is laid out on the meta device, so a model too large for this machine is
    refused by the memory check, not by the allocation of its weights; a user model is built (only its code knows
    its layout).

    Args:
        settings: the run's settings.
        clients: the clients started on this machine, counted in the memory needed; None for none.

    Raises:
        ConfigError: naming the key: `hidden` does not parse, the model does not fit the dataset's examples, the
            strategy refuses the model (e.g. bayesadmm-full's size cap) or is unknown, its client half cannot
            evaluate where client-eval-fraction > 0, the run needs more memory than the machine has, or a reply is
            over max-payload-mb.
    """
    from fedbayes.server.assembly import ModelMismatch, assemble_server
    from fedbayes.strategies import get_algorithm
    from fedbayes.tasks.models import parse_hidden

    try:
        parse_hidden(settings.hidden)
    except ValueError as error:
        raise ConfigError(f"run config 'hidden': {error}") from None
    shape, num_classes = input_shape_and_classes(settings.dataset)
    try:
        # builds no payload (DSVGD draws its particles in round 1); refuses a model the strategy cannot take
        parts = assemble_server(settings, shape, num_classes, planned=True)
    except ModelMismatch as error:  # e.g. a pooling window larger than the image, pool on a CNN
        key, value = ("pool", settings.pool) if settings.pool > 1 else ("model", repr(settings.model))
        examples = f"{shape[1]}x{shape[2]} images" if len(shape) == 3 else f"examples of shape {shape}"
        raise ConfigError(
            f"run config '{key}' ({value}) does not fit the {examples} of {settings.dataset!r}: "
            f"{' '.join(str(error).split())}"
        ) from None
    algorithm = get_algorithm(settings.strategy)
    check_client_evaluation(settings, algorithm.client_half())
    reply = reply_size(settings, algorithm, parts.strategy, parts.buffers)
    check_memory(reply, clients)  # first: the payload limit's remedy, a larger limit, would not help
    check_payload_limit(reply, settings.max_payload_mb)


def check_client_evaluation(settings: RunSettings, client_half: object) -> None:
    """A run that asks its clients for held-out metrics (client-eval-fraction > 0) has a strategy whose client half
    names the global model to evaluate (ClientHalf.global_model); its clients would otherwise answer every round with
    an error.

    Args:
        settings: the run's settings (its client-eval-fraction and strategy).
        client_half: the strategy's client half.

    Raises:
        ConfigError: naming the key and the strategy.
    """
    if settings.client_eval_fraction > 0 and getattr(client_half, "global_model", None) is None:
        raise ConfigError(
            f"run config 'client-eval-fraction' ({settings.client_eval_fraction:g}): the client half of strategy "
            f"{settings.strategy!r} names no global model to evaluate (ClientHalf.global_model); set it to 0"
        )
