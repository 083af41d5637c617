"""DSVGD's server half: the global particles, which client each round schedules, P-DSVGD's distillation."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from logging import INFO
from typing import ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.common import log

from fedbayes.bayes.params import TensorLayout, unflatten
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload
from fedbayes.strategies.base import (
    ClientForget,
    ForgetRefused,
    Forgotten,
    GlobalPosterior,
    NodePool,
    RoundRejected,
    ServerState,
    ServerStrategy,
    TensorGroups,
    Update,
)
from fedbayes.strategies.dsvgd.math import SVGDSettings, gaussian_prior_score, initial_particles, server_distillation
from fedbayes.strategies.dsvgd.settings import DSVGDSettings
from fedbayes.tasks.config import ConfigError, RunSettings


@dataclass(frozen=True)
class DSVGDState:
    """The global particles Θ (P-DSVGD: φ), (N, P) float32 (None until round 1 draws Θ^(0)); P-DSVGD: every client's
    latest local particles; the round-robin position, the rotation key (`turn_key`) scheduled last."""

    particles: np.ndarray | None = None
    local_particles: dict[str, np.ndarray] = field(default_factory=dict)
    last_scheduled: str = ""


class DSVGD(ServerStrategy[DSVGDState]):
    """DSVGD over the network, one client per round; PDSVGD and UDSVGD are its variants (the package docstring)."""

    reply_type: ClassVar[type[pb.DSVGDReply | pb.PDSVGDReply]] = pb.DSVGDReply
    fresh_start = "it started again from the initial particles (its earlier data now counts twice)"
    variant: ClassVar[str] = "dsvgd"
    parallel: ClassVar[bool] = False  # P-DSVGD: several clients a round, whose local particles the server distils
    # λ where kde-bandwidth is 0. DSVGD's revisits divide each client's KDE factor t_k out of q again: at the paper's
    # 0.55 its NLL grew with the rounds on tabular data a user brings (breast_cancer 0.10 at round 1, 0.64 at round
    # 30; FedAvg 0.11), at 1.5 it stayed at or below FedAvg's on breast_cancer, wine and digits at 10 and 30 rounds
    # (benchmarks/results/user_defaults/t-dsvgd-kde-bandwidth*). P-DSVGD (much worse at 1.0) and U-DSVGD keep 0.55.
    default_kde_bandwidth: ClassVar[float] = 1.5
    hyperparameters: DSVGDSettings

    def __init__(self, settings: RunSettings, layout: TensorLayout, buffer_layout: TensorLayout | None = None) -> None:
        if buffer_layout:  # a particle is one parameter vector: batch statistics have no meaning per particle
            raise ConfigError(
                f"{self.variant}: the model has buffers ({', '.join(list(buffer_layout)[:3])}); "
                "DSVGD's particles are parameters only: use a model without BatchNorm (e.g. GroupNorm)"
            )
        super().__init__(settings, layout, buffer_layout)
        if not self.hyperparameters.kde_bandwidth:
            self.hyperparameters = replace(self.hyperparameters, kde_bandwidth=self.default_kde_bandwidth)
            log(INFO, "%s: kde-bandwidth %g, the variant's default", self.variant, self.default_kde_bandwidth)
        self.size = sum(math.prod(shape) for shape in layout.values())
        self.particle_layout = {"particles": (self.hyperparameters.particles, self.size)}
        self.tried_nodes: set[int] = set()  # nodes sent work before their client id was known
        self.sending_initial = True  # this round sends Θ^(0): the server has accepted no update yet

    def initial_state(self) -> DSVGDState:
        """The state before round 1.

        Returns:
            No particles yet (round 1's instruction draws Θ^(0)), no local particles, nobody scheduled.
        """
        return DSVGDState()

    @property
    def particles(self) -> np.ndarray:
        assert self.state.particles is not None, "Θ^(0) is drawn in round 1's instruction"
        return self.state.particles

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.DSVGDInstruction, TensorGroups]:
        """This round's instruction: the SVGD loops from the global particles. Round 1's also draws Θ^(0) from the run
        seed.

        Args:
            server_round: the round, >= 1.
            arrays: the global arrays the core holds; the particles, not these, are what travels.
            nodes: the nodes select_nodes chose; every one gets the same instruction.

        Returns:
            The instruction (variant, particle count, both loops' steps and step sizes, the KDE bandwidth, the prior,
            the batch size, and whether Θ^(0) is sent: no update accepted yet) and its tensor group "particles":
            {"particles": Θ}, (N, P) float32.
        """
        hp = self.hyperparameters
        if self.state.particles is None:
            self.state = replace(self.state, particles=initial_particles(self.layout, hp.particles, self.settings.seed))
        instruction = pb.DSVGDInstruction(
            variant=self.variant,
            particle_count=hp.particles,
            max_visits=hp.udsvgd_max_visits,
            local_steps=hp.local_steps,
            distill_steps=hp.distill_steps,
            kde_bandwidth=hp.kde_bandwidth,
            step_size=hp.svgd_lr * self._schedule_factor(server_round),
            distill_step_size=hp.distill_lr * self._schedule_factor(server_round),
            beta=hp.svgd_beta,
            fudge=hp.svgd_fudge,
            alpha=hp.dsvgd_alpha,
            prior_precision=hp.prior_precision,
            batch_size=self.settings.batch_size,
            initial_seed=self.settings.seed,
            initial_particles=self.sending_initial,
        )
        return instruction, {"particles": {"particles": self.particles}}

    def _schedule_factor(self, server_round: int) -> float:
        """The run's `lr-schedule` as a factor of the clients' step sizes: 1 (constant), or the cosine's share of `lr`
        in `server_round`; the factor first, so that a constant schedule leaves each step size as it is."""
        training = self.settings.training
        return training.round_lr(server_round) / training.lr

    def select_nodes(self, pool: NodePool, server_round: int) -> list[int]:
        """P-DSVGD: the seeded `fraction-train` sample. DSVGD: one node; a node whose client id is not known yet
        first, then the client after the last scheduled one in client-id order (round-robin), or a seeded random
        node (`dsvgd-scheduler = "random"`). The scheduled turn moves on even if its reply never comes.

        Args:
            pool: the round's eligible nodes, their sample, their client ids and accepted rounds.
            server_round: the round; it seeds the random scheduler.

        Returns:
            The nodes to send the round to: the sample (P-DSVGD), one node (DSVGD, U-DSVGD), or none when no node is
            eligible.
        """
        self.sending_initial = not pool.accepted_rounds
        nodes = list(pool.sample) if self.parallel else self._scheduled(pool, server_round)
        log(INFO, "round %d: scheduled %s", server_round, ", ".join(pool.label(node) for node in nodes))
        return nodes

    def _scheduled(self, pool: NodePool, server_round: int) -> list[int]:
        nodes = list(pool.eligible)
        if not nodes:
            return []
        if self.hyperparameters.dsvgd_scheduler == "random":
            return [random.Random(self.round_seed(server_round)).choice(nodes)]
        untried = [node for node in nodes if pool.client_of(node) is None and node not in self.tried_nodes]
        if untried:
            self.tried_nodes.add(untried[0])
            self._scheduled_turn(turn_key(pool, untried[0]))  # its next turn comes after a full cycle
            return untried[:1]
        node_of_turn = {turn_key(pool, node): node for node in nodes}
        turns = sorted(node_of_turn)
        following = [turn for turn in turns if turn > self.state.last_scheduled]
        self._scheduled_turn((following or turns)[0])  # moves on even if its reply never comes
        return [node_of_turn[self.state.last_scheduled]]

    def _scheduled_turn(self, turn: str) -> None:
        self.state = replace(self.state, last_scheduled=turn)

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layout of a reply's tensors.

        Returns:
            {"particles": {"particles": (N, P)}}; P-DSVGD's group is "local_particles".
        """
        return {"local_particles" if self.parallel else "particles": self.particle_layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        """DSVGD: Θ^(i) − Θ^(i-1), the particles' move; P-DSVGD: the client's local particles' move since its last
        accepted set (Θ^(0) for a new client).

        Args:
            payload: an accepted reply.

        Returns:
            The move, flattened, float64 (N·P,).
        """
        if not self.parallel:
            return (payload.tensors["particles"]["particles"].astype(np.float64) - self.particles).ravel()
        client = payload.header.client_id
        previous = self.state.local_particles.get(client) if payload.reply.resumed_from_round else None
        if previous is None:
            previous = initial_particles(self.layout, self.hyperparameters.particles, self.settings.seed)
        return (payload.tensors["local_particles"]["particles"].astype(np.float64) - previous).ravel()

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`.

        Returns:
            ‖Θ‖, the Frobenius norm of the global particles.
        """
        return float(np.linalg.norm(self.particles))

    def update_scale(self, payload: Payload) -> float:
        """The client's examples: its SVGD steps follow the gradient of its whole data's log likelihood, a sum over
        them (only P-DSVGD's rounds have other replies to compare with).

        Args:
            payload: an accepted reply.

        Returns:
            Its num_examples, as a float.
        """
        return float(payload.reply.num_examples)

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[DSVGDState]:
        """The new global particles, without changing the strategy: DSVGD's client's upload replaces them (Alg. 1 line
        6,
        never averaged); P-DSVGD's server distils φ over every client's latest local particles.

        Args:
            payloads: the accepted replies, in client-id order: one for DSVGD and U-DSVGD.
            server_round: the round, for the log of the particles' spread.

        Returns:
            The particle mean as the global model, and the state: the particles, the local particles (P-DSVGD) and the
            last replying client as the rotation's position.

        Raises:
            RoundRejected: P-DSVGD's distillation made non-finite particles.
            ValueError: DSVGD with more than one reply.
        """
        last_scheduled = payloads[-1].header.client_id  # a newly discovered client counts too
        local_particles = self.state.local_particles
        if self.parallel:
            local_particles = local_particles | {
                p.header.client_id: p.tensors["local_particles"]["particles"] for p in payloads
            }
            particles = self._server_distillation(local_particles)
            if particles is None:
                raise RoundRejected("the server's particles became non-finite; lower distill-lr")
        else:
            (payload,) = payloads  # one node was sent the round's instruction
            particles = payload.tensors["particles"]["particles"]  # Alg. 1 line 6: replace, never average
        log_spread(server_round, particles)
        return Update(particles.astype(np.float64).mean(0), DSVGDState(particles, local_particles, last_scheduled))

    def forget(self, client: str) -> Forgotten[DSVGDState] | ClientForget[DSVGDState]:
        """Forget-SVGD's target q/t_k = p_0 Π_{j≠k} t_j. P-DSVGD: the server's distillation (eqs. 28-29) without client
        k's local particles, from φ. DSVGD and U-DSVGD: t_k is client-held (package docstring), so client k runs the
        SVGD steps (`forget_update`, `unconstrained_forget_update`) and the server adopts what it uploads.

        Args:
            client: the client id to forget.

        Returns:
            P-DSVGD: the new particle mean and state, not exact, with a note. DSVGD and U-DSVGD: what to ask client k
            (the particles and loop 1's step settings) and how its reply becomes the new state.

        Raises:
            ForgetRefused: P-DSVGD: the client is unknown or the last one, or the distillation diverges; DSVGD: no
                round has been accepted yet.
        """
        if not self.parallel:
            return self._client_forget(client)
        self.check_forgettable(client, self.state.local_particles)
        local_particles = {c: value for c, value in self.state.local_particles.items() if c != client}
        particles = self._server_distillation(local_particles)
        if particles is None:
            raise ForgetRefused(f"without client {client!r} the server's particles became non-finite; lower distill-lr")
        note = (
            f"φ after {self.hyperparameters.server_steps} SVGD steps towards p_0 Π t_j over the {len(local_particles)} "
            f"remaining clients' local particles (Forget-SVGD's q/t_k): a particle estimate; refinement rounds "
            "go on from the remaining sets"
        )
        state = replace(self.state, particles=particles, local_particles=local_particles)
        return Forgotten(particles.astype(np.float64).mean(0), state, exact=False, kl_before_after=None, note=note)

    def _client_forget(self, client: str) -> ClientForget[DSVGDState]:
        """What client k is asked for its forget: the global particles Θ and loop 1's step settings; it answers with
        Θ' ≈ q/t_k from its durable store alone (strategies/dsvgd/client.py forget_step)."""
        if self.state.particles is None:
            raise ForgetRefused(f"client {client[:64]!r} is unknown: no round has been accepted yet")
        hp = self.hyperparameters
        instruction = pb.DSVGDForgetInstruction(
            variant=self.variant,
            particle_count=hp.particles,
            steps=hp.local_steps,
            kde_bandwidth=hp.kde_bandwidth,
            step_size=hp.svgd_lr,
            beta=hp.svgd_beta,
            fudge=hp.svgd_fudge,
            prior_precision=hp.prior_precision,
        )
        return ClientForget(
            instruction,
            {"particles": {"particles": self.particles}},
            pb.DSVGDForgetReply,
            {"particles": self.particle_layout},
            partial(self._forgotten_by, client),
            "the particles of its visits" if self.variant == "u-dsvgd" else "its local particles",
        )

    def _forgotten_by(self, client: str, payload: Payload) -> Forgotten[DSVGDState]:
        """Client k's forget upload (checked by the round core: shape, finite, its accepted round, the screen) as the
        new Θ, replacing the old as a round's upload does (Alg. 1 line 6)."""
        particles = payload.tensors["particles"]["particles"].copy()  # the payload's array is a view of its buffer
        note = (
            f"client {client!r} ran {self.hyperparameters.local_steps} SVGD steps from the global particles towards "
            f"q/t_k (Forget-SVGD: {self.variant}'s tilted update with its loss left out, its factor from its own "
            "store) and the server adopted them: a particle estimate (KDE factors of width "
            f"{self.hyperparameters.kde_bandwidth:g}, {len(particles)} particles); refinement rounds go on from them"
        )
        state = replace(self.state, particles=particles)
        return Forgotten(particles.astype(np.float64).mean(0), state, exact=False, kl_before_after=None, note=note)

    def _server_distillation(self, local_particles: dict[str, np.ndarray]) -> np.ndarray | None:
        """P-DSVGD's server step (eq. 28-29) over every client's latest local particles; None if it diverges."""
        hp = self.hyperparameters
        steps = SVGDSettings(
            0, 0, hp.kde_bandwidth, hp.svgd_lr, hp.distill_lr, hp.svgd_beta, hp.svgd_fudge, hp.dsvgd_alpha
        )
        local_sets = [torch.from_numpy(local_particles[c]) for c in sorted(local_particles)]
        started = time.perf_counter()
        particles = server_distillation(
            torch.from_numpy(self.particles),
            local_sets,
            gaussian_prior_score(hp.prior_precision),
            hp.server_steps,
            steps,
        )
        log(
            INFO,
            "P-DSVGD server distillation over %d clients' particles: %.1f s",
            len(local_sets),
            time.perf_counter() - started,
        )
        if not torch.isfinite(particles).all():
            return None
        return particles.numpy().astype(np.float32)

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        """Every particle (the posterior IS the particles, eq. 27), whenever the ensemble is asked for.

        Args:
            count: the samples asked for; any count > 0 gives all N particles.
            generator: unused: nothing is drawn.

        Returns:
            The N particles, name -> array in `layout`; none before round 1 or for `count` 0.
        """
        if self.state.particles is None or count == 0:
            return []
        return [unflatten(particle, self.layout) for particle in self.particles]

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the global posterior (`fedbayes export`).

        Returns:
            The particles Θ, (N, P), whose KDE is q; before round 1, a point estimate.
        """
        if self.state.particles is None:
            return super().global_posterior()
        return GlobalPosterior(
            f"the {len(self.particles)} particles Θ: their KDE (bandwidth "
            f"{self.hyperparameters.kde_bandwidth:g}) is q, the predictive averages the particles "
            "(eq. 27); the global model is the particle mean, no model of a network",
            particles=self.particles,
        )

    def save_state(self, state: DSVGDState) -> ServerState:
        """`state` as a checkpoint holds it.

        Args:
            state: a DSVGD state.

        Returns:
            "particles", every client's local particles ("local/<client>", P-DSVGD) and the rotation's position as
            metadata; nothing before round 1.
        """
        saved = ServerState()
        if state.particles is not None:
            saved.tensors["particles"] = state.particles
            saved.tensors |= {f"local/{client}": value for client, value in state.local_particles.items()}
            saved.metadata["last_scheduled"] = state.last_scheduled
        return saved

    def load_state(self, saved: ServerState) -> DSVGDState:
        """The saved particles, each set (N, P) as this run's: the server's kernels are N x N, so N is checked before
        anything is computed from a set.

        Args:
            saved: a checkpoint's strategy state.

        Returns:
            The particles and local particles (float32) and the rotation's position; the initial state for a
            checkpoint saved before round 1.

        Raises:
            ValueError: a saved set's shape is not this run's (N, P); the message names it.
        """
        if "particles" not in saved.tensors:
            return DSVGDState()
        expected = self.particle_layout["particles"]
        for name, value in saved.tensors.items():
            if (name == "particles" or name.startswith("local/")) and value.shape != expected:
                raise ValueError(f"saved state '{name}': particles of shape {value.shape}, this run's are {expected}")
        local_particles = {
            name.removeprefix("local/"): value.astype(np.float32)
            for name, value in saved.tensors.items()
            if name.startswith("local/")
        }
        return DSVGDState(
            saved.tensors["particles"].astype(np.float32), local_particles, saved.metadata["last_scheduled"]
        )


class PDSVGD(DSVGD):
    """P-DSVGD (App. A.5, Alg. 5): a `fraction-train` of the clients each round run both loops and upload their local
    particles; the server distils φ towards q = p_0 Π_k t_k."""

    reply_type = pb.PDSVGDReply
    variant = "p-dsvgd"
    parallel = True
    default_kde_bandwidth = 0.55  # [K] App. C, Table 3


class UDSVGD(DSVGD):
    """U-DSVGD (Sec. 5.1, Alg. 4): DSVGD without distillation; each agent keeps every visit (eq. 12's unconstrained
    update)."""

    variant = "u-dsvgd"
    default_kde_bandwidth = 0.55  # [K] App. C, Table 3


def turn_key(pool: NodePool, node: int) -> str:
    """A node's place in the rotation: its client id, or, for a node never accepted, a key after every id ('~' sorts
    after the characters a client id may hold).

    Args:
        pool: the round's node pool, which knows the nodes' client ids.
        node: a node id, >= 0.

    Returns:
        The key the rotation sorts by.
    """
    return pool.client_of(node) or f"~node-{node:020d}"


def log_spread(server_round: int, particles: np.ndarray) -> None:
    """An instability watch: particles running off show as growing norms (logged at INFO).

    Args:
        server_round: the round, for the log line.
        particles: the new particles, (N, P).
    """
    points = torch.from_numpy(particles).double()
    log(
        INFO,
        "round %d: particle norms max %.3g, mean distance to the particle mean %.3g",
        server_round,
        points.norm(dim=1).max().item(),
        (points - points.mean(0)).norm(dim=1).mean().item(),
    )
