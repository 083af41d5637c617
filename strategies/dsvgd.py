"""DSVGD (Kassab & Simeone, "Federated Generalized Bayesian Learning via Distributed Stein Variational
Gradient Descent"), and its parallel variant P-DSVGD (App. A.5, Alg. 5). Spec: ../shared/specs/dsvgd.md.

The server holds N global particles Θ (N x P, all model parameters of each particle); their KDE is the
global posterior q. Each round it schedules ONE client (round-robin over stable client ids by default)
and sends it Θ^(i-1). The client
  loop 1 (eqs. 13-14): runs L SVGD steps from Θ^(i-1) towards its tilted distribution
                       p̃_k ∝ q^(i-1)/t_k^(i-1) · exp(-L_k/α) and sends the result Θ^(i) back;
  loop 2 (eq. 17):     distils its factor t_k^(i) ∝ t_k^(i-1) · q^(i)/q^(i-1) into its N local particles
                       Θ_k, which stay in its durable store (client/state.py) and never leave it.
The server replaces Θ by the upload; it never averages particles (they are exchangeable).

Where the prior enters: convention B of the spec (§3.4, the authors' code). A client's local particles
start as copies of Θ^(0) and loop 1 adds ∇log p_0, so the local factor approximates p_0·exp(-L_k/α), a
proper density, and every SVGD target stays normalisable. Θ^(0) is drawn from the model's own
initialiser (torch's default for Linear layers) with the run's seed; client and server draw the same.
L_k is the client's summed loss, estimated on one minibatch per step (the same for all particles) x |D_k|/B.

Rounds whose scheduled client fails leave Θ unchanged. The server tells each client the round of its last
accepted update, and the client starts from the local particles it stored in that round: particles
distilled for an update the server never received are not used.

Scheduling: the server learns a node's stable client id from its first reply, so a node it has not yet sent work
to (a new client, or one whose SuperNode restarted) is scheduled first; after that clients take turns in
client-id order, and a node that was sent work but never got a reply accepted takes its turn after them (it may
not claim every round: that starved the others). A quarantined node is skipped (strategies/isolation.py);
`dsvgd-scheduler = "random"` draws one eligible node per round instead.

P-DSVGD (`p-dsvgd`): a `fraction-train` of the clients per round run both loops from the server's φ and upload
their local particles; the server keeps every client's latest set and distils φ towards
q = p_0 Π_k t_k (eq. 28-29), with t_k = KDE(Θ_k)/p_0 under convention B.

U-DSVGD (`u-dsvgd`, Sec. 5.1, Alg. 4): DSVGD without distillation. The scheduled agent keeps, for every round j
it was scheduled in, the global particles it downloaded (Θ^(j-1)) and uploaded (Θ^(j)), and its factor is the
product t_k = Π_j q^(j)/q^(j-1) over those visits (eq. 10), with q^(0) = p_0 (analytic) and every other q^(j) the
KDE of Θ^(j); loop 1 is DSVGD's with that t_k. Its memory grows by 2·N·P float32 per visit (28.5 MB for 20
particles of the 784-200-100-10 MLP), and each SVGD step costs one KDE per buffered set: a client refuses to
go past `udsvgd-max-visits` visits (run config), naming the key. With K = 1 it is SVGD (A.6).

Evaluation: the server's predictive averages the N particles (eq. 27) and is reported under the
`*_ensemble` keys; the plain keys evaluate the particle mean, which for a network is no meaningful model.

Forgetting a client (`forget`, ../shared/specs/forget.md; Forget-SVGD: Gong, Simeone, Kassab & Kang, arXiv 2111.12056,
built on this paper's tilted update, eqs. 13-14): q ≈ p_0 Π_k t_k, and forgetting agent k is SVGD from the current
particles towards q/t_k = p_0 Π_{j≠k} t_j. Where t_k lives decides who can run it:
  p-dsvgd   the server keeps every client's latest local particles (t_k = KDE(Θ_k)/p_0, convention B), so it runs its
            own distillation (eqs. 28-29) without Θ_k: `server-steps` SVGD steps of φ towards p_0 Π_{j≠k} t_j. A
            particle estimate (KDE factors of width λ, N particles), not exact; refinement rounds go on from the
            remaining sets.
  dsvgd     t_k lives only in client k's durable store (its local particles; U-DSVGD: the particles of its visits) and
  u-dsvgd   the server holds Θ alone: it cannot divide t_k out. In Forget-SVGD client k takes part: it runs SVGD from Θ
            towards q/t_k (`tilted_update`, or `unconstrained_tilted_update`, with its loss left out) and uploads the
            result. There is no instruction for that yet (a new message kind and client half), so `forget` refuses.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import log
from flwr.serverapp import Grid

from fedbayes.bayes.kernels import AdaGradMomentum, grad_log_kde, svgd
from fedbayes.bayes.params import unflatten
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound
from fedbayes.client.state import ClientState
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, PayloadError, TensorLayout
from fedbayes.strategies.base import (
    ForgetRefused, Forgotten, GlobalPosterior, RoundRejected, ServerState, Update, WireStrategy,
)
from fedbayes.tasks.config import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, ConfigError, Key, RunSettings

# ../shared/specs/dsvgd.md §8: the paper's BNN values (its prior precision is e: set prior-precision=2.718).
HYPERPARAMETERS = (
    Key("particles", 20, "N, global and local particles alike (payload: N x P float32)", AT_LEAST_ONE),
    Key("kde-bandwidth", 0.55, "λ, the std of the Gaussian KDE kernel", POSITIVE),
    Key("local-steps", 200, "L: SVGD steps towards the tilted distribution (eq. 13-14)", NON_NEGATIVE),
    Key("distill-steps", 200, "L': SVGD steps distilling the client's local particles (eq. 17)", NON_NEGATIVE),
    Key("server-steps", 200, "L_s: P-DSVGD's server distillation steps (eq. 29)", NON_NEGATIVE),
    Key("svgd-lr", 0.001, "AdaGrad-with-momentum learning rate of loop 1", POSITIVE),
    Key("distill-lr", 0.001, "... of loop 2 and of the P-DSVGD server", POSITIVE),
    Key("svgd-beta", 0.9, "momentum of the squared-direction average", MOMENTUM),
    Key("svgd-fudge", 1e-6, "smoothing term of the step rule", POSITIVE),
    Key("dsvgd-alpha", 1.0, "α, the temperature of the Gibbs posterior (1 = Bayes)", POSITIVE),
    Key("prior-precision", 1.0, "the prior p_0 = N(0, I / prior-precision)", POSITIVE),
    Key("dsvgd-scheduler", "round-robin", "which client a DSVGD round schedules",
        choices=("round-robin", "random")),
    Key("udsvgd-max-visits", 16, "U-DSVGD: the visits an agent may keep (2·N·P float32 each); more is refused",
        AT_LEAST_ONE),
)
from fedbayes.tasks.datasets import Dataset

Score = Callable[[torch.Tensor], torch.Tensor]  # (N, P) particles -> (N, P) gradients


# ---- the math -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SVGDSettings:
    local_steps: int  # L
    distill_steps: int  # L'
    kde_bandwidth: float  # λ
    lr: float
    distill_lr: float
    beta: float = 0.9
    fudge: float = 1e-6
    alpha: float = 1.0  # temperature

    def stepper(self, lr: float) -> AdaGradMomentum:
        return AdaGradMomentum(lr, self.beta, self.fudge)


def gaussian_prior_score(precision: float) -> Score:
    """∇log p_0 for p_0 = N(0, I/precision)."""
    return lambda theta: -precision * theta


def tilted_update(downloaded: torch.Tensor, local: torch.Tensor, prior_score: Score, loss_gradient: Score,
                  settings: SVGDSettings) -> torch.Tensor:
    """Loop 1 (eqs. 13-14, convention B): L SVGD steps from Θ^(i-1) towards
    q^(i-1)/s_k^(i-1) · p_0 · exp(-L_k/α). The KDE centres stay at the downloaded particles and the stored
    local particles while the particles move."""
    bandwidth = settings.kde_bandwidth

    def score(theta: torch.Tensor) -> torch.Tensor:
        return (grad_log_kde(theta, downloaded, bandwidth) - grad_log_kde(theta, local, bandwidth)
                + prior_score(theta) - loss_gradient(theta) / settings.alpha)

    return svgd(downloaded.clone(), score, settings.local_steps, settings.stepper(settings.lr))


def distill(local: torch.Tensor, downloaded: torch.Tensor, updated: torch.Tensor,
            settings: SVGDSettings) -> torch.Tensor:
    """Loop 2 (eq. 17): L' SVGD steps of the local particles towards t_k^(i) ∝ q^(i)/q^(i-1) · t_k^(i-1), the
    three KDEs centred on Θ^(i), Θ^(i-1) and a frozen copy of the old local particles."""
    bandwidth = settings.kde_bandwidth

    def score(theta: torch.Tensor) -> torch.Tensor:
        return (grad_log_kde(theta, updated, bandwidth) - grad_log_kde(theta, downloaded, bandwidth)
                + grad_log_kde(theta, local, bandwidth))

    return svgd(local.clone(), score, settings.distill_steps, settings.stepper(settings.distill_lr))


def agent_round(downloaded: torch.Tensor, local: torch.Tensor, prior_score: Score, loss_gradient: Score,
                settings: SVGDSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """One scheduled client's round: (new global particles to upload, new local particles to keep)."""
    updated = tilted_update(downloaded, local, prior_score, loss_gradient, settings)
    return updated, distill(local, downloaded, updated, settings)


