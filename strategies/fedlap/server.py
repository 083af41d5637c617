"""FedLap's and FedLap-Cov's server half: the prior and every client's site make the global q_g."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedbayes.bayes.gaussian import Gaussian, kl_divergence
from fedbayes.bayes.params import TensorLayout, flatten, unflatten
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, PayloadError
from fedbayes.strategies.base import (
    ForgetRefused,
    Forgotten,
    GlobalPosterior,
    RoundRejected,
    ServerState,
    ServerStrategy,
    TensorGroups,
    Update,
    local_training,
)
from fedbayes.strategies.fedlap.math import (
    Site,
    as_sent,
    client_damping,
    global_from_sites,
    site_change,
    tempered_sums,
)
from fedbayes.strategies.fedlap.settings import FedLapSettings
from fedbayes.strategies.membership import Membership, client_population


@dataclass(frozen=True)
class FedLapState:
    """q_g = N(w_g, diag(S_g)^-1) as sent (float32-representable; None until round 1 sets it from the initial model),
    the natural mean of the prior's init that no client holds, every client's last reported site, and the clients
    counted in K and N."""

    global_mean: torch.Tensor | None = None
    global_precision: torch.Tensor | None = None
    unclaimed: torch.Tensor | None = None
    sites: dict[str, Site] = field(default_factory=dict)
    membership: Membership = field(default_factory=Membership)


class FedLap(ServerStrategy[FedLapState]):
    """FedLap: sites without precision, so S_g = δ; FedLapCov adds the diagonal GGN curvature (the package
    docstring)."""

    reply_type = pb.FedLapReply
    robust_rules = ("none", "clip")
    fresh_start = "its new site replaces the old one"
    covariance: ClassVar[bool] = False
    hyperparameters: FedLapSettings
    initial_share = 0.0  # what this round's fresh clients start with (1/K₁ in round 1), set by `instruction`

    def initial_state(self) -> FedLapState:
        """The state before round 1.

        Returns:
            No q_g yet (round 1's instruction sets it from the initial model and the prior), no sites, no known clients.
        """
        return FedLapState()

    @property
    def delta(self) -> float:
        return self.hyperparameters.prior_precision

    @property
    def global_mean(self) -> torch.Tensor:
        assert self.state.global_mean is not None, "q_g is set in round 1's instruction"
        return self.state.global_mean

    @property
    def global_precision(self) -> torch.Tensor:
        assert self.state.global_precision is not None, "q_g is set in round 1's instruction"
        return self.state.global_precision

    @property
    def unclaimed(self) -> torch.Tensor:
        assert self.state.unclaimed is not None, "set with q_g in round 1's instruction"
        return self.state.unclaimed

    @property
    def precision_layout(self) -> TensorLayout:
        return self.layout if self.covariance else {}

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedLapInstruction, TensorGroups]:
        """This round's instruction: the cavity-regularised local solve from q_g. Round 1's also sets q_g = N(w_0, δ⁻¹
        I)
        from `arrays`, and the clients fresh in round 1 each take 1/K₁ of its natural mean.

        Args:
            server_round: the round, >= 1; it sets the learning rate.
            arrays: the global arrays the core holds; only round 1 reads them (the parameters of `layout`).
            nodes: the nodes the round is sent to; their count stands in for K while no client is known yet, and
                sets round 1's initial share.

        Returns:
            The instruction (local training, δ, K and N, the initial share, the gradient-norm clip, whether sites carry
            a precision, the site damping and its rule) and its tensor groups: "global_mean", w_g, and
            "global_precision", S_g (FedLap-Cov only; empty for FedLap).
        """
        if self.state.global_mean is None:
            mean = as_sent(torch.from_numpy(flatten({n: arrays[n].numpy() for n in self.layout}, self.layout)))
            precision = torch.full_like(mean, self.delta)
            self.state = replace(self.state, global_mean=mean, global_precision=precision, unclaimed=precision * mean)
        self.initial_share = 1.0 / len(nodes) if server_round == 1 and nodes else 0.0
        membership = self.state.membership
        instruction = pb.FedLapInstruction(
            training=local_training(self.settings.training, server_round),
            prior_precision=self.delta,
            known_clients=membership.clients or len(nodes),
            known_examples=membership.total_examples,
            initial_share=self.initial_share,
            max_grad_norm=self.hyperparameters.max_grad_norm,
            covariance=self.covariance,
            site_damping=self.hyperparameters.site_damping,
            curvature_damping=self.hyperparameters.site_damping_rule == "curvature",
        )
        precisions = unflatten(self.global_precision.numpy(), self.layout) if self.covariance else {}
        return instruction, {
            "global_mean": unflatten(self.global_mean.numpy(), self.layout),
            "global_precision": precisions,
        }

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layouts of a reply's tensors.

        Returns:
            "site_mean": the site's natural mean, in `layout`; "site_precision": V_k in `layout` (FedLap-Cov), empty
            for FedLap.
        """
        return {"site_mean": self.layout, "site_precision": self.precision_layout}

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[FedLapState]:
        """q_g from the prior and every client's latest site, the round's replies' sites replacing their clients' last,
        without changing the strategy.

        Args:
            payloads: the accepted replies, in client-id order, checked by check_reply.
            server_round: the round, recorded as each replying client's last.

        Returns:
            The new w_g (as sent), the state with q_g, the sites and membership, and the metric "known-clients" (K).

        Raises:
            RoundRejected: q_g's mean or precision would be non-finite.
        """
        sites, unclaimed, membership = dict(self.state.sites), self.unclaimed, self.state.membership.copy()
        for payload in payloads:
            client = payload.header.client_id
            if payload.reply.resumed_from_round == 0 and self.initial_share > 0.0:  # it took its share of the init
                unclaimed = unclaimed - self.initial_share * self.global_precision * self.global_mean
            sites[client] = self._site(payload, server_round)
            membership.record(client, payload.reply.num_examples, server_round)
        mean, precision = self._global(sites, unclaimed)
        if not (torch.isfinite(mean).all() and torch.isfinite(precision).all()):
            raise RoundRejected("the global mean would be non-finite")
        return Update(
            mean.numpy(),
            FedLapState(mean, precision, unclaimed, sites, membership),
            {"known-clients": membership.clients},
        )

    def forget(self, client: str) -> Forgotten[FedLapState]:
        """Drop client k's site and rebuild q_g ∝ p_0 Π_{j≠k} t̂_j (with the unclaimed natural mean); K and N no longer
        count k. What that is: the package docstring.

        Args:
            client: the client id to forget.

        Returns:
            The new w_g and state, not exact (refinement rounds move it to the fixed point), KL(q_before ‖ q_after) and
            a note on what was done.

        Raises:
            ForgetRefused: the client is unknown or the last one (check_forgettable), or q_g would be non-finite.
        """
        self.check_forgettable(client, self.state.sites)
        sites = {c: site for c, site in self.state.sites.items() if c != client}
        mean, precision = self._global(sites, self.unclaimed)
        if not (torch.isfinite(mean).all() and torch.isfinite(precision).all()):
            raise ForgetRefused(f"without client {client!r} the global mean would be non-finite")
        kl = kl_divergence(Gaussian(self.global_mean, self.global_precision), Gaussian(mean, precision))
        what = (
            "a Newton step with the diagonal GGN, exact for a quadratic loss with diagonal curvature"
            if self.covariance
            else "sites without precision: a gradient step of size 1/δ on the remaining MAP"
        )
        note = (
            f"q_g from the prior and the {len(sites)} remaining sites ({what}); refinement rounds move it to the "
            f"fixed point without {client!r}"
        )
        state = FedLapState(mean, precision, self.state.unclaimed, sites, self.state.membership.without(client))
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
        """`site_change` from the client's last accepted site (or a fresh one) to the one it reports.

        Args:
            payload: an accepted reply.

        Returns:
            What replacing its site alone does to q_g: w_g' − w_g followed by log S_g' − log S_g, float64 (2P,).
        """
        site = self._site(payload, payload.header.server_round)
        previous = self.state.sites.get(payload.header.client_id) if payload.reply.resumed_from_round else None
        if previous is None:
            previous = Site(self.initial_share * self.global_precision * self.global_mean, torch.zeros_like(site.mean))
        return site_change(previous, site, self.global_mean, self.global_precision).numpy()

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`.

        Returns:
            ‖(w_g, log S_g)‖.
        """
        return torch.cat([self.global_mean, self.global_precision.log()]).norm().item()

    def update_scale(self, payload: Payload) -> float:
        """ρ_k N_k: the site step moves the site by ρ_k of the client's local posterior over the cavity, whose natural
        parameters are sums over its N_k examples (ρ_k = N_k/N for FedLap, 1/K for FedLap-Cov, as its client computes it
        from the server's counts).

        Args:
            payload: an accepted reply; its num_examples and whether it resumed decide ρ_k.

        Returns:
            ρ_k N_k, > 0.
        """
        examples = payload.reply.num_examples
        membership = self.state.membership
        known_clients, known_examples = client_population(
            membership.clients, membership.total_examples, examples, fresh=not payload.reply.resumed_from_round
        )
        rho = client_damping(
            self.covariance, examples, known_clients, known_examples, self.hyperparameters.site_damping
        )
        return rho * examples

    def check_reply(self, payload: Payload) -> None:
        """A site precision V_k is a convex combination of PSD curvatures: it must be >= 0.

        Args:
            payload: a reply the core has checked.

        Raises:
            PayloadError: FedLap-Cov's site precision has a negative value.
        """
        if self.covariance and (self._site(payload, 0).precision < 0).any():
            raise PayloadError("field 'site_precision': has negative values; a site precision V_k must be >= 0")

    def save_state(self, state: FedLapState) -> ServerState:
        """`state` as a checkpoint holds it.

        Args:
            state: a FedLap state.

        Returns:
            w_g, S_g and the unclaimed natural mean, every site with its round ("site"), and the membership as
            metadata; nothing before round 1.
        """
        saved = ServerState()
        if state.global_mean is not None:
            assert state.global_precision is not None and state.unclaimed is not None  # set with global_mean
            saved.tensors |= {
                "global_mean": state.global_mean.numpy(),
                "global_precision": state.global_precision.numpy(),
                "unclaimed": state.unclaimed.numpy(),
            }
            saved.add_per_client("site", state.sites)
            saved.metadata |= state.membership.to_metadata()
        return saved

    def load_state(self, saved: ServerState) -> FedLapState:
        """The state `save_state` saved.

        Args:
            saved: a checkpoint's strategy state.

        Returns:
            q_g, the unclaimed natural mean, the sites and the membership; the initial state for a checkpoint saved
            before round 1.
        """
        if "global_mean" not in saved.tensors:
            return FedLapState()
        tensors = {name: torch.from_numpy(value.copy()) for name, value in saved.tensors.items()}
        return FedLapState(
            tensors["global_mean"],
            tensors["global_precision"],
            tensors["unclaimed"],
            saved.per_client("site", Site),
            Membership.from_metadata(saved.metadata),
        )

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the global posterior (`fedbayes export`).

        Returns:
            q_g = N(w_g, diag(S_g)⁻¹) as a Gaussian over the flat parameters; before round 1, a point estimate.
        """
        if self.state.global_mean is None:
            return super().global_posterior()
        precision = "δ + Σ_k V_k" if self.covariance else "δ (FedLap's sites carry no precision)"
        return GlobalPosterior(
            f"q_g = N(w_g, diag(S_g)⁻¹) with S_g = {precision}", Gaussian(self.global_mean, self.global_precision)
        )


class FedLapCov(FedLap):
    """FedLap-Cov: each site carries a precision V_k, the diagonal GGN of the client's loss, and S_g travels."""

    covariance = True
