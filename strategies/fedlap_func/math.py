"""FedLap-Func's math, shared by both halves ([P] §3.4, Eq. 15-17, App. C and E): the memory points and their
weights, the soft cross-entropy, the client's function-space terms and the server's fit.

FedLap's weight-space part (the cavity, the site step, q_g from the sites) is strategies/fedlap/math.py. The one
deviation from [P], for privacy: [P]'s client objective has the global function-space term over every client's memory
points, so [P]'s server broadcasts the pooled memory inputs; here each client's terms are on its own points M_k
alone (`function_space_terms`), so no memory input leaves the server (the package docstring).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

Logits = Callable[[torch.Tensor], torch.Tensor]  # flat weights w -> the logits f(x_i; w) of the memory points


def pick_memory(labels: torch.Tensor, per_class: int, generator: torch.Generator) -> torch.Tensor:
    """M_k ([P] App. E.5: "in the first round of communication, each client randomly picks 1 point per class present
    in the client"): `per_class` indices drawn at random among the client's examples of each class it holds (all of
    a class with fewer), class by class, each class's in increasing order. None for `per_class` 0.

    Args:
        labels: the client's labels, (N_k,) integers.
        per_class: how many points to pick per class, >= 0.
        generator: the source of the random draw.

    Returns:
        The memory points' indices into `labels`, (M,) int64; empty where `per_class` is 0.
    """
    chosen = [torch.zeros(0, dtype=torch.long)]
    for label in torch.unique(labels).tolist() if per_class > 0 else []:
        members = torch.nonzero(labels == label).flatten()
        drawn = members[torch.randperm(len(members), generator=generator)[:per_class]]
        chosen.append(drawn.sort().values)
    return torch.cat(chosen)


def represented_examples(labels: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
    """N_{k,c} / M_{k,c} for each memory point of class c ([P] App. E): how many of the client's examples of its class
    it stands for. They sum to N_k where M_k holds a point of every class the client has (`pick_memory`'s).

    Args:
        labels: the client's labels, (N_k,) non-negative integers.
        memory: the memory points' indices into `labels`, (M,).

    Returns:
        N_{k,c} / M_{k,c} per memory point, (M,) float64.
    """
    memory_labels = labels[memory]
    class_sizes = torch.bincount(labels)
    memory_sizes = torch.bincount(memory_labels, minlength=len(class_sizes))
    return class_sizes[memory_labels].double() / memory_sizes[memory_labels].double()


def point_weights(represented: torch.Tensor, function_weight: float) -> torch.Tensor:
    """τ_i = τ_f · N_{k,c} / M_{k,c} ([P] App. E: "we multiply the contribution of each datapoint by how many
    datapoints it is representing from class c in client k"). Σ_i τ_i = τ_f · N_k.

    Args:
        represented: N_{k,c} / M_{k,c} per memory point (`represented_examples`), (M,).
        function_weight: τ_f.

    Returns:
        τ_i, (M,).
    """
    return function_weight * represented


def soft_cross_entropy(targets: torch.Tensor, logits: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_i τ_i ℓ(ŷ_i, w) with ℓ(ŷ, w) = −Σ_c ŷ_c log softmax(f(x; w))_c ([P] Eq. 17's loss against a soft label),
    summed over the memory points, not averaged. `targets` (M, C) are probabilities, `weights` (M,) the τ_i.

    Args:
        targets: the soft labels ŷ_i, (M, C) probabilities.
        logits: f(x_i; w), (M, C).
        weights: τ_i, (M,).

    Returns:
        The weighted sum, a scalar tensor.
    """
    return -(weights.unsqueeze(1) * targets * F.log_softmax(logits, dim=1)).sum()


def function_space_terms(
    logits: torch.Tensor,
    global_predictions: torch.Tensor,
    previous_predictions: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """The client's function-space terms of [P] Eq. 17 (App. C.2, Eq. 25 at H = 0) on its own memory points:
    Σ_{i∈M_k} τ_i [ℓ(ŷ_{i,g}, w) − ℓ(ŷ_i, w)], the global function-space site on M_k in place of the client's
    previous one (ŷ_i: its predictions at its previous w_k; ŷ_{i,g}: the global model's).

    The log-normaliser of the two soft cross-entropies cancels, so this is Σ_i τ_i (ŷ_i − ŷ_{i,g})·f(x_i; w), exactly:
    linear in the logits, a dual term in function space whose gradient vanishes where ŷ_i = ŷ_{i,g} (a stationary
    point). Computed in that form (no two large cross-entropies subtracted). [P]'s objective also has
    Σ_{i∈M_j, j≠k} τ_i ℓ(ŷ_{i,g}, w) over the other clients' points; it is not here (the package docstring).

    Args:
        logits: f(x_i; w) on the client's memory points, (M, C).
        global_predictions: ŷ_{i,g}, the global model's probabilities there, (M, C).
        previous_predictions: ŷ_i, the client's at its previous w_k, (M, C).
        weights: τ_i, (M,).

    Returns:
        The terms' sum, a scalar tensor.
    """
    return ((weights.unsqueeze(1) * (previous_predictions - global_predictions)) * logits).sum()


def server_objective(
    weights: torch.Tensor,
    logits_of: Logits,
    anchor: torch.Tensor,
    predictions: torch.Tensor,
    taus: torch.Tensor,
    prior_precision: float,
) -> torch.Tensor:
    """[P] Eq. 17, server (Eq. 15, FedLap's server as an optimisation, with each client's contribution of Eq. 16 at
    H^{M_k} = 0, Eq. 24): Σ_k Σ_{i∈M_k} τ_i ℓ(ŷ_i, w) + (δ/2)‖w‖² − δ (Σ_k v_k)·w, written (up to a constant) as
    Σ τ_i ℓ(ŷ_i, w) + (δ/2)‖w − w_lap‖² with w_lap FedLap's global, (Σ_k v_k + the unclaimed init)/δ here (v_k is δ
    times [P]'s). `predictions` (M, C) are every client's newest soft labels on its memory points, in the order of
    `logits_of`'s points, `taus` their weights τ_i.

    Args:
        weights: w, flat (P,).
        logits_of: w ↦ the logits f(x_i; w) of every client's memory points, (M, C).
        anchor: w_lap, flat (P,).
        predictions: the clients' newest soft labels, (M, C).
        taus: τ_i, (M,).
        prior_precision: δ.

    Returns:
        The objective, a scalar tensor.
    """
    fit = soft_cross_entropy(predictions, logits_of(weights), taus)
    return fit + 0.5 * prior_precision * (weights - anchor).square().sum()


def fit_global(
    model: torch.nn.Module,
    anchor: torch.Tensor,
    inputs: torch.Tensor,
    predictions: torch.Tensor,
    taus: torch.Tensor,
    prior_precision: float,
    steps: int,
    lr: float,
) -> tuple[torch.Tensor, float]:
    """w_g ← argmin of `server_objective` by `steps` full-batch Adam steps at `lr` from w_lap = `anchor` ([P] App. E:
    "run global server optimisation for 5000 iterations with a learning rate of 0.001"; [P] gives no starting point,
    w_lap is the spec's: FedLap's answer, which the fit corrects). The variables are `model`'s own parameters (set to
    w_lap, left at w_g; the model in eval mode, on the device of `inputs`, `predictions` and `taus`), and the
    quadratic's gradient δ (w − w_lap) is added in closed form: the same steps as Adam on `server_objective`, without
    a flat copy of the weights per step. Returns w_g (float64, CPU) and the objective there (nan where no step ran).
    No memory point, or no step: w_lap itself, unchanged.

    Args:
        model: the network whose parameters are fitted (changed in place).
        anchor: w_lap, flat (P,).
        inputs: every client's memory inputs x_i, batched along the first dimension (M, ...).
        predictions: the clients' newest soft labels, (M, C).
        taus: τ_i, (M,).
        prior_precision: δ.
        steps: the number of Adam steps, >= 0.
        lr: Adam's learning rate.

    Returns:
        w_g, flat (P,) float64 on the CPU (`anchor` itself where no step ran), and the objective's value there
        (nan where no step ran).
    """
    if len(predictions) == 0 or steps == 0:
        return anchor, math.nan
    parameters = list(model.parameters())
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(anchor.to(parameters[0]), parameters)
    anchors = [parameter.detach().clone() for parameter in parameters]
    optimizer = torch.optim.Adam(parameters, lr=lr, foreach=True)
    for _ in range(steps):
        fit = soft_cross_entropy(predictions, model(inputs), taus)
        gradients = torch.autograd.grad(fit, parameters, allow_unused=True)  # None: a parameter the fit does not use
        with torch.no_grad():
            for parameter, start, gradient in zip(parameters, anchors, gradients):
                prior = prior_precision * (parameter - start)
                parameter.grad = prior if gradient is None else gradient.add_(prior)
        optimizer.step()
    with torch.no_grad():
        fit = soft_cross_entropy(predictions, model(inputs), taus)
        shift = sum((parameter - start).square().sum() for parameter, start in zip(parameters, anchors))
        value = (fit + 0.5 * prior_precision * shift).item()
    return torch.nn.utils.parameters_to_vector(parameters).detach().cpu().double(), value


def parameters_of(flat: torch.Tensor, layout: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The flat weights as the model's named parameters (views, so gradients flow back to `flat`).

    Args:
        flat: the weights, flat (P,) in `layout` order.
        layout: the model's parameter names and shapes, in order.

    Returns:
        The named parameters, views of `flat` shaped as `layout`.
    """
    named, offset = {}, 0
    for name, shape in layout.items():
        size = math.prod(shape)
        named[name] = flat[offset : offset + size].view(shape)
        offset += size
    return named


def model_logits(model: torch.nn.Module, layout: Mapping[str, tuple[int, ...]], inputs: torch.Tensor) -> Logits:
    """w ↦ f(inputs; w) for the flat weights w of `model` (in its current mode; the model itself is not changed).

    Args:
        model: the network; only its structure and mode are used.
        layout: its parameter names and shapes, in order.
        inputs: the memory inputs x_i, (M, ...).

    Returns:
        A function of the flat weights w (P,) to the logits f(inputs; w), (M, C).
    """
    return lambda flat: torch.func.functional_call(model, parameters_of(flat, layout), (inputs,))


def soft_predictions(logits_of: Logits, weights: torch.Tensor) -> torch.Tensor:
    """softmax f(x_i; w) on the memory points (`weights` in the model's dtype), no gradient, float32: the ŷ a client
    sends ([P] Eq. 17).

    Args:
        logits_of: w ↦ the logits on the memory points (`model_logits`).
        weights: w, flat (P,) in the model's dtype.

    Returns:
        ŷ, (M, C) float32.
    """
    with torch.no_grad():
        return torch.softmax(logits_of(weights), dim=1).to(torch.float32)


def probability_rows_error(predictions: torch.Tensor, tolerance: float) -> str:
    """Why `predictions` (M, C) are no soft labels ('' if they are): every entry >= 0, every row sums to 1 within
    `tolerance`.

    Args:
        predictions: the soft labels received, (M, C).
        tolerance: how far a row's sum may lie from 1.

    Returns:
        The first problem found, or "" where there is none.
    """
    if (predictions < 0).any():
        row = int(torch.nonzero(predictions < 0)[0, 0])
        return f"row {row} has negative values; a prediction is a probability vector"
    sums = predictions.double().sum(1)
    off = torch.nonzero((sums - 1.0).abs() > tolerance).flatten()
    if len(off):
        return f"row {int(off[0])} sums to {sums[off[0]].item():.6g}, not 1 (within {tolerance:g})"
    return ""