@dataclass(frozen=True)
class Visit:
    """A round j an U-DSVGD agent was scheduled in: the global particles it downloaded, Θ^(j-1) (None for
    Θ^(0), whose density is q^(0) = p_0), and the ones it uploaded, Θ^(j)."""

    before: torch.Tensor | None
    after: torch.Tensor


def global_score(particles: torch.Tensor | None, prior_score: Score, bandwidth: float) -> Score:
    """∇log q^(j): p_0's score for q^(0) (`particles` None), else that of the KDE of Θ^(j)."""
    if particles is None:
        return prior_score
    return lambda theta: grad_log_kde(theta, particles, bandwidth)


def unconstrained_tilted_update(downloaded: torch.Tensor, downloaded_is_initial: bool, visits: list[Visit],
                                prior_score: Score, loss_gradient: Score, settings: SVGDSettings) -> torch.Tensor:
    """U-DSVGD's round (Alg. 4 lines 3-12, eqs. 13-14): L SVGD steps from Θ^(i-1) towards
    q^(i-1)/t_k^(i-1) · exp(-L_k/α), with ∇log t_k^(i-1) = Σ_{j∈I_k} [∇log q^(j) - ∇log q^(j-1)] (eq. 10 as a
    product over the agent's earlier visits; eq. 15 is its recursion) and q^(0) = p_0."""
    bandwidth = settings.kde_bandwidth
    current = global_score(None if downloaded_is_initial else downloaded, prior_score, bandwidth)
    factors = [(global_score(v.after, prior_score, bandwidth), global_score(v.before, prior_score, bandwidth))
               for v in visits]

    def score(theta: torch.Tensor) -> torch.Tensor:
        log_factor = sum((after(theta) - before(theta) for after, before in factors), torch.zeros_like(theta))
        return current(theta) - log_factor - loss_gradient(theta) / settings.alpha

    return svgd(downloaded.clone(), score, settings.local_steps, settings.stepper(settings.lr))


