"""BayesADMM's server half: q̄ and every known client's duals, the replay check of each reply's duals, Eqs. 37-38; the
federated ADMM (isotropic) and full-covariance families as subclasses."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedbayes.bayes.gaussian import Gaussian, kl_divergence, solve
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
from fedbayes.strategies.bayesadmm.math import (
    DUAL_CHECK_RTOL,
    Duals,
    LocalPosterior,
    added_precision_share,
    as_sent,
    bounded_influence,
    collapse_warning,
    dual_step,
    fixed_point_natural,
    fixed_point_residual,
    mean_log_precision,
    precision_from_wire,
    precision_layout,
    precision_summary,
    precision_to_wire,
    prior_weight,
    replay_tolerance,
    reply_effect,
    server_natural,
    server_natural_without,
    shares_step,
    tempered_duals,
    unit_precision,
    without_share,
)
from fedbayes.strategies.bayesadmm.settings import BayesADMMSettings
from fedbayes.tasks.config import ConfigError, RunSettings

MAX_FULL_PARAMETERS = 2048  # a full precision is P x P float32 on the wire: 16 MiB per matrix at the cap
# `forget` prefers the fixed-point formula where q̄ is within this (relative) distance of its duals' fixed point: there
# the formula is off by about that much (exact at it), while the redone server step leaves 1 - α' of the client's
# site in q̄ even at the fixed point (the package docstring)
FIXED_POINT_TOLERANCE = 1e-2


@dataclass(frozen=True)
class BayesADMMState:
    """q̄ as the clients receive it (None until round 1 sets it from the initial model), every known client's duals
    after its last accepted round, its local posterior of that round as the server step used it (with the round; what
    `forget` redoes the last server step with) and its share of q̄ (`shares_step`: what `forget` subtracts; none for
    the isotropic family): they triple the per-client state. A checkpoint from before the local posteriors or the
    shares were kept has none: its clients' local posteriors come with their next replies, their shares not at all."""

    global_: Gaussian | None = None
    duals: dict[str, Duals] = field(default_factory=dict)
    local_posteriors: dict[str, LocalPosterior] = field(default_factory=dict)
    shares: dict[str, Duals] = field(default_factory=dict)


@dataclass(frozen=True)
class ForgetEstimate:
    """One way `forget` rebuilds q̄ without a client: its name (for a refusal), what it is (for the note), and its
    natural parameters (S̄' m̄', S̄'), or why it has none."""

    name: str
    what: str = ""
    natural: tuple[torch.Tensor, torch.Tensor] | None = None
    missing: str = ""  # why `natural` is None
    why_invalid: str = ""  # what a result that is no posterior says about this estimate's inputs


