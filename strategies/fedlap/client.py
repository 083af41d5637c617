"""FedLap's and FedLap-Cov's client half: the cavity-regularised local solve, the curvature (Cov), the site step."""

from __future__ import annotations

import time

import torch

from fedbayes.bayes.curvature import diag_ggn
from fedbayes.bayes.params import TensorLayout, flatten, unflatten
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_group
from fedbayes.client.state import ClientState
from fedbayes.client.training import train_anchored
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies.fedlap.math import Site, cavity, client_damping, curvature_damping, site_step
from fedbayes.strategies.membership import client_population


def instruction_layouts(instruction: pb.FedLapInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    """The layouts of an instruction's tensor groups.

    Args:
        instruction: the round's instruction; `covariance` says whether S_g travels.
        layout: the model's parameters.

    Returns:
        "global_mean": `layout`; "global_precision": `layout` for FedLap-Cov, empty for FedLap.
    """
    return {"global_mean": layout, "global_precision": layout if instruction.covariance else {}}


def local_update(local: LocalRound) -> LocalResult:
    """Train on the cavity-regularised loss from w_g, compute H_k (Cov), take the site step, reply.

    Args:
        local: the round's instruction (δ, K, N, initial share, damping, local training), q_g's tensors, this
            client's runtime, and its stored site (None: new, or lost: a fresh site).

    Returns:
        The reply (the curvature's seconds) with the new site's natural mean and (Cov) precision, the last epoch's
        mean loss, the compute seconds (curvature included), and the site to store.

    Raises:
        ValueError: the stored site has another size than this run's model.
    """
    instruction, runtime = local.instruction, local.runtime
    covariance, delta = instruction.covariance, instruction.prior_precision
    global_mean = torch.from_numpy(flatten(local.tensors["global_mean"], runtime.layout))
    global_precision = (
        torch.from_numpy(flatten(local.tensors["global_precision"], runtime.layout))
        if covariance
        else torch.full_like(global_mean, delta)
    )
    site = stored_site(local.stored, global_mean, global_precision, instruction.initial_share)
    known_clients, known_examples = client_population(
        instruction.known_clients, instruction.known_examples, local.num_examples, fresh=local.stored is None
    )
    anchor, precision = cavity(global_mean, global_precision, site, delta)
    weights, train_loss, seconds = train_anchored(
        runtime,
        instruction.training,
        start=global_mean,
        anchor=anchor,
        weight=precision / local.num_examples,
        server_round=local.server_round,
        max_grad_norm=instruction.max_grad_norm,
    )
    curvature, curvature_seconds = torch.zeros_like(weights), 0.0
    if covariance:  # H_k at the new w_k, which train_anchored left in the model
        started = time.perf_counter()
        curvature = diag_ggn(runtime.model.to(runtime.device), runtime.data.images.to(runtime.device))
        runtime.model.cpu()
        curvature_seconds = time.perf_counter() - started
    rho = client_damping(covariance, local.num_examples, known_clients, known_examples, instruction.site_damping)
    # FedLap has no curvature: its ρ_k is the paper's under either rule
    step = curvature_damping(rho, curvature, precision) if covariance and instruction.curvature_damping else rho
    site = site_step(site, weights, curvature, global_mean, global_precision, step, local.server_round)
    precision_wire = unflatten(site.precision.numpy(), runtime.layout) if covariance else {}
    return LocalResult(
        pb.FedLapReply(curvature_seconds=curvature_seconds),
        {"site_mean": unflatten(site.mean.numpy(), runtime.layout), "site_precision": precision_wire},
        train_loss,
        seconds + curvature_seconds,
        {"site_mean": site.mean, "site_precision": site.precision},
    )


client_update = ClientHalf(
    pb.FedLapInstruction, local_update, instruction_layouts, stateful=True, global_model=model_group("global_mean")
)


def stored_site(
    stored: ClientState | None, global_mean: torch.Tensor, global_precision: torch.Tensor, initial_share: float
) -> Site:
    """This client's site from its store; a fresh one holds `initial_share` of the global natural mean.

    Args:
        stored: the client's durable state after its last accepted round, or None.
        global_mean: w_g, flat float64.
        global_precision: S_g, flat float64 (δ everywhere for FedLap).
        initial_share: the share of q_g's natural mean a fresh client takes (1/K₁ in round 1, else 0).

    Returns:
        The site: natural mean, precision (float64) and the round it was last updated in (0: fresh).

    Raises:
        ValueError: the stored site has another size than `global_mean`.
    """
    if stored is None:
        return Site(initial_share * global_precision * global_mean, torch.zeros_like(global_mean), 0)
    site = Site(stored.tensors["site_mean"].double(), stored.tensors["site_precision"].double(), stored.round)
    if site.mean.shape != global_mean.shape:
        raise ValueError(f"stored site has {site.mean.numel()} values, this run's model has {global_mean.numel()}")
    return site