def server_distillation(particles: torch.Tensor, local_sets: list[torch.Tensor], prior_score: Score, steps: int,
                        settings: SVGDSettings) -> torch.Tensor:
    """P-DSVGD (eqs. 28-29): `steps` SVGD steps of φ towards p_0 Π_k t_k over the clients that reported a set,
    where each set approximates p_0·t_k (convention B): ∇log q = ∇log p_0 + Σ_k [∇log KDE(Θ_k) - ∇log p_0]."""
    bandwidth = settings.kde_bandwidth

    def score(theta: torch.Tensor) -> torch.Tensor:
        prior = prior_score(theta)
        return prior + sum(grad_log_kde(theta, local, bandwidth) - prior for local in local_sets)

    return svgd(particles.clone(), score, steps, settings.stepper(settings.distill_lr))


def initial_particles(layout: TensorLayout, count: int, seed: int) -> np.ndarray:
    """Θ^(0), (count, P) float32: each particle drawn like torch's default initialiser of Linear and Conv layers,
    weight and bias ~ U(±1/√fan_in) (fan_in = the weight's size over its first axis); normalisation parameters
    (GroupNorm, FRN) take their constant initial values (scale 1, shift and threshold 0) in every particle.
    Deterministic in `seed`, so the server and every client draw the same."""
    generator = torch.Generator().manual_seed(seed)
    inits = {name: _initialiser(name, layout) for name in layout}
    particles = []
    for _ in range(count):
        pieces = []
        for name, shape in layout.items():
            kind, value = inits[name]
            if kind == "uniform":
                pieces.append((torch.rand(math.prod(shape), generator=generator) * 2 - 1) * value)
            else:
                pieces.append(torch.full((math.prod(shape),), value))
        particles.append(torch.cat(pieces))
    return torch.stack(particles).numpy()


