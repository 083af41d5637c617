"""FedLap and FedLap-Cov (Swaroop et al., ICLR 2025; ../shared/specs/feddyn-fedlap-splits.md §1.7, §3).

Both keep, per client, a Gaussian site t̂_k ∝ exp(v_k·w − ½ w·diag(V_k) w) (v_k natural: precision times mean),
and the server's global q_g = N(w_g, diag(S_g)^-1) ∝ p_0 Π_k t̂_k with p_0 = N(0, I/δ):
  server:  S_g = δ + Σ_k V_k,   w_g = (Σ_k v_k) / S_g                                    [P Eq. 9, Eq. 21]
  client:  w_k ← argmin ℓ_k(w) + ½ (w − m_k)·P_k (w − m_k)   cavity P_k = S_g − V_k, m_k = (S_g w_g − v_k)/P_k
           S_k = H_k(w_k) − V_k + S_g;  v_k ← v_k + ρ_k (S_k w_k − S_g w_g);  V_k ← V_k + ρ_k (H_k − V_k)  [Eq. 21]
ℓ_k is the client's SUM loss; the client trains on the mean loss + ½ Σ (P_k/N_k)(w − m_k)² (§1.7, P1).
  FedLap:      H_k ≡ 0, so V_k = 0 and S_g = δ: the cavity term is (δ/N_k)/2 ‖w − (w_g − v_k/δ)‖² and the site step
               v_k += ρ_k δ (w_k − w_g) (v_k here is δ times [P]'s v_k). ρ_k = N_k/N ([P] App. E).
  FedLap-Cov:  H_k = the diagonal GGN of ℓ_k at the new w_k (bayes/curvature.py), ρ_k = 1/K ([P] App. E).
Fixed point of both: w* = argmin Σ_k ℓ_k + (δ/2)‖w‖² (§1.7). With Σ_k ρ_k = 1, FedLap's server step is the
average Σ_k ρ_k w_k.

Initialisation (§3.1, §9 P3, "consistent"): the prior stays centred at 0 and w_g starts at the model's initial
weights w_0: the clients of round 1 each start with v_k = S_g w_0 / K₁ (the instruction's `initial_share` = 1/K₁,
K₁ = the nodes round 1 goes to), so Σ_k v_k = δ w_0. The server keeps what no client has claimed (the share of a
round-1 client that never replied) as an unclaimed natural mean, so w_g = (unclaimed + Σ_k v_k)/S_g always.

State and messages: the client keeps (v_k, V_k) in its durable store and sends them after each round (FedLap:
v_k, P floats; FedLap-Cov: 2P); the server keeps the last reported site of every client that ever replied, so a
client that lost its state and starts again from a fresh site simply replaces its old one. Down: w_g (+ S_g).

Bounded influence (run config `robust-aggregation = "clip"`): the server builds q_g from every site tempered to
at most `clip-ratio` x the median norm of the known sites' natural parameters, t̂_k^f with f = clip_factors
(bayes/robust.py): a site with larger natural parameters than the others cannot pull q_g further than that.
The sites it keeps (and the clients hold) are the untempered ones. The screen measures a reply's update as the
change its new site alone would make to q_g, in mean and log precision (`site_change`).

Membership (strategies/base.py Membership): K and N count the clients the server has heard from. A client
joining after round 1 starts with a flat site (v_k = V_k = 0) and counts itself into K and N for its ρ_k; its
ρ_k then makes Σ_k ρ_k exceed 1 for that round, which only affects the transient. Partial participation
(`fraction-train` < 1): non-sampled clients keep their sites, as in PVI.

Forgetting a client (`forget`, ../shared/specs/forget.md): q_g ∝ p_0 Π_k t̂_k at every step, so the server drops
client k's site and rebuilds q_g from the others (`global_from_sites`); K and N (hence every ρ_j) stop counting k.
The unclaimed natural mean stays: it is what no client claimed of the init; the share k claimed is in its site and
goes with it. At the fixed point every site is its client's loss linearised at w* (v_j = V_j w* − ∇ℓ_j(w*), V_j =
diag H_j(w*) for FedLap-Cov, 0 for FedLap), so the result is one step w* − (δ + Σ_{j≠k} V_j)⁻¹ ∇F'(w*) on the remaining
MAP objective F' = Σ_{j≠k} ℓ_j + (δ/2)‖w − unclaimed/δ‖²: FedLap-Cov's is a Newton step with the diagonal curvature,
exact (the posterior without k) for a quadratic loss whose curvature is diagonal; FedLap's is a gradient step of size
1/δ, an estimate even for a quadratic loss. The remaining sites stay, so ordinary rounds among the remaining clients
refine it to the fixed point without k.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from fedbayes.bayes.curvature import diag_ggn
from fedbayes.bayes.gaussian import Gaussian, kl_divergence
from fedbayes.bayes.params import flatten, unflatten
from fedbayes.bayes.robust import part_clip_factors
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound
from fedbayes.client.state import ClientState
from fedbayes.client.training import train_anchored
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, PayloadError, TensorLayout
from fedbayes.strategies.base import (
    ForgetRefused, Forgotten, GlobalPosterior, Membership, RoundRejected, ServerState, Update, WireStrategy,
    client_population, local_training,
)
from fedbayes.strategies.feddyn import MAX_GRAD_NORM
from fedbayes.tasks.config import POSITIVE, Key, RunSettings

HYPERPARAMETERS = (
    Key("prior-precision", 1.0, "δ: the prior's precision (paper grid 1..1e-4)", POSITIVE),
    MAX_GRAD_NORM,
)


# ---- the math (float64 torch, flat vectors) ---------------------------------------------------------------
@dataclass
class Site:
    mean: torch.Tensor  # v_k, natural (precision times mean)
    precision: torch.Tensor  # V_k (zeros for FedLap)
    round: int = 0  # the round it was last updated in (0: never)


def cavity(global_mean: torch.Tensor, global_precision: torch.Tensor, site: Site, prior_precision: float):
    """(m_k, P_k): q_g / t̂_k. P_k = δ + Σ_{j≠k} V_j ≥ δ exactly; the clamp only absorbs float32 rounding of S_g."""
    precision = (global_precision - site.precision).clamp(min=prior_precision)
    return (global_precision * global_mean - site.mean) / precision, precision


def site_step(site: Site, local_mean: torch.Tensor, curvature: torch.Tensor, global_mean: torch.Tensor,
              global_precision: torch.Tensor, rho: float, server_round: int) -> Site:
    """[P] Eq. 21: S_k = H_k − V_k + S_g (old V_k); v_k += ρ(S_k w_k − S_g w_g); V_k += ρ(H_k − V_k)."""
    local_precision = curvature - site.precision + global_precision
    return Site(site.mean + rho * (local_precision * local_mean - global_precision * global_mean),
                site.precision + rho * (curvature - site.precision), server_round)


def global_from_sites(natural_sum: torch.Tensor, precision_sum: torch.Tensor, prior_precision: float):
    """q_g ∝ p_0 Π_k t̂_k: S_g = δ + Σ V_k, w_g = Σ v_k / S_g."""
    precision = prior_precision + precision_sum
    return natural_sum / precision, precision


def site_change(old: Site, new: Site, global_mean: torch.Tensor, global_precision: torch.Tensor) -> torch.Tensor:
    """(w_g' − w_g, log S_g' − log S_g) for q_g' = q_g · t̂_new / t̂_old: what replacing one site alone does to the
    global posterior. S_g' ≥ δ > 0, since S_g ≥ δ + V_old and V_new ≥ 0."""
    precision = global_precision + new.precision - old.precision
    mean = (global_precision * global_mean + new.mean - old.mean) / precision
    return torch.cat([mean - global_mean, precision.log() - global_precision.log()])