class BayesADMM(ServerStrategy[BayesADMMState]):
    """BayesADMM over the network with diagonal Gaussians (Alg. 1, IVON clients); FedADMM and BayesADMMFull are
    its other families (the package docstring)."""

    reply_type = pb.BayesADMMReply
    robust_rules = ("none", "clip")
    fresh_start = "it starts again from zero duals"
    family: ClassVar[str] = "diagonal"
    hyperparameters: BayesADMMSettings

    def __init__(self, settings: RunSettings, layout: TensorLayout, buffer_layout: TensorLayout | None = None) -> None:
        super().__init__(settings, layout, buffer_layout)
        self.isotropic = self.family == "isotropic"
        self.size = sum(math.prod(shape) for shape in layout.values())

    def initial_state(self) -> BayesADMMState:
        """The state before round 1.

        Returns:
            No q̄ yet (round 1's instruction sets it from the initial model), no duals, local posteriors or shares.
        """
        return BayesADMMState()

    @property
    def dual_step_size(self) -> float:
        # γ = damping·ρ as in the reference code; federated ADMM's dual step is ρ itself (Eq. 22).
        rho = self.hyperparameters.rho
        return rho if self.isotropic else self.hyperparameters.dual_damping * rho

    @property
    def global_(self) -> Gaussian:
        """q̄ (once round 1 has set it)."""
        assert self.state.global_ is not None, "q̄ is set in round 1's instruction"
        return self.state.global_

    def _initial_global(self, arrays: ArrayRecord) -> Gaussian:
        """q̄ at the start: the model's initial weights as mean (m̄ = 0 would make the MLP's hidden units identical),
        precision δ (Alg. 1 init), or 1 for the fixed-covariance family."""
        mean = torch.from_numpy(flatten({n: arrays[n].numpy() for n in self.layout}, self.layout))
        delta = self.hyperparameters.prior_precision
        if self.isotropic:
            return Gaussian(mean, unit_precision())
        if self.family == "full":
            return as_sent(Gaussian(mean, delta * torch.eye(self.size, dtype=torch.float64)))
        return as_sent(Gaussian(mean, torch.full_like(mean, delta)))

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.BayesADMMInstruction, TensorGroups]:
        """This round's instruction: the clients' local posterior updates against q̄ (Alg. 1). Round 1's also sets q̄:
        the
        model's initial weights as mean, precision δ (the fixed-covariance family: 1).

        Args:
            server_round: the round, >= 1; it sets the learning rate.
            arrays: the global arrays the core holds; only round 1 reads them (the parameters of `layout`).
            nodes: the nodes the round is sent to; every one gets the same instruction.

        Returns:
            The instruction (local training, family, ρ, the dual step γ, temperature, IVON's settings, the noise seed)
            and its tensor groups: "global_mean", m̄, and "global_precision", S̄ as its family travels
            (precision_layout: none, per parameter, or one P x P matrix), float32.
        """
        if self.state.global_ is None:
            self.state = replace(self.state, global_=self._initial_global(arrays))
        hp = self.hyperparameters
        instruction = pb.BayesADMMInstruction(
            training=local_training(self.settings.training, server_round),
            family=self.family,
            rho=hp.rho,
            dual_step=self.dual_step_size,
            temperature=hp.temperature,
            hess_init=hp.hess_init,
            beta1=hp.beta1,
            beta2=hp.beta2,
            mc_samples=hp.mc_samples,
            rescale_lr=hp.rescale_lr,
            reset_posterior=hp.reset_posterior,
            shared_noise=hp.noise == "shared",
            noise_seed=self.settings.seed,
        )
        tensors = {
            "global_mean": unflatten(self.global_.mean.numpy(), self.layout),
            "global_precision": precision_to_wire(self.global_.precision, self.family, self.layout),
        }
        return instruction, tensors

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layouts of a reply's tensors.

        Returns:
            "local_mean" and "dual_mean": `layout`; "local_precision" and "dual_precision": the family's precision
            layout (precision_layout).
        """
        precision_wire = precision_layout(self.family, self.layout)
        return {
            "local_mean": self.layout,
            "local_precision": precision_wire,
            "dual_mean": self.layout,
            "dual_precision": precision_wire,
        }

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[BayesADMMState]:
        """The server step (Eqs. 37-38) from the round's accepted replies and every known client's duals, without
        changing
        the strategy; under `clip` with the local posteriors' and duals' influence bounded.

        Args:
            payloads: the accepted replies, in client-id order, checked by check_reply.
            server_round: the round, recorded with each replying client's duals, local posterior and share.

        Returns:
            The new m̄ (as sent), the state (q̄, duals, the local posteriors the step used, the shares), the metrics
            "known-clients", the precision's summary and, but for the fixed-covariance family,
            "client-precision-share", and a warning where the precision collapses onto the clients'.

        Raises:
            RoundRejected: the new q̄ would be non-finite, or its precision not positive (definite).
        """
        locals_ = [self._local_posterior(payload) for payload in payloads]
        duals = self.state.duals | {p.header.client_id: self._reported_duals(p, server_round) for p in payloads}
        used_locals, used_duals = locals_, list(duals.values())
        if self.settings.robust_aggregation == "clip":
            used_locals, used_duals = bounded_influence(locals_, used_duals, self.global_, self.settings.clip_ratio)
        eta, precision = server_natural(
            used_locals, used_duals, self.hyperparameters.rho, self.hyperparameters.prior_precision
        )
        problem = self._precision_problem(precision)  # before the solve: a singular S̄ must not raise there
        if problem:
            raise RoundRejected(problem)
        updated = as_sent(Gaussian(solve(precision, eta), unit_precision() if self.isotropic else precision))
        problem = self._global_problem(updated)
        if problem:
            raise RoundRejected(problem)
        # kept as the step used them (after `clip` moved them): `forget` redoes this step without a client
        held_locals = self.state.local_posteriors | {
            p.header.client_id: LocalPosterior.held(q, server_round) for p, q in zip(payloads, used_locals)
        }
        shares = self.state.shares
        if not self.isotropic and (shares or not self.state.duals):  # from the first round on, or never: see load_state
            shares = shares_step(
                shares,
                {p.header.client_id: q for p, q in zip(payloads, used_locals)},
                dict(zip(duals, used_duals)),
                self.global_,
                self.hyperparameters.rho,
                server_round,
            )
        metrics: dict[str, float] = {"known-clients": len(duals), **precision_summary(updated)}
        warning = ""
        if not self.isotropic:  # its precision is fixed
            share = added_precision_share(used_locals, self.global_)
            metrics["client-precision-share"] = share
            warning = collapse_warning(share, self.hyperparameters.rho, len(duals), self.global_, updated)
        return Update(updated.mean.numpy(), BayesADMMState(updated, duals, held_locals, shares), metrics, warning)

    def forget(self, client: str) -> Forgotten[BayesADMMState]:
        """q̄ without client k, from the server's state alone, by one of three estimates (the package docstring):
        q̄ less the client's share first (not for the isotropic family); then the fixed-point formula on the
        remaining duals, S̄' = δI + Σ_{j≠k} U_j, m̄' = S̄'⁻¹ Σ_{j≠k} v_j, first where q̄ is within
        FIXED_POINT_TOLERANCE of its duals' fixed point; else the last server step redone without k
        (`server_natural_without`). The first that makes a posterior (finite, positive precision) is taken. The
        remaining
        duals and local posteriors stay, so the next ordinary round goes on from them.

        Args:
            client: the client id to forget.

        Returns:
            The new m̄ and state without the client, not exact, KL(q̄ ‖ q̄') (None for the isotropic family), and a
            note saying which estimate was taken and why the others were not.

        Raises:
            ForgetRefused: the client is unknown or the last one (check_forgettable), or no estimate makes a posterior
                (the message names why each failed).
        """
        self.check_forgettable(client, self.state.duals)
        residual = fixed_point_residual(
            self.global_, self._summed_duals(self.state.duals), self.hyperparameters.prior_precision
        )
        estimates = [self._at_fixed_point(client), self._redone_step(client)]
        if residual > FIXED_POINT_TOLERANCE:
            estimates.reverse()
        if not self.isotropic:
            estimates.insert(0, self._without_share(client))
        failures: list[str] = []
        for estimate in estimates:
            forgotten, failure = self._posterior_of(estimate)
            if forgotten is not None:
                return self._forgotten(client, estimate, forgotten, residual, failures)
            failures.append(f"{estimate.name}: {failure}")
        raise ForgetRefused(
            f"without client {client!r} no estimate makes a posterior (q̄ is {residual:.2g} from its duals' fixed "
            f"point): {'; '.join(failures)}; run more rounds first, or retrain"
        )

    def _at_fixed_point(self, client: str) -> ForgetEstimate:
        """Eqs. 37-38 at the fixed point over the remaining duals (`fixed_point_natural`), tempered as the server step
        tempers them under `clip`."""
        duals = self._summed_duals({c: d for c, d in self.state.duals.items() if c != client})
        what = {
            "full": "exact for a quadratic loss, one Newton step on the remaining data for cross-entropy",
            "diagonal": "the sites of IVON's approximate fixed point: an estimate",
            "isotropic": "θ̄' = Σ v_j/δ, one gradient step of size 1/δ on the remaining objective",
        }[self.family]
        natural = fixed_point_natural(duals, self.hyperparameters.prior_precision, self.global_.precision)
        return ForgetEstimate(
            "the fixed point of the remaining duals",
            f"q̄ from the {len(duals)} remaining clients' duals at the fixed point ({what})",
            natural,
            why_invalid="the remaining duals are not yet sites",
        )

    def _without_share(self, client: str) -> ForgetEstimate:
        """q̄ less the client's share (`without_share`); for the diagonal family floored at the prior's precision."""
        name = "q̄ less its share"
        share = self.state.shares.get(client)
        if share is None:
            return ForgetEstimate(
                name,
                missing="the server holds no shares (kept from a federation's first round on, and this one's "
                "checkpoint started before they were)",
            )
        floor = self.hyperparameters.prior_precision if self.family == "diagonal" else None
        eta, precision, kept = without_share(self.global_, share, floor)
        floored = (
            f"; in {kept} of {precision.numel()} parameters q̄ kept its own, as less than δ would remain" if kept else ""
        )
        return ForgetEstimate(
            name,
            f"q̄ less {client!r}'s share of it: what its duals and local posteriors added in every server step since "
            f"round 1 (Eqs. 37-38 are linear in them), taken out{floored}; an estimate: the remaining clients were "
            f"fitted against a q̄ that held {client!r}",
            (eta, precision),
        )

    def _redone_step(self, client: str) -> ForgetEstimate:
        """The last server step redone without k (`server_natural_without`), where a remaining client's local
        posterior is held."""
        name = "the last server step without it"
        hp = self.hyperparameters
        clip_ratio = self.settings.clip_ratio if self.settings.robust_aggregation == "clip" else None
        redone = server_natural_without(
            client, self.state.local_posteriors, self.state.duals, hp.rho, hp.prior_precision, clip_ratio
        )
        if redone is None:
            return ForgetEstimate(
                name,
                missing="no remaining client's local posterior is held (a checkpoint from before the server kept "
                f"them, and since then only {client!r} replied)",
            )
        remaining = len(self.state.duals) - 1
        return ForgetEstimate(
            name,
            f"round {redone.round}'s server step (Eqs. 37-38) redone without {client!r}: the mean of its "
            f"{redone.repliers} remaining local posteriors with the prior and the {remaining} remaining clients' "
            f"duals, α = 1/(1 + ρ·{remaining}); an estimate: those local posteriors were fitted against a q̄ that "
            f"held {client!r}",
            (redone.eta, redone.precision),
        )

    def _posterior_of(self, estimate: ForgetEstimate) -> tuple[Gaussian | None, str]:
        """The estimate's q̄ as sent, or None and why it cannot be the global posterior (non-finite, no positive
        precision), checked as in absorb."""
        if estimate.natural is None:
            return None, estimate.missing
        eta, precision = estimate.natural
        problem = self._precision_problem(precision)  # before the solve: a singular S̄ must not raise there
        if problem is None:
            posterior = self._solved(eta, precision)
            problem = self._global_problem(posterior)
            if problem is None:
                return posterior, ""
        return None, ": ".join(filter(None, [problem.split(";")[0], estimate.why_invalid]))

    def _solved(self, eta: torch.Tensor, precision: torch.Tensor) -> Gaussian:
        """q̄ from natural parameters, as sent (the fixed-covariance family keeps its unit precision), as absorb."""
        return as_sent(Gaussian(solve(precision, eta), unit_precision() if self.isotropic else precision))

    def _forgotten(
        self, client: str, estimate: ForgetEstimate, forgotten: Gaussian, residual: float, failures: list[str]
    ) -> Forgotten[BayesADMMState]:
        state = BayesADMMState(
            forgotten,
            {c: d for c, d in self.state.duals.items() if c != client},
            {c: q for c, q in self.state.local_posteriors.items() if c != client},
            {c: q for c, q in self.state.shares.items() if c != client},
        )
        kl = None if self.isotropic else kl_divergence(self.global_, forgotten)
        instead = f" (not {'; '.join(failures)})" if failures else ""
        note = (
            f"{estimate.what}{instead}; q̄ was {residual:.2g} from its duals' fixed point (the fixed-point formula "
            f"comes before the redone step within {FIXED_POINT_TOLERANCE:g}); refinement rounds move it to the fixed "
            f"point without {client!r}"
        )
        # exact only for a quadratic loss at the fixed point, which no client here trains (the full family's is
        # cross-entropy)
        return Forgotten(forgotten.mean.numpy(), state, exact=False, kl_before_after=kl, note=note)

    def _summed_duals(self, duals: dict[str, Duals]) -> list[Duals]:
        """The duals as the server step sums them: tempered under the `clip` rule."""
        if self.settings.robust_aggregation == "clip":
            return tempered_duals(list(duals.values()), self.settings.clip_ratio)
        return list(duals.values())

    def update_of(self, payload: Payload) -> np.ndarray:
        """`reply_effect`: what the server step would do to q̄ with this reply alone, in q̄'s mean and log precision
        (the diagonal's, for the full family; none for the fixed-covariance one), with the weight 1 − α that Eq. 37
        gives the local posteriors among the known clients (this one counted if new). check_reply has made sure S_k
        is positive.

        Args:
            payload: an accepted reply.

        Returns:
            The change in (m̄, log diag S̄), float64 (2P,); (P,) for the fixed-covariance family.
        """
        clients = len(self.state.duals | {payload.header.client_id: None})
        weight = 1.0 - prior_weight(self.hyperparameters.rho, clients)
        return reply_effect(self._local_posterior(payload), self.global_, weight).numpy()

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`.

        Returns:
            ‖(m̄, log diag S̄)‖ (‖m̄‖ for the fixed-covariance family).
        """
        return mean_log_precision(self.global_).norm().item()

    def update_scale(self, payload: Payload) -> float:
        """The client's examples: its local posterior's data term, loss_sum/τ, is a sum over them (ess = N_k/(ρτ)).

        Args:
            payload: an accepted reply.

        Returns:
            Its num_examples, as a float.
        """
        return float(payload.reply.num_examples)

    def check_reply(self, payload: Payload) -> None:
        """A local posterior must be a Gaussian: positive precisions (diagonal) or a positive-definite precision matrix
        (full); the isotropic family sends none. The reported duals must be the dual step (Alg. 1 lines 5-6) from the
        duals of the client's last accepted round (zero for a new client or one that lost its state), as the server
        replays it: the duals feed the server's sums.

        Args:
            payload: a reply the core has checked.

        Raises:
            PayloadError: a local precision is not positive (definite), or a reported dual differs from the replay by
                more than its tolerance (replay_tolerance).
        """
        local = self._local_posterior(payload)
        if self.family == "full":
            if torch.linalg.cholesky_ex(local.precision).info != 0:
                raise PayloadError("field 'local_precision': the precision matrix is not positive definite")
        elif not self.isotropic and (local.precision <= 0).any():
            raise PayloadError(f"field 'local_precision': {(local.precision <= 0).sum().item()} precisions are <= 0")
        previous = (
            self.state.duals[payload.header.client_id]
            if payload.reply.resumed_from_round
            else Duals(torch.zeros_like(local.mean), torch.zeros_like(self.global_.precision))
        )
        expected = dual_step(previous, local, self.global_, self.dual_step_size, payload.header.server_round)
        reported = self._reported_duals(payload, payload.header.server_round)
        tolerance = replay_tolerance(previous, local, self.global_, self.dual_step_size, reported)
        for name, mine, theirs, allowed in (
            ("dual_mean", expected.mean, reported.mean, tolerance.mean),
            ("dual_precision", expected.precision, reported.precision, tolerance.precision),
        ):
            excess = ((mine - theirs).abs() / allowed).max().item()
            if excess > 1.0:
                raise PayloadError(
                    f"field '{name}': differs from the server's replay of the dual step by "
                    f"{excess:.3g} times the tolerance of an entry ({DUAL_CHECK_RTOL:g} of the "
                    "magnitudes that make it)"
                )

    def _local_posterior(self, payload: Payload) -> Gaussian:
        mean = torch.from_numpy(flatten(payload.tensors["local_mean"], self.layout))
        if self.isotropic:
            return Gaussian(mean, unit_precision())
        return Gaussian(mean, precision_from_wire(payload.tensors["local_precision"], self.family, self.layout))

    def _reported_duals(self, payload: Payload, server_round: int) -> Duals:
        mean = torch.from_numpy(flatten(payload.tensors["dual_mean"], self.layout))
        if self.isotropic:
            return Duals(mean, torch.tensor(0.0, dtype=torch.float64), server_round)
        return Duals(
            mean, precision_from_wire(payload.tensors["dual_precision"], self.family, self.layout), server_round
        )

    def save_state(self, state: BayesADMMState) -> ServerState:
        """q̄, every known client's duals, local posterior and share (with the round they were last updated in), in
        float64.

        Args:
            state: a BayesADMM state.

        Returns:
            The checkpoint's part: "global_mean", "global_precision" and the per-client "duals", "local_posteriors"
            and "shares"; nothing before round 1.
        """
        saved = ServerState()
        if state.global_ is not None:
            saved.tensors |= {
                "global_mean": state.global_.mean.numpy(),
                "global_precision": state.global_.precision.numpy(),
            }
            saved.add_per_client("duals", state.duals)
            saved.add_per_client("local_posteriors", state.local_posteriors)
            saved.add_per_client("shares", state.shares)
        return saved

    def load_state(self, saved: ServerState) -> BayesADMMState:
        """The state `save_state` saved. A checkpoint from before the local posteriors or the shares were kept has none
        of them: `forget` then lacks those estimates.

        Args:
            saved: a checkpoint's strategy state.

        Returns:
            q̄, the duals, and the local posteriors and shares where the checkpoint holds them; the initial state for a
            checkpoint saved before round 1.
        """
        if "global_mean" not in saved.tensors:
            return BayesADMMState()
        global_ = Gaussian(
            torch.from_numpy(saved.tensors["global_mean"].copy()),
            torch.from_numpy(saved.tensors["global_precision"].copy()),
        )
        # a checkpoint from before the local posteriors were kept has none: `forget` then has the fixed point alone
        held_locals = (
            saved.per_client("local_posteriors", LocalPosterior) if "local_posteriors" in saved.metadata else {}
        )
        # the shares add up to q̄ only if kept from round 1: a checkpoint from before they were keeps none, ever
        shares = saved.per_client("shares", Duals) if "shares" in saved.metadata else {}
        return BayesADMMState(global_, saved.per_client("duals", Duals), held_locals, shares)

    def _global_problem(self, q: Gaussian) -> str | None:
        """Why `q` (as sent: float32 values) cannot be the new global posterior, or None."""
        if not (torch.isfinite(q.mean).all() and torch.isfinite(q.precision).all()):
            return "the global posterior would be non-finite"
        return self._precision_problem(q.precision)

    def _precision_problem(self, precision: torch.Tensor) -> str | None:
        """Why `precision` cannot be the global precision S̄ (not finite, not positive definite), or None."""
        if self.isotropic:
            return None
        if not torch.isfinite(precision).all():
            return "the global precision would be non-finite"
        if self.family == "full" and torch.linalg.cholesky_ex(precision).info != 0:
            return (
                "the global precision matrix would not be positive definite; lower dual-damping "
                "or raise prior-precision"
            )
        if self.family == "diagonal" and (precision <= 0).any():
            return (
                f"{(precision <= 0).sum().item()} global precisions would be <= 0; lower "
                "dual-damping or raise prior-precision"
            )
        return None

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        """Weights sampled from q̄ for the predictive ensemble (none for the fixed-covariance family).

        Args:
            count: the samples to draw, >= 0.
            generator: the draws' source (seeded by the round).

        Returns:
            `count` parameter settings, name -> array in `layout`; none for the isotropic family, before round 1, or
            for `count` 0.
        """
        if self.isotropic or self.state.global_ is None or count == 0:
            return []
        samples = Gaussian(self.global_.mean, self.global_.precision).sample(count, generator)
        return [unflatten(sample.numpy(), self.layout) for sample in samples]

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the global posterior (`fedbayes export`).

        Returns:
            q̄ = N(m̄, S̄⁻¹) as a Gaussian over the flat parameters; a point estimate for the fixed-covariance family
            (its covariance is no learnt posterior) and before round 1.
        """
        if self.isotropic:
            return GlobalPosterior(
                "a point estimate m̄: federated ADMM fixes the covariance at the identity, a device "
                "of the algorithm, not a learnt posterior"
            )
        if self.state.global_ is None:
            return super().global_posterior()
        return GlobalPosterior(f"q̄ = N(m̄, S̄⁻¹) with a {self.family} precision S̄ (BayesADMM Alg. 1)", self.global_)


class FedADMM(BayesADMM):
    """Federated ADMM: BayesADMM's isotropic family, a fixed unit covariance with the delta approximation."""

    family = "isotropic"


class BayesADMMFull(BayesADMM):
    """BayesADMM with full-covariance Gaussians and Newton clients (App. C.4), for small logistic regressions: the
    precisions travel as P x P matrices."""

    family = "full"

    def __init__(self, settings: RunSettings, layout: TensorLayout, buffer_layout: TensorLayout | None = None) -> None:
        size = sum(math.prod(shape) for shape in layout.values())
        if settings.model != "logreg":
            raise ConfigError("strategy 'bayesadmm-full' needs model=logreg: its Newton steps need a convex loss")
        if size > MAX_FULL_PARAMETERS:
            raise ConfigError(
                f"strategy 'bayesadmm-full' sends {size}x{size} precisions; the model has {size} parameters and "
                f"at most {MAX_FULL_PARAMETERS} are allowed: shrink the input, e.g. pool=4 (FMNIST 7x7, 500 parameters)"
            )
        super().__init__(settings, layout, buffer_layout)