def _initialiser(name: str, layout: TensorLayout) -> tuple[str, float]:
    """("uniform", 1/√fan_in) for a Linear/Conv weight (≥ 2 axes) or its bias; ("constant", c) for a normalisation
    parameter."""
    layer, _, kind = name.rpartition(".")
    weight_shape = layout.get(f"{layer}.weight", ())
    if kind in ("weight", "bias") and len(weight_shape) >= 2:
        return "uniform", 1.0 / math.sqrt(math.prod(weight_shape[1:]))
    if kind in ("weight", "gamma"):
        return "constant", 1.0
    if kind in ("bias", "beta", "tau"):
        return "constant", 0.0
    raise ValueError(f"initial_particles knows Linear, Conv, GroupNorm and FRN parameters, got {name} {layout[name]}")


class MinibatchLossGradient:
    """∇L_k at every particle at once (vmap over the N rows), L_k the summed cross-entropy over the client's
    data, estimated as |D_k|/B x the sum over one minibatch; each call takes the next minibatch of a seeded
    permutation (a new permutation when it runs out), the same for all particles."""

    def __init__(self, model: torch.nn.Module, layout: TensorLayout, data: Dataset, batch_size: int, seed: int,
                 device: torch.device) -> None:
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
        self.gradients = torch.func.vmap(torch.func.grad_and_value(loss_sum), in_dims=(0, None, None),
                                         randomness="different")

    def __call__(self, particles: torch.Tensor) -> torch.Tensor:
        if self.position + self.batch_size > len(self.labels):
            self.order, self.position = torch.randperm(len(self.labels), generator=self.generator), 0
        batch = self.order[self.position : self.position + self.batch_size].to(self.images.device)
        self.position += self.batch_size
        gradients, losses = self.gradients(particles, self.images[batch], self.labels[batch])
        self.last_loss = losses.mean().item() / self.batch_size
        return self.scale * gradients