def tempered_sums(sites: list[Site], clip_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ f_k v_k, Σ f_k V_k) with f_k the smallest min(1, clip-ratio x median / norm) of v_k's and V_k's: each
    site t̂_k^f_k has natural parameters of at most clip-ratio x the median site's."""
    parts = [[site.mean.numpy() for site in sites], [site.precision.numpy() for site in sites]]
    factors = torch.from_numpy(part_clip_factors(parts, clip_ratio))
    return (sum(f * site.mean for f, site in zip(factors, sites)),
            sum(f * site.precision for f, site in zip(factors, sites)))


def client_damping(covariance: bool, num_examples: int, known_clients: int, known_examples: int) -> float:
    """ρ_k: 1/K for FedLap-Cov, N_k/N for FedLap ([P] App. E); 1/K while no sizes are known (round 1)."""
    if covariance or known_examples == 0:
        return 1.0 / known_clients
    return num_examples / known_examples


def as_sent(flat: torch.Tensor) -> torch.Tensor:
    return flat.to(torch.float32).double()


# ---- server half --------------------------------------------------------------------------------------
class FedLap(WireStrategy):
    reply_type = pb.FedLapReply
    robust_rules = ("none", "clip")

    def __init__(self, settings: RunSettings, layout: TensorLayout, covariance: bool = False) -> None:
        super().__init__(settings, layout)
        self.covariance = covariance
        self.delta = settings.prior_precision
        self.global_mean: torch.Tensor | None = None  # w_g and S_g as sent (float32-representable)
        self.global_precision: torch.Tensor | None = None
        self.unclaimed: torch.Tensor | None = None  # natural mean of the prior init no client holds
        self.initial_share = 0.0  # what this round's fresh clients start with (1/K₁ in round 1)
        self.sites: dict[str, Site] = {}
        self.membership = Membership()

    @property
    def precision_layout(self) -> TensorLayout:
        return self.layout if self.covariance else {}

    def instruction(self, server_round, arrays, nodes):
        if self.global_mean is None:
            self.global_mean = as_sent(torch.from_numpy(flatten({n: arrays[n].numpy() for n in self.layout},
                                                                self.layout)))
            self.global_precision = torch.full_like(self.global_mean, self.delta)
            self.unclaimed = self.global_precision * self.global_mean
        self.initial_share = 1.0 / len(nodes) if server_round == 1 and nodes else 0.0
        instruction = pb.FedLapInstruction(
            training=local_training(self.settings, server_round),
            prior_precision=self.delta,
            known_clients=self.membership.clients or len(nodes),
            known_examples=self.membership.total_examples,
            initial_share=self.initial_share,
            max_grad_norm=self.settings.max_grad_norm,
            covariance=self.covariance,
        )
        precision = unflatten(self.global_precision.numpy(), self.layout) if self.covariance else {}
        return instruction, {"global_mean": unflatten(self.global_mean.numpy(), self.layout),
                             "global_precision": precision}

    def reply_layouts(self):
        return {"site_mean": self.layout, "site_precision": self.precision_layout}

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        sites, unclaimed, membership = dict(self.sites), self.unclaimed, self.membership.copy()
        for payload in payloads:
            message = payload.message
            client = message.header.client_id
            if message.resumed_from_round == 0 and self.initial_share > 0.0:  # it took its share of the init
                unclaimed = unclaimed - self.initial_share * self.global_precision * self.global_mean
            sites[client] = self._site(payload, server_round)
            membership.record(client, message.num_examples, server_round)
        mean, precision = self._global(sites, unclaimed)
        if not (torch.isfinite(mean).all() and torch.isfinite(precision).all()):
            raise RoundRejected("the global mean would be non-finite")
        state = {"sites": sites, "unclaimed": unclaimed, "membership": membership, "global_mean": mean,
                 "global_precision": precision}
        return Update(mean.numpy(), state, {"known-clients": membership.clients})

    def forget(self, client: str) -> Forgotten:
        """forget.md: drop client k's site and rebuild q_g ∝ p_0 Π_{j≠k} t̂_j (with the unclaimed natural mean);
        K and N no longer count k. What that is: the module docstring."""
        self.check_forgettable(client, self.sites)
        sites = {c: site for c, site in self.sites.items() if c != client}
        mean, precision = self._global(sites, self.unclaimed)
        if not (torch.isfinite(mean).all() and torch.isfinite(precision).all()):
            raise ForgetRefused(f"without client {client!r} the global mean would be non-finite")
        kl = kl_divergence(Gaussian(self.global_mean, self.global_precision), Gaussian(mean, precision))
        what = ("a Newton step with the diagonal GGN, exact for a quadratic loss with diagonal curvature"
                if self.covariance else "sites without precision: a gradient step of size 1/δ on the remaining MAP")
        note = (f"q_g from the prior and the {len(sites)} remaining sites ({what}); refinement rounds move it to the "
                f"fixed point without {client!r}")
        state = {"sites": sites, "membership": self.membership.without(client), "global_mean": mean,
                 "global_precision": precision, **self.core_state_without(client)}
        # exact only for a quadratic loss (FedLap-Cov), which no client here trains
        return Forgotten(mean.numpy(), state, exact=False, kl_before_after=kl, note=note)

    def _global(self, sites: dict[str, Site], unclaimed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(w_g, S_g) from the prior, the unclaimed natural mean and `sites` (tempered under `clip`), as sent."""
        if self.settings.robust_aggregation == "clip":
            site_means, site_precisions = tempered_sums(list(sites.values()), self.settings.clip_ratio)
        else:
            site_means = torch.stack([site.mean for site in sites.values()]).sum(0)
            site_precisions = torch.stack([site.precision for site in sites.values()]).sum(0)
        mean, precision = global_from_sites(unclaimed + site_means, site_precisions, self.delta)
        return as_sent(mean), as_sent(precision)  # checked as stored: float32 can overflow

    def _site(self, payload: Payload, server_round: int) -> Site:
        mean = torch.from_numpy(flatten(payload.tensors["site_mean"], self.layout))
        if not self.covariance:
            return Site(mean, torch.zeros_like(mean), server_round)
        return Site(mean, torch.from_numpy(flatten(payload.tensors["site_precision"], self.layout)), server_round)

    def update_of(self, payload: Payload) -> np.ndarray:
        """`site_change` from the client's last accepted site (or a fresh one) to the one it reports."""
        message = payload.message
        site = self._site(payload, message.header.server_round)
        previous = self.sites.get(message.header.client_id) if message.resumed_from_round else None
        if previous is None:
            previous = Site(self.initial_share * self.global_precision * self.global_mean, torch.zeros_like(site.mean))
        return site_change(previous, site, self.global_mean, self.global_precision).numpy()

    def state_norm(self) -> float:
        return torch.cat([self.global_mean, self.global_precision.log()]).norm().item()

    def check_reply(self, payload: Payload) -> None:
        """A site precision V_k is a convex combination of PSD curvatures: it must be >= 0. The site must follow
        from the client's last accepted one (or start afresh: a new client, or one that lost its state)."""
        if self.covariance and (self._site(payload, 0).precision < 0).any():
            raise PayloadError("field 'site_precision': has negative values; a site precision V_k must be >= 0")
        self.check_resumed(payload, "its new site replaces the old one")

    def state_dict(self) -> ServerState:
        state = super().state_dict()
        if self.global_mean is not None:
            state.tensors |= {"global_mean": self.global_mean.numpy(), "global_precision": self.global_precision.numpy(),
                              "unclaimed": self.unclaimed.numpy()}
            state.add_per_client("site", self.sites)
            state.metadata |= self.membership.to_metadata()
        return state

    def load_state_dict(self, state: ServerState) -> None:
        super().load_state_dict(state)
        if "global_mean" not in state.tensors:
            return
        tensors = {name: torch.from_numpy(value.copy()) for name, value in state.tensors.items()}
        self.global_mean, self.global_precision = tensors["global_mean"], tensors["global_precision"]
        self.unclaimed = tensors["unclaimed"]
        self.sites = state.per_client("site", Site)
        self.membership = Membership.from_metadata(state.metadata)

    def global_posterior(self) -> GlobalPosterior:
        if self.global_mean is None:
            return super().global_posterior()
        precision = "δ + Σ_k V_k" if self.covariance else "δ (FedLap's sites carry no precision)"
        return GlobalPosterior(f"q_g = N(w_g, diag(S_g)⁻¹) with S_g = {precision}",
                               Gaussian(self.global_mean, self.global_precision))


def fedlap_cov(settings: RunSettings, layout: TensorLayout) -> FedLap:
    return FedLap(settings, layout, covariance=True)


# ---- client half ----------------------------------------------------------------------------------
def instruction_layouts(instruction: pb.FedLapInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    return {"global_mean": layout, "global_precision": layout if instruction.covariance else {}}


def local_update(local: LocalRound) -> LocalResult:
    """Train on the cavity-regularised loss from w_g, compute H_k (Cov), take the site step, reply."""
    instruction, runtime = local.instruction, local.runtime
    covariance, delta = instruction.covariance, instruction.prior_precision
    global_mean = torch.from_numpy(flatten(local.tensors["global_mean"], runtime.layout))
    global_precision = (torch.from_numpy(flatten(local.tensors["global_precision"], runtime.layout)) if covariance
                        else torch.full_like(global_mean, delta))
    site = _stored_site(local.stored, global_mean, global_precision, instruction.initial_share)
    known_clients, known_examples = client_population(
        instruction.known_clients, instruction.known_examples, local.num_examples, fresh=local.stored is None
    )
    anchor, precision = cavity(global_mean, global_precision, site, delta)
    weights, train_loss, seconds = train_anchored(
        runtime, instruction.training, start=global_mean, anchor=anchor, weight=precision / local.num_examples,
        server_round=local.server_round, max_grad_norm=instruction.max_grad_norm,
    )
    curvature, curvature_seconds = torch.zeros_like(weights), 0.0
    if covariance:  # H_k at the new w_k, which train_anchored left in the model
        started = time.perf_counter()
        curvature = diag_ggn(runtime.model.to(runtime.device), runtime.data.images.to(runtime.device))
        runtime.model.cpu()
        curvature_seconds = time.perf_counter() - started
    rho = client_damping(covariance, local.num_examples, known_clients, known_examples)
    site = site_step(site, weights, curvature, global_mean, global_precision, rho, local.server_round)
    reply = pb.FedLapReply(train_loss=train_loss, compute_seconds=seconds + curvature_seconds,
                           curvature_seconds=curvature_seconds)
    precision_wire = unflatten(site.precision.numpy(), runtime.layout) if covariance else {}
    return LocalResult(reply, {"site_mean": unflatten(site.mean.numpy(), runtime.layout),
                               "site_precision": precision_wire},
                       {"site_mean": site.mean, "site_precision": site.precision})


client_update = ClientHalf(pb.FedLapInstruction, local_update, instruction_layouts, stateful=True)


def _stored_site(stored: ClientState | None, global_mean: torch.Tensor, global_precision: torch.Tensor,
                 initial_share: float) -> Site:
    """This client's site from its store; a fresh one holds `initial_share` of the global natural mean."""
    if stored is None:
        return Site(initial_share * global_precision * global_mean, torch.zeros_like(global_mean), 0)
    site = Site(stored.tensors["site_mean"].double(), stored.tensors["site_precision"].double(), stored.round)
    if site.mean.shape != global_mean.shape:
        raise ValueError(f"stored site has {site.mean.numel()} values, this run's model has {global_mean.numel()}")
    return site
