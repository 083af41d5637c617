"""FedLap-Func's client half: FedLap's cavity-regularised local solve plus, once the client has a site, the
function-space terms on its own memory points ([P] Eq. 17); FedLap's site step; its soft predictions on them."""

from __future__ import annotations

import torch

from fedbayes.bayes.params import TensorLayout, TensorList, flatten, unflatten
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_group
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.state import ClientState
from fedbayes.client.training import GradientTerm, train_anchored
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies.fedlap.client import stored_site
from fedbayes.strategies.fedlap.math import cavity, client_damping, site_step
from fedbayes.strategies.fedlap_func.math import (
    function_space_terms,
    model_logits,
    pick_memory,
    point_weights,
    represented_examples,
    soft_predictions,
)
from fedbayes.strategies.membership import client_population

MEMORY_SEED_ROUND = 0  # the memory is drawn from the client's seed of "round 0": before, and unlike, any training round


def instruction_layouts(instruction: pb.FedLapFuncInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    """The layouts of an instruction's tensor groups.

    Args:
        instruction: the round's instruction (its layouts do not depend on it).
        layout: the model's parameters.

    Returns:
        {"global_mean": layout}.
    """
    return {"global_mean": layout}


def local_update(local: LocalRound) -> LocalResult:
    """Train on the cavity-regularised loss (+ the function-space terms, once it has a site) from w_g, take the site
    step, predict on the memory points, reply (with the memory inputs where it starts afresh).

    Args:
        local: the round's instruction (δ, K, N, initial share, damping, memory settings, local training), w_g's
            tensors, this client's runtime, and its stored site, memory indices and predictions (None: new, or lost).

    Returns:
        The reply (memory points, whether inputs are sent, the examples each stands for) with the site's natural
        mean, the memory inputs (fresh clients) and predictions; the last epoch's mean loss, the compute seconds, and
        the site, memory indices and predictions to store.

    Raises:
        ValueError: the stored site or memory does not fit this run's model or this client's data.
    """
    instruction, runtime = local.instruction, local.runtime
    delta, fresh = instruction.prior_precision, local.stored is None
    global_mean = torch.from_numpy(flatten(local.tensors["global_mean"], runtime.layout))
    global_precision = torch.full_like(global_mean, delta)
    site = stored_site(local.stored, global_mean, global_precision, instruction.initial_share)
    memory = chosen_memory(local, instruction.memory_points_per_class, instruction.training.seed)
    inputs = runtime.data.images[memory].to(torch.float32)
    represented = represented_examples(runtime.data.labels, memory)
    known_clients, known_examples = client_population(
        instruction.known_clients, instruction.known_examples, local.num_examples, fresh=fresh
    )
    anchor, precision = cavity(global_mean, global_precision, site, delta)
    terms = None
    if local.stored is not None and len(memory):  # round 1 (or afresh): no function-space site yet, plain FedLap
        terms = function_space_loss(
            runtime,
            inputs,
            global_predictions=soft_predictions(_memory_logits(runtime, inputs), global_mean.float()),
            previous_predictions=local.stored.tensors["memory_predictions"],
            taus=point_weights(represented, instruction.function_weight),
        )
    weights, train_loss, seconds = train_anchored(
        runtime,
        instruction.training,
        start=global_mean,
        anchor=anchor,
        weight=precision / local.num_examples,
        server_round=local.server_round,
        max_grad_norm=instruction.max_grad_norm,
        extra_term=terms,
    )
    rho = client_damping(False, local.num_examples, known_clients, known_examples, instruction.site_damping)
    site = site_step(site, weights, torch.zeros_like(weights), global_mean, global_precision, rho, local.server_round)
    predictions = soft_predictions(_memory_logits(runtime, inputs), weights.float())
    sends_inputs = fresh and len(memory) > 0
    reply = pb.FedLapFuncReply(
        memory_points=len(memory),
        sends_inputs=sends_inputs,
        represented_examples=represented.tolist() if sends_inputs else [],
    )
    tensors = {
        "site_mean": unflatten(site.mean.numpy(), runtime.layout),
        "memory_inputs": {"inputs": inputs.numpy()} if sends_inputs else {},
        "memory_predictions": {"predictions": predictions.numpy()} if len(memory) else {},
    }
    state = {
        "site_mean": site.mean,
        "site_precision": site.precision,
        "memory_indices": memory,
        "memory_predictions": predictions,
    }
    return LocalResult(reply, tensors, train_loss, seconds, state)


client_update = ClientHalf(
    pb.FedLapFuncInstruction, local_update, instruction_layouts, stateful=True, global_model=model_group("global_mean")
)


def chosen_memory(local: LocalRound, per_class: int, seed: int) -> torch.Tensor:
    """M_k as indices into the client's examples: the stored ones, or, for a client without state, `per_class` per
    class it holds drawn from its own seed of the run's `seed` (so a client that lost its state draws the same points
    again).

    Args:
        local: the round, with this client's data and stored state.
        per_class: memory points per class, >= 0; a class with fewer examples gives all of them.
        seed: the run's training seed.

    Returns:
        The int64 indices (M_k,).

    Raises:
        ValueError: the stored indices or predictions do not fit this client's data (checked_memory).
    """
    labels = local.runtime.data.labels
    if local.stored is None:
        generator = torch.Generator().manual_seed(local.runtime.local_seed(seed, MEMORY_SEED_ROUND))
        return pick_memory(labels, per_class, generator)
    return checked_memory(local.stored, len(labels), local.runtime.data.num_classes)


def checked_memory(stored: ClientState, num_examples: int, num_classes: int) -> torch.Tensor:
    """The stored memory indices, refused where they do not fit this client's data (a store of another run).

    Args:
        stored: the client's durable state, holding "memory_indices" and "memory_predictions".
        num_examples: the client's examples; every index must be below it.
        num_classes: the classes; the predictions must be (M_k, num_classes).

    Returns:
        The int64 indices (M_k,).

    Raises:
        ValueError: the indices are not a 1-d int64 tensor in [0, num_examples), or the predictions' shape is not
            (M_k, num_classes).
    """
    memory, predictions = stored.tensors["memory_indices"], stored.tensors["memory_predictions"]
    if memory.dtype != torch.int64 or memory.dim() != 1 or ((memory < 0) | (memory >= num_examples)).any():
        raise ValueError(f"stored memory indices do not index this client's {num_examples} examples")
    if predictions.shape != (len(memory), num_classes):
        raise ValueError(
            f"stored memory predictions have shape {tuple(predictions.shape)}, not ({len(memory)}, {num_classes})"
        )
    return memory


def function_space_loss(
    runtime: ClientRuntime,
    inputs: torch.Tensor,
    global_predictions: torch.Tensor,
    previous_predictions: torch.Tensor,
    taus: torch.Tensor,
) -> GradientTerm:
    """[P] Eq. 17's function-space terms on the memory points in mean-loss units (/N_k, as the data loss), on the
    model's device, as a GradientTerm: its own forward and backward pass over the memory points (in eval mode:
    dropout off, as their predictions are made) add its gradient to the loss's.

    Args:
        runtime: this client's runtime: its model, device and data (N_k).
        inputs: the memory points' inputs (M_k, *input shape), float32.
        global_predictions: the soft predictions of w_g on them, (M_k, C).
        previous_predictions: this client's predictions on them at its last accepted round, (M_k, C).
        taus: each point's weight τ (point_weights), (M_k,).

    Returns:
        The term: called at the model's parameters, it adds its gradient to theirs and returns its value (detached).
    """
    device = runtime.device
    inputs, scale = inputs.to(device), 1.0 / len(runtime.data.labels)
    global_, previous = global_predictions.to(device), previous_predictions.to(device, torch.float32)
    weights = taus.to(device, torch.float32)

    model = runtime.model  # whose parameters the term is called at

    def term(parameters: TensorList) -> torch.Tensor:
        model.eval()
        value = scale * function_space_terms(model(inputs), global_, previous, weights)
        model.train()
        value.backward()
        return value.detach()

    return term


def _memory_logits(runtime: ClientRuntime, inputs: torch.Tensor):
    """w ↦ the model's logits on the memory points (on the CPU, eval mode)."""
    return model_logits(runtime.model.cpu().eval(), runtime.layout, inputs)