# ---- server half ----------------------------------------------------------------------------------
class DSVGD(WireStrategy):
    """DSVGD over the network (one client per round), P-DSVGD (`variant="p-dsvgd"`: several, the server distils)
    or U-DSVGD (`variant="u-dsvgd"`: DSVGD whose agents keep every visit, eq. 12's unconstrained update)."""

    def __init__(self, settings: RunSettings, layout: TensorLayout, variant: str = "dsvgd") -> None:
        super().__init__(settings, layout)
        self.variant = variant
        self.parallel = variant == "p-dsvgd"
        self.reply_type = pb.PDSVGDReply if self.parallel else pb.DSVGDReply
        self.size = sum(math.prod(shape) for shape in layout.values())
        self.particle_layout = {"particles": (settings.particles, self.size)}
        self.particles: np.ndarray | None = None  # Θ (P-DSVGD: φ), (N, P) float32
        self.last_scheduled = ""  # round-robin position: the rotation key (turn_key) scheduled last
        self.tried_nodes: set[int] = set()  # nodes sent work before their client id was known
        self.local_particles: dict[str, np.ndarray] = {}  # P-DSVGD: every client's latest local set

    def instruction(self, server_round, arrays, nodes):
        settings = self.settings
        if self.buffer_layout:  # a particle is one parameter vector: batch statistics have no meaning per particle
            raise ConfigError(f"{self.variant}: the model has buffers ({', '.join(list(self.buffer_layout)[:3])}); "
                              "DSVGD's particles are parameters only: use a model without BatchNorm (e.g. GroupNorm)")
        if self.particles is None:
            self.particles = initial_particles(self.layout, settings.particles, settings.seed)
        instruction = pb.DSVGDInstruction(
            variant=self.variant, particle_count=settings.particles, max_visits=settings.udsvgd_max_visits,
            local_steps=settings.local_steps, distill_steps=settings.distill_steps,
            kde_bandwidth=settings.kde_bandwidth, step_size=settings.svgd_lr, distill_step_size=settings.distill_lr,
            beta=settings.svgd_beta, fudge=settings.svgd_fudge, alpha=settings.dsvgd_alpha,
            prior_precision=settings.prior_precision, batch_size=settings.batch_size, initial_seed=settings.seed,
            initial_particles=not self.accepted_rounds,
        )
        log(INFO, "round %d: scheduled %s", server_round, ", ".join(self.node_label(node) for node in nodes))
        return instruction, {"particles": {"particles": self.particles}}

    def round_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """P-DSVGD: a seeded `fraction-train` of the nodes. DSVGD: one node; a node whose client id is not
        known yet first, then the client after the last scheduled one in client-id order (round-robin),
        or a seeded random node (`dsvgd-scheduler = "random"`)."""
        if self.parallel:
            return self.sample(grid, server_round)
        nodes = self.connected_nodes(grid, server_round)
        if not nodes:
            return []
        if self.settings.dsvgd_scheduler == "random":
            return [random.Random(self.round_seed(server_round)).choice(nodes)]
        untried = [node for node in nodes if self.identities.client_of(node) is None and node not in self.tried_nodes]
        if untried:
            self.tried_nodes.add(untried[0])
            self.last_scheduled = self.turn_key(untried[0])  # its next turn comes after a full cycle
            return untried[:1]
        node_of_turn = {self.turn_key(node): node for node in nodes}
        turns = sorted(node_of_turn)
        following = [turn for turn in turns if turn > self.last_scheduled]
        self.last_scheduled = (following or turns)[0]  # moves on even if its reply never comes
        return [node_of_turn[self.last_scheduled]]

    def turn_key(self, node: int) -> str:
        """A node's place in the rotation: its client id, or, for a node never accepted, a key after every id
        ('~' sorts after the characters a client id may hold)."""
        return self.identities.client_of(node) or f"~node-{node:020d}"

    def reply_layouts(self):
        return {"local_particles" if self.parallel else "particles": self.particle_layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        """DSVGD: Θ^(i) − Θ^(i-1), the particles' move; P-DSVGD: the client's local particles' move since its last
        accepted set (Θ^(0) for a new client)."""
        if not self.parallel:
            return (payload.tensors["particles"]["particles"].astype(np.float64) - self.particles).ravel()
        client = payload.message.header.client_id
        previous = self.local_particles.get(client) if payload.message.resumed_from_round else None
        if previous is None:
            previous = initial_particles(self.layout, self.settings.particles, self.settings.seed)
        return (payload.tensors["local_particles"]["particles"].astype(np.float64) - previous).ravel()

    def state_norm(self) -> float:
        return float(np.linalg.norm(self.particles))

    def check_reply(self, payload: Payload) -> None:
        """An update must start from the local particles of the client's last accepted round (or, when they
        are lost, from Θ^(0)); anything else belongs to a round the server never used."""
        self.check_resumed(payload, "it started again from the initial particles (its earlier data now counts twice)")

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        state = {"last_scheduled": payloads[-1].message.header.client_id}  # a newly discovered client counts too
        if self.parallel:
            local_particles = self.local_particles | {
                p.message.header.client_id: p.tensors["local_particles"]["particles"] for p in payloads}
            particles = self._server_distillation(local_particles)
            if particles is None:
                raise RoundRejected("the server's particles became non-finite; lower distill-lr")
            state["local_particles"] = local_particles
        else:
            (payload,) = payloads  # one node was sent the round's instruction
            particles = payload.tensors["particles"]["particles"]  # Alg. 1 line 6: replace, never average
        log_spread(server_round, particles)
        return Update(particles.astype(np.float64).mean(0), state | {"particles": particles})

    def forget(self, client: str) -> Forgotten:
        """Forget-SVGD's target q/t_k = p_0 Π_{j≠k} t_j: P-DSVGD's server distillation (eqs. 28-29) without client k's
        local particles, from φ. DSVGD and U-DSVGD refuse: t_k is client-held (module docstring)."""
        if not self.parallel:
            held = "the particles of its visits" if self.variant == "u-dsvgd" else "its local particles"
            raise ForgetRefused(
                f"{self.variant}: client {client[:64]!r}'s factor t_k lives only in its own durable store ({held}); "
                "the server holds the global particles alone and cannot divide t_k out of q. Forget-SVGD (arXiv "
                "2111.12056) needs that client to take part, running SVGD from the global particles towards q/t_k, "
                "and there is no instruction for it yet: retrain from the last checkpoint that predates the client's "
                "first accepted round, or from scratch (p-dsvgd keeps the factors on the server and can forget)")
        self.check_forgettable(client, self.local_particles)
        local_particles = {c: value for c, value in self.local_particles.items() if c != client}
        particles = self._server_distillation(local_particles)
        if particles is None:
            raise ForgetRefused(f"without client {client!r} the server's particles became non-finite; lower distill-lr")
        note = (f"φ after {self.settings.server_steps} SVGD steps towards p_0 Π t_j over the {len(local_particles)} "
                f"remaining clients' local particles (Forget-SVGD's q/t_k): a particle estimate; refinement rounds "
                "go on from the remaining sets")
        state = {"particles": particles, "local_particles": local_particles, **self.core_state_without(client)}
        return Forgotten(particles.astype(np.float64).mean(0), state, exact=False, kl_before_after=None, note=note)

    def _server_distillation(self, local_particles: dict[str, np.ndarray]) -> np.ndarray | None:
        """P-DSVGD's server step (eq. 28-29) over every client's latest local particles; None if it diverges."""
        settings = self.settings
        steps = SVGDSettings(0, 0, settings.kde_bandwidth, settings.svgd_lr, settings.distill_lr, settings.svgd_beta,
                             settings.svgd_fudge, settings.dsvgd_alpha)
        local_sets = [torch.from_numpy(local_particles[c]) for c in sorted(local_particles)]
        started = time.perf_counter()
        particles = server_distillation(torch.from_numpy(self.particles), local_sets,
                                        gaussian_prior_score(settings.prior_precision), settings.server_steps, steps)
        log(INFO, "P-DSVGD server distillation over %d clients' particles: %.1f s", len(local_sets),
            time.perf_counter() - started)
        if not torch.isfinite(particles).all():
            return None
        return particles.numpy().astype(np.float32)

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        """Every particle (the posterior IS the particles, eq. 27), whenever the ensemble is asked for."""
        if self.particles is None or count == 0:
            return []
        return [unflatten(particle, self.layout) for particle in self.particles]

    def global_posterior(self) -> GlobalPosterior:
        if self.particles is None:
            return super().global_posterior()
        return GlobalPosterior(f"the {len(self.particles)} particles Θ: their KDE (bandwidth "
                               f"{self.settings.kde_bandwidth:g}) is q, the predictive averages the particles "
                               "(eq. 27); the global model is the particle mean, no model of a network",
                               particles=self.particles)

    def state_dict(self) -> ServerState:
        state = super().state_dict()
        if self.particles is not None:
            state.tensors["particles"] = self.particles
            state.tensors |= {f"local/{client}": value for client, value in self.local_particles.items()}
            state.metadata["last_scheduled"] = self.last_scheduled
        return state

    def load_state_dict(self, state: ServerState) -> None:
        super().load_state_dict(state)
        if "particles" not in state.tensors:
            return
        self.particles = state.tensors["particles"].astype(np.float32)
        self.local_particles = {name.removeprefix("local/"): value.astype(np.float32)
                                for name, value in state.tensors.items() if name.startswith("local/")}
        self.last_scheduled = state.metadata["last_scheduled"]


def log_spread(server_round: int, particles: np.ndarray) -> None:
    """The spec's instability watch (§9.4): particles running off show as growing norms."""
    particles = torch.from_numpy(particles).double()
    log(INFO, "round %d: particle norms max %.3g, mean distance to the particle mean %.3g", server_round,
        particles.norm(dim=1).max().item(), (particles - particles.mean(0)).norm(dim=1).mean().item())


def p_dsvgd(settings: RunSettings, layout: TensorLayout) -> DSVGD:
    return DSVGD(settings, layout, variant="p-dsvgd")


def u_dsvgd(settings: RunSettings, layout: TensorLayout) -> DSVGD:
    return DSVGD(settings, layout, variant="u-dsvgd")


# ---- client half ----------------------------------------------------------------------------------
VARIANTS = ("dsvgd", "p-dsvgd", "u-dsvgd")


def instruction_layouts(instruction: pb.DSVGDInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    if instruction.variant not in VARIANTS:
        raise PayloadError(f"field 'variant': {instruction.variant[:32]!r} is not one of {', '.join(VARIANTS)}")
    return {"particles": {"particles": (instruction.particle_count, sum(math.prod(s) for s in layout.values()))}}


def local_update(local: LocalRound) -> LocalResult:
    """Loops 1 and 2 on this client; its local particles persist in the durable store, never on the wire."""
    instruction, runtime, stored = local.instruction, local.runtime, local.stored
    settings = SVGDSettings(
        instruction.local_steps, instruction.distill_steps, instruction.kde_bandwidth, instruction.step_size,
        instruction.distill_step_size, instruction.beta, instruction.fudge, instruction.alpha,
    )
    device = runtime.device
    downloaded = torch.from_numpy(local.tensors["particles"]["particles"]).to(device)
    shape = tuple(downloaded.shape)
    loss_gradient = MinibatchLossGradient(runtime.model.to(device), runtime.layout, runtime.data,
                                          instruction.batch_size,
                                          runtime.local_seed(instruction.initial_seed, local.server_round), device)
    prior_score = gaussian_prior_score(instruction.prior_precision)
    started = time.perf_counter()
    if instruction.variant == "u-dsvgd":
        visits = [Visit(None if v.before is None else v.before.to(device), v.after.to(device))
                  for v in _stored_visits(stored, shape, instruction.max_visits, runtime.node.client_id)]
        updated = unconstrained_tilted_update(downloaded, instruction.initial_particles, visits, prior_score,
                                              loss_gradient, settings)
        visits.append(Visit(None if instruction.initial_particles else downloaded, updated))
        state, kept = visits_state(visits), updated
    else:
        local_particles = _stored_local_particles(stored, shape, runtime.layout, instruction.initial_seed)
        updated, kept = agent_round(downloaded, local_particles.to(device), prior_score, loss_gradient, settings)
        state = {"local_particles": kept.cpu()}
    compute_seconds = time.perf_counter() - started
    runtime.model.cpu()
    if not (torch.isfinite(updated).all() and torch.isfinite(kept).all()):
        raise FloatingPointError(f"{runtime.node.client_id}: particles became non-finite in round "
                                 f"{local.server_round}; lower svgd-lr / distill-lr or raise kde-bandwidth")
    fields = dict(train_loss=loss_gradient.last_loss, compute_seconds=compute_seconds)
    if instruction.variant == "p-dsvgd":
        return LocalResult(pb.PDSVGDReply(**fields), {"local_particles": {"particles": kept.cpu().numpy()}}, state)
    return LocalResult(pb.DSVGDReply(**fields), {"particles": {"particles": updated.cpu().numpy()}}, state)


client_update = ClientHalf(pb.DSVGDInstruction, local_update, instruction_layouts, stateful=True)


def _stored_local_particles(stored: ClientState | None, shape: tuple[int, ...], layout: TensorLayout,
                            initial_seed: int) -> torch.Tensor:
    """This client's local particles after the round of its last accepted update; at its first visit (or, logged
    as an error by the runtime, if they are lost) copies of Θ^(0). Lost particles cannot be recovered: starting
    again from Θ^(0) counts this client's earlier data twice (spec §4)."""
    if stored is None:
        return torch.from_numpy(initial_particles(layout, shape[0], initial_seed))
    local = stored.tensors["local_particles"]
    if tuple(local.shape) != shape:
        raise ValueError(f"stored local particles have shape {tuple(local.shape)}, this run needs {shape}")
    return local.float()


def visits_state(visits: list[Visit]) -> dict[str, torch.Tensor]:
    """An U-DSVGD agent's buffer as durable-state tensors: (V, N, P) downloaded and uploaded particles and which
    downloads were Θ^(0) (their `before` is stored as zeros)."""
    return {
        "visit_before": torch.stack([torch.zeros_like(v.after) if v.before is None else v.before for v in visits]).cpu(),
        "visit_after": torch.stack([v.after for v in visits]).cpu(),
        "visit_initial": torch.tensor([v.before is None for v in visits], dtype=torch.uint8),
    }


def _stored_visits(stored: ClientState | None, shape: tuple[int, ...], max_visits: int, client: str) -> list[Visit]:
    """This U-DSVGD agent's buffer after the round of its last accepted update ([] at its first visit or when
    lost); refuses to grow it past the instruction's `max_visits` (run config `udsvgd-max-visits`)."""
    if stored is None:
        return []
    before, after, initial = (stored.tensors[name] for name in ("visit_before", "visit_after", "visit_initial"))
    if tuple(after.shape[1:]) != shape:
        raise ValueError(f"stored U-DSVGD particles have shape {tuple(after.shape[1:])}, this run needs {shape}")
    if len(after) >= max_visits:
        raise ValueError(f"{client}: U-DSVGD keeps the particles of {len(after)} visits (2 x {shape[0]} x {shape[1]} "
                         f"float32 each) and run config 'udsvgd-max-visits' = {max_visits} allows no more; raise it, "
                         "or use dsvgd, whose memory stays N x P")
    return [Visit(None if flag else b.float(), a.float()) for b, a, flag in zip(before, after, initial.tolist())]
