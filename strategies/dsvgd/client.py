"""DSVGD's client half: loops 1 and 2 on this client's data; its local particles (U-DSVGD: visits) stay in the
durable store. Its forget half: the client's part of its own forget (Forget-SVGD), from that store alone."""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from fedbayes.bayes.params import TensorLayout, Tensors
from fedbayes.client.core import (
    ClientHalf,
    ForgetHalf,
    ForgetResult,
    ForgetRound,
    LocalResult,
    LocalRound,
    particle_members,
)
from fedbayes.client.state import ClientState
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PayloadError
from fedbayes.strategies.dsvgd.math import (
    VARIANTS,
    SVGDSettings,
    Visit,
    agent_round,
    forget_update,
    gaussian_prior_score,
    initial_particles,
    unconstrained_forget_update,
    unconstrained_tilted_update,
)
from fedbayes.tasks.datasets import Dataset


class MinibatchLossGradient:
    """∇L_k at every particle at once (vmap over the N rows), L_k the summed cross-entropy over the client's
    data, estimated as |D_k|/B x the sum over one minibatch; each call takes the next minibatch of a seeded
    permutation (a new permutation when it runs out), the same for all particles."""

    def __init__(
        self,
        model: torch.nn.Module,
        layout: TensorLayout,
        data: Dataset,
        batch_size: int,
        seed: int,
        device: torch.device,
    ) -> None:
        self.images, self.labels = data.images.to(device), data.labels.to(device)
        self.batch_size = min(batch_size, len(self.labels))
        self.scale = len(self.labels) / self.batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.order, self.position = torch.randperm(len(self.labels), generator=self.generator), 0
        self.last_loss = float("nan")  # mean per-example loss over the particles at the last call

        def loss_sum(theta: torch.Tensor, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            weights, offset = {}, 0
            for name, shape in layout.items():
                weights[name] = theta[offset : offset + math.prod(shape)].view(shape)
                offset += math.prod(shape)
            logits = torch.func.functional_call(model, weights, (images,))
            return F.cross_entropy(logits, labels, reduction="sum")

        model.train()  # local training: dropout on, an independent mask per particle
        self.gradients = torch.func.vmap(
            torch.func.grad_and_value(loss_sum), in_dims=(0, None, None), randomness="different"
        )

    def __call__(self, particles: torch.Tensor) -> torch.Tensor:
        if self.position + self.batch_size > len(self.labels):
            self.order, self.position = torch.randperm(len(self.labels), generator=self.generator), 0
        batch = self.order[self.position : self.position + self.batch_size].to(self.images.device)
        self.position += self.batch_size
        gradients, losses = self.gradients(particles, self.images[batch], self.labels[batch])
        self.last_loss = losses.mean().item() / self.batch_size
        return self.scale * gradients


def instruction_layouts(instruction: pb.DSVGDInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    """The layouts of an instruction's tensor groups, checked before they are decoded.

    Args:
        instruction: the round's instruction; its `particle_count` is N.
        layout: the model's parameters, P values in all.

    Returns:
        {"particles": {"particles": (N, P)}}.

    Raises:
        PayloadError: `variant` is not one of VARIANTS.
    """
    if instruction.variant not in VARIANTS:
        raise PayloadError(f"field 'variant': {instruction.variant[:32]!r} is not one of {', '.join(VARIANTS)}")
    return {"particles": {"particles": (instruction.particle_count, sum(math.prod(s) for s in layout.values()))}}


def local_update(local: LocalRound) -> LocalResult:
    """Loops 1 and 2 on this client; its local particles (U-DSVGD: its visits) persist in the durable store, never on
    the wire.

    Args:
        local: the round's instruction (variant, both loops' steps and step sizes, KDE bandwidth, prior, batch size,
            whether Θ^(0) is sent), the global particles, this client's runtime, and its stored local particles or
            visits (None: first visit, or lost: copies of Θ^(0)).

    Returns:
        DSVGD and U-DSVGD: the reply with the updated global particles; P-DSVGD: with its local particles; each with
        the last minibatch's mean loss per example, the compute seconds, and the local particles or visits to store.

    Raises:
        ValueError: the stored particles or visits do not have this run's shape, or U-DSVGD's buffer is full
            (udsvgd-max-visits).
        FloatingPointError: the particles became non-finite.
    """
    instruction, runtime, stored = local.instruction, local.runtime, local.stored
    settings = SVGDSettings(
        instruction.local_steps,
        instruction.distill_steps,
        instruction.kde_bandwidth,
        instruction.step_size,
        instruction.distill_step_size,
        instruction.beta,
        instruction.fudge,
        instruction.alpha,
    )
    device = runtime.device
    downloaded = torch.from_numpy(local.tensors["particles"]["particles"]).to(device)
    shape = tuple(downloaded.shape)
    loss_gradient = MinibatchLossGradient(
        runtime.model.to(device),
        runtime.layout,
        runtime.data,
        instruction.batch_size,
        runtime.local_seed(instruction.initial_seed, local.server_round),
        device,
    )
    prior_score = gaussian_prior_score(instruction.prior_precision)
    started = time.perf_counter()
    if instruction.variant == "u-dsvgd":
        visits = [
            Visit(None if v.before is None else v.before.to(device), v.after.to(device))
            for v in _stored_visits(stored, shape, instruction.max_visits, runtime.node.client_id)
        ]
        updated = unconstrained_tilted_update(
            downloaded, instruction.initial_particles, visits, prior_score, loss_gradient, settings
        )
        visits.append(Visit(None if instruction.initial_particles else downloaded, updated))
        state, kept = visits_state(visits), updated
    else:
        local_particles = _stored_local_particles(stored, shape, runtime.layout, instruction.initial_seed)
        updated, kept = agent_round(downloaded, local_particles.to(device), prior_score, loss_gradient, settings)
        state = {"local_particles": kept.cpu()}
    compute_seconds = time.perf_counter() - started
    runtime.model.cpu()
    if not (torch.isfinite(updated).all() and torch.isfinite(kept).all()):
        raise FloatingPointError(
            f"{runtime.node.client_id}: particles became non-finite in round "
            f"{local.server_round}; lower svgd-lr / distill-lr or raise kde-bandwidth"
        )
    if instruction.variant == "p-dsvgd":
        return LocalResult(
            pb.PDSVGDReply(),
            {"local_particles": {"particles": kept.cpu().numpy()}},
            loss_gradient.last_loss,
            compute_seconds,
            state,
        )
    return LocalResult(
        pb.DSVGDReply(),
        {"particles": {"particles": updated.cpu().numpy()}},
        loss_gradient.last_loss,
        compute_seconds,
        state,
    )


def forget_layouts(instruction: pb.DSVGDForgetInstruction, stored: ClientState) -> dict[str, TensorLayout]:
    """The forget request's particles: N x P, P that of the factor this client stored.

    Args:
        instruction: the forget request; its `particle_count` is N.
        stored: this client's durable state (its local particles, or U-DSVGD's visits).

    Returns:
        {"particles": {"particles": (N, P)}}.

    Raises:
        PayloadError: `variant` is neither dsvgd nor u-dsvgd (P-DSVGD forgets on the server).
    """
    if instruction.variant not in ("dsvgd", "u-dsvgd"):
        raise PayloadError(f"field 'variant': {instruction.variant[:32]!r} is not dsvgd or u-dsvgd")
    factor = stored.tensors["visit_after" if instruction.variant == "u-dsvgd" else "local_particles"]
    return {"particles": {"particles": (instruction.particle_count, factor.shape[-1])}}


def forget_step(forget: ForgetRound) -> ForgetResult:
    """This client's part of its forget (Forget-SVGD): SVGD from the global particles towards q/t_k, its factor t_k
    from its durable store (DSVGD: its local particles; U-DSVGD: the particles of its visits), its loss left out: no
    data. The store stays as it is until the server confirms the forget.

    Args:
        forget: the server's request (steps, step size, KDE bandwidth, prior), the global particles, this client's
            stored factor and the device.

    Returns:
        The reply with the particles Θ' ≈ q/t_k, (N, P), and the compute seconds.

    Raises:
        ValueError: the stored factor does not have the request's shape.
        FloatingPointError: the particles became non-finite.
    """
    instruction, device = forget.instruction, forget.device
    settings = SVGDSettings(
        instruction.steps,
        0,
        instruction.kde_bandwidth,
        instruction.step_size,
        instruction.step_size,
        instruction.beta,
        instruction.fudge,
    )
    particles = torch.from_numpy(forget.tensors["particles"]["particles"]).to(device)
    shape, client = tuple(particles.shape), forget.header.client_id or "this client"
    prior_score = gaussian_prior_score(instruction.prior_precision)
    started = time.perf_counter()
    if instruction.variant == "u-dsvgd":
        visits = [
            Visit(None if v.before is None else v.before.to(device), v.after.to(device))
            for v in _stored_visits(forget.stored, shape, None, client)
        ]
        updated = unconstrained_forget_update(particles, visits, prior_score, settings)
    else:
        local = _local_particles_of(forget.stored, shape).to(device)
        updated = forget_update(particles, local, prior_score, settings)
    compute_seconds = time.perf_counter() - started
    if not torch.isfinite(updated).all():
        raise FloatingPointError(
            f"{client}: the particles became non-finite while forgetting this client; lower svgd-lr or raise "
            "kde-bandwidth"
        )
    return ForgetResult(pb.DSVGDForgetReply(), {"particles": {"particles": updated.cpu().numpy()}}, compute_seconds)


client_update = ClientHalf(
    pb.DSVGDInstruction,
    local_update,
    instruction_layouts,
    stateful=True,
    forget=ForgetHalf(pb.DSVGDForgetInstruction, forget_step, forget_layouts),
    global_model=lambda local: particle_members(local.tensors["particles"]["particles"], local.runtime.layout),
    local_posterior=lambda local, result: local_particle_members(local, result),
)


def local_particle_members(local: LocalRound, result: LocalResult) -> list[Tensors]:
    """DSVGD's and P-DSVGD's local particles after this round, as the members of the client's own posterior (U-DSVGD
    keeps visits, no local particles: none).

    Args:
        local: the round, for the model's layout.
        result: the round's result, whose state holds the local particles.

    Returns:
        One parameter setting (name -> array) per local particle; none for U-DSVGD.
    """
    kept = result.state.get("local_particles")
    return [] if kept is None else particle_members(kept.numpy(), local.runtime.layout)


def _stored_local_particles(
    stored: ClientState | None, shape: tuple[int, ...], layout: TensorLayout, initial_seed: int
) -> torch.Tensor:
    """This client's local particles after the round of its last accepted update; at its first visit (or, logged
    as an error by the runtime, if they are lost) copies of Θ^(0). Lost particles cannot be recovered: starting
    again from Θ^(0) counts this client's earlier data twice (spec §4)."""
    if stored is None:
        return torch.from_numpy(initial_particles(layout, shape[0], initial_seed))
    return _local_particles_of(stored, shape)


def _local_particles_of(stored: ClientState, shape: tuple[int, ...]) -> torch.Tensor:
    local = stored.tensors["local_particles"]
    if tuple(local.shape) != shape:
        raise ValueError(f"stored local particles have shape {tuple(local.shape)}, this run needs {shape}")
    return local.float()


def visits_state(visits: list[Visit]) -> dict[str, torch.Tensor]:
    """An U-DSVGD agent's buffer as durable-state tensors.

    Args:
        visits: the agent's visits, each its downloaded (None: Θ^(0)) and uploaded particles, (N, P).

    Returns:
        "visit_before" and "visit_after", (V, N, P) on the CPU (a Θ^(0) download stored as zeros), and
        "visit_initial", (V,) uint8: which downloads were Θ^(0).
    """
    return {
        "visit_before": torch.stack(
            [torch.zeros_like(v.after) if v.before is None else v.before for v in visits]
        ).cpu(),
        "visit_after": torch.stack([v.after for v in visits]).cpu(),
        "visit_initial": torch.tensor([v.before is None for v in visits], dtype=torch.uint8),
    }


def _stored_visits(
    stored: ClientState | None, shape: tuple[int, ...], max_visits: int | None, client: str
) -> list[Visit]:
    """This U-DSVGD agent's buffer after the round of its last accepted update ([] at its first visit or when
    lost); refuses to grow it past the instruction's `max_visits` (run config `udsvgd-max-visits`; None: it will not
    grow, as when the agent is forgotten)."""
    if stored is None:
        return []
    before, after, initial = (stored.tensors[name] for name in ("visit_before", "visit_after", "visit_initial"))
    if tuple(after.shape[1:]) != shape:
        raise ValueError(f"stored U-DSVGD particles have shape {tuple(after.shape[1:])}, this run needs {shape}")
    if max_visits is not None and len(after) >= max_visits:
        raise ValueError(
            f"{client}: U-DSVGD keeps the particles of {len(after)} visits (2 x {shape[0]} x {shape[1]} "
            f"float32 each) and run config 'udsvgd-max-visits' = {max_visits} allows no more; raise it, "
            "or use dsvgd, whose memory stays N x P"
        )
    return [Visit(None if flag else b.float(), a.float()) for b, a, flag in zip(before, after, initial.tolist())]
