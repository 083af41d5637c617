"""BayesADMM (Möllenhoff et al., "Federated ADMM from Bayesian Duality"), and federated ADMM as its
isotropic special case.

The server holds q̄ = N(m̄, S̄^-1); client k holds q_k = N(m_k, S_k^-1) and duals (v_k, U_k) on the
natural parameters. One round:
  client (line 4):    q_k <- argmin E_q[loss_k/τ + v_k·θ - ½ θ·U_k θ] + ρ KL(q ‖ q̄)      (Eq. 28, 40)
  client (lines 5-6): v_k <- v_k + γ (S_k m_k - S̄ m̄),  U_k <- U_k + γ (S_k - S̄)            (Eq. 36)
  server (lines 9-11): S̄ <- (1-α) Mean(S_k) + α [δ I + Sum(U_k)]                            (Eq. 37)
                       m̄ <- S̄^-1 [(1-α) Mean(S_k m_k) + α Sum(v_k)],  α = 1/(1 + ρK)        (Eq. 38)
Sign convention: the paper's (duals add client - server; the server adds the dual sums).

Families (the precision's shape, see bayes/gaussian.py):
  diagonal  Alg. 1; the client solves line 4 with IVON (bayes/ivon.py), ess = N_k/(ρτ) (App. D).
  isotropic fixed unit covariance + the delta approximation = federated ADMM (Fig. 2a, Eqs. 21-25):
            the client minimises loss_k + v_k·θ + ρ/2 ‖θ - m̄‖² with Adam/SGD, U_k stays 0, S̄ stays 1.
  full      App. C.4, for small logistic regressions (strategy `bayesadmm-full`): the client takes
            `local-epochs` VON/Newton steps of size `lr` on Eq. 34 (`newton_client_step`, delta
            approximation; exact in one unit step for a quadratic loss, Prop. 3.2). Precisions and U_k
            travel as one P x P matrix, so P is capped at MAX_FULL_PARAMETERS.

Membership (a real federation, not the paper's fixed K): Mean(...) runs over the clients that replied
this round; Sum(...) over the stored duals of every client that ever replied; K = that number, so α
changes when a client joins. A joining client starts with v = U = 0 at the current q̄. Duals live on
the client, in its durable store, with IVON's state; the client reports them (Alg. 1 line 8) and the
server keeps them keyed by the stable client id, checking each report against its own replay of the
dual step, entry by entry (`replay_tolerance`). A client that lost its state restarts from zero duals: the server
logs the disagreement and uses what the client reports, so the server's sums always match the clients' objectives.

Bounded influence (run config `robust-aggregation = "clip"`): in the server step, every client's duals (v_k, U_k)
are tempered to at most `clip-ratio` x the median norm of the known clients' duals, and every local posterior's
natural parameters are moved towards q̄'s to at most `clip-ratio` x the median distance of the round's
(bayes/robust.py part_clip_factors). The server keeps (and the clients hold) the untempered duals. The screen measures
a reply's update as (m_k − m̄, log S_k − log S̄): honest local precisions span many orders of magnitude (a small
client's CNN: 1e2 to 1e18), which a norm in natural parameters would mistake for an attack.

Forgetting a client (`forget`, ../shared/specs/forget.md): Eq. 36 stands still only where every S_k = S̄ and S_k m_k =
S̄ m̄, and there Eqs. 37-38 read S̄ = δI + Σ_k U_k, S̄ m̄ = Σ_k v_k (`fixed_point_natural`): the duals are the clients'
sites. The server drops client k's duals and rebuilds q̄ from the others; K - 1 (and α) follow, since they are counted
from the duals held. What that is, per family, at the fixed point:
  full       exact for a quadratic loss (U_k = A_k/τ, v_k = b_k/τ). With the clients' cross-entropy the remaining duals
             are linearisations at m̄ (U_j = H_j(m̄)/τ, v_j = U_j m̄ - ∇ℓ_j(m̄)/τ), and the result is one Newton step
             from m̄ on the remaining objective Σ_{j≠k} ℓ_j/τ + δ/2 ‖θ‖²: an estimate.
  diagonal   the duals are the sites of IVON's approximate (mean-field) fixed point: an estimate.
  isotropic  (federated ADMM) U_j = 0, v_j = -∇ℓ_j(θ̄): θ̄' = Σ_{j≠k} v_j / δ is one gradient step of size 1/δ on
             Σ_{j≠k} ℓ_j + δ/2 ‖θ‖² from θ̄. Exact is only the removal of k's multiplier; θ̄' is not the optimum
             without k, and there is no covariance to compare (no KL).
In every family the remaining duals stay the remaining clients' multipliers, so ordinary rounds among them refine the
result to the fixed point without k; how far q̄ was from its duals' fixed point is measured (`fixed_point_residual`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedbayes.bayes.gaussian import Gaussian, kl_divergence, scaled_identity, solve
from fedbayes.bayes.ivon import IVONWithPrior
from fedbayes.bayes.params import flatten, unflatten
from fedbayes.bayes.robust import part_clip_factors
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.state import ClientState
from fedbayes.client.training import make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, PayloadError, TensorLayout, Tensors
from fedbayes.strategies.base import (
    ForgetRefused, Forgotten, GlobalPosterior, RoundRejected, ServerState, Update, WireStrategy, local_training,
)
from fedbayes.tasks.config import AT_LEAST_ONE, MOMENTUM, POSITIVE, ConfigError, Key, RunSettings

# Paper defaults, FMNIST-10% heterogeneous (../shared/specs/bayesadmm.md §2).
HYPERPARAMETERS = (
    Key("rho", 0.2, "ρ: the primal step, the weight of KL(q ‖ q̄) in the client's objective (Eq. 28)", POSITIVE),
    Key("dual-damping", 0.001, "γ/ρ: the dual step is γ = damping·ρ (federated ADMM: γ = ρ)", POSITIVE),
    Key("temperature", 0.001, "τ: the client minimises loss_sum / τ (App. D)", POSITIVE),
    Key("prior-precision", 1.0, "δ: the prior's precision, q̄'s precision at the start (Alg. 1)", POSITIVE),
    Key("hess-init", 0.001, "IVON's initial Hessian h0", POSITIVE),
    Key("beta1", 0.9, "IVON's gradient momentum", MOMENTUM),
    Key("beta2", 0.9998, "IVON's Hessian momentum", MOMENTUM),
    Key("mc-samples", 1, "IVON's weight samples per step", AT_LEAST_ONE),
    Key("rescale-lr", False, "IVON's rescale_lr"),
    Key("reset-posterior", True, "start IVON's posterior at q̄ every round (the reference code does)"),
    Key("noise", "shared", "shared: every client draws IVON's weight noise and its minibatch order from the run "
        "seed, the same in every round (the reference code); independent: per client and round",
        choices=("shared", "independent")),
)

DUAL_CHECK_RTOL = 1e-5  # per entry, of the magnitudes that make it: float32 transport rounds each to ~6e-8
FAMILIES = ("diagonal", "isotropic", "full")  # the shape of a precision (bayes/gaussian.py)
MIN_NEWTON_STEP = 1e-6
MAX_FULL_PARAMETERS = 2048  # a full precision is P x P float32 on the wire: 16 MiB per matrix at the cap


# ---- the math, shared by every family -----------------------------------------------------------
@dataclass
class Duals:
    mean: torch.Tensor  # v_k, shaped like a mean
    precision: torch.Tensor  # U_k, shaped like the family's precision
    round: int = 0  # last round these duals were updated in


def dual_step(duals: Duals, local: Gaussian, global_: Gaussian, step: float, server_round: int) -> Duals:
    """Alg. 1 lines 5-6 / Eq. 36: v += γ (S_k m_k - S̄ m̄), U += γ (S_k - S̄)."""
    local_eta, _ = local.natural()
    global_eta, _ = global_.natural()
    return Duals(
        duals.mean + step * (local_eta - global_eta),
        duals.precision + step * (local.precision - global_.precision),
        server_round,
    )


def server_natural(locals_: list[Gaussian], all_duals: list[Duals], rho: float,
                   prior_precision: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 1 lines 9-11 / Eqs. 37-38 for any family, in natural parameters: (S̄ m̄, S̄). `locals_`: this round's
    replies; `all_duals`: every known client's duals (K = len(all_duals))."""
    alpha = 1.0 / (1.0 + rho * len(all_duals))
    mean_eta = torch.stack([q.natural()[0] for q in locals_]).mean(0)
    mean_precision = torch.stack([q.precision for q in locals_]).mean(0)
    sum_v = torch.stack([d.mean for d in all_duals]).sum(0)
    sum_u = torch.stack([d.precision for d in all_duals]).sum(0)
    precision = (1 - alpha) * mean_precision + alpha * (scaled_identity(mean_precision, prior_precision) + sum_u)
    return (1 - alpha) * mean_eta + alpha * sum_v, precision


def server_step(locals_: list[Gaussian], all_duals: list[Duals], rho: float, prior_precision: float) -> Gaussian:
    """Eqs. 37-38 as a Gaussian: m̄ = S̄⁻¹ (S̄ m̄)."""
    eta, precision = server_natural(locals_, all_duals, rho, prior_precision)
    return Gaussian(solve(precision, eta), precision)


def fixed_point_natural(all_duals: list[Duals], prior_precision: float,
                        like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 37-38 at the fixed point (../shared/specs/forget.md): where Eq. 36 stands still, every S_k = S̄ and
    S_k m_k = S̄ m̄, so S̄ = (1-α) S̄ + α [δI + Σ U_k] whatever α: (S̄ m̄, S̄) = (Σ_k v_k, δI + Σ_k U_k) over
    `all_duals`. `like`: a precision of the family's shape."""
    sum_v = torch.stack([d.mean for d in all_duals]).sum(0)
    sum_u = torch.stack([d.precision for d in all_duals]).sum(0)
    return sum_v, scaled_identity(like, prior_precision) + sum_u


def fixed_point_residual(global_: Gaussian, all_duals: list[Duals], prior_precision: float) -> float:
    """How far q̄ is from the Gaussian its duals make at the fixed point (forget.md: "measure, do not assume"): the
    larger relative distance of the means and of the precisions (the means alone for the fixed-covariance family,
    where θ̄ = Σ v_k/δ at the fixed point). 0 at the fixed point."""
    eta, precision = fixed_point_natural(all_duals, prior_precision, global_.precision)
    distances = [relative_distance(solve(precision, eta), global_.mean)]
    if global_.kind != "isotropic":
        distances.append(relative_distance(precision, global_.precision))
    return max(distances)


def relative_distance(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value - reference).norm() / reference.norm().clamp_min(1e-300)).item()


def replay_tolerance(previous: Duals, local: Gaussian, global_: Gaussian, step: float, reported: Duals) -> Duals:
    """Per entry, how far a reported dual may lie from the server's replay of Eq. 36: DUAL_CHECK_RTOL of the
    magnitudes that make the entry (old dual, γ·local, γ·global, the result), since each crossed the wire as
    float32. Per entry: a tolerance scaled by a tensor's largest entry let one huge entry hide errors in the rest."""
    mean = previous.mean.abs() + step * (natural_mean_magnitude(local) + natural_mean_magnitude(global_)) \
        + reported.mean.abs()
    precision = previous.precision.abs() + step * (local.precision.abs() + global_.precision.abs()) \
        + reported.precision.abs()
    return Duals(DUAL_CHECK_RTOL * mean + 1e-30, DUAL_CHECK_RTOL * precision + 1e-30)


def natural_mean_magnitude(q: Gaussian) -> torch.Tensor:
    """|S| |m| entry by entry: what bounds the float32 rounding error of each entry of S m (for a full S, each entry
    sums a whole row, so its error scales with |S| |m|, not with |S m|)."""
    return Gaussian(q.mean.abs(), q.precision.abs()).precision_times(q.mean.abs())


def tempering(means: list[torch.Tensor], precisions: list[torch.Tensor], clip_ratio: float) -> list[float]:
    """Per item, the factor that brings both its natural mean and its precision part to at most clip-ratio x the
    median of theirs (bayes/robust.py part_clip_factors)."""
    parts = [[mean.numpy() for mean in means], [precision.numpy().ravel() for precision in precisions]]
    return [float(factor) for factor in part_clip_factors(parts, clip_ratio)]


def tempered_duals(all_duals: list[Duals], clip_ratio: float) -> list[Duals]:
    """Every client's duals tempered to at most clip-ratio x the median dual, in natural parameters."""
    factors = tempering([d.mean for d in all_duals], [d.precision for d in all_duals], clip_ratio)
    return [Duals(f * d.mean, f * d.precision, d.round) for f, d in zip(factors, all_duals)]


def bounded_influence(locals_: list[Gaussian], all_duals: list[Duals], global_: Gaussian,
                      clip_ratio: float) -> tuple[list[Gaussian], list[Duals]]:
    """What the clip rule feeds the server step: duals tempered to at most clip-ratio x the median dual (in
    natural parameters), and local posteriors moved towards q̄, in natural parameters, to at most clip-ratio x the
    median distance of the round's."""
    duals = tempered_duals(all_duals, clip_ratio)
    global_eta = global_.natural()[0]
    eta_offsets = [q.natural()[0] - global_eta for q in locals_]
    precision_offsets = [q.precision - global_.precision for q in locals_]
    moved = []
    for f, eta, precision in zip(tempering(eta_offsets, precision_offsets, clip_ratio), eta_offsets,
                                 precision_offsets):
        precision = global_.precision + f * precision  # between S̄ and S_k: positive definite like both
        moved.append(Gaussian(solve(precision, global_eta + f * eta), precision))
    return moved, duals


def newton_client_step(
    loss_sum,
    global_: Gaussian,
    duals: Duals,
    rho: float,
    start: Gaussian,
    step_size: float = 1.0,
) -> Gaussian:
    """One VON step (delta approximation) on Eq. 34 for a full or isotropic-fixed family:
    minimise (1/ρ)·[loss(θ) + v·θ - ½θ·Uθ] + KL(q ‖ q̄). `loss_sum(theta)` is the client's summed
    loss. With a quadratic loss and step 1 this is the exact minimiser."""
    if global_.kind not in ("full", "isotropic"):
        raise ValueError("newton_client_step is for the full and fixed-isotropic families; diagonal uses IVON")
    theta = start.mean.detach()
    gradient = torch.func.grad(loss_sum)(theta)
    # jacrev∘jacrev: torch.func.hessian's forward mode costs ~8 s on its first call in a process (~2 s here).
    hessian = torch.func.jacrev(torch.func.jacrev(loss_sum))(theta)
    identity = torch.eye(theta.numel(), dtype=theta.dtype)
    if global_.kind == "isotropic":  # fixed unit covariance: KL = ½‖m - m̄‖², U = 0, only m moves
        precision = identity + hessian / rho
        direction = solve(precision, (gradient + duals.mean) / rho + (theta - global_.mean))
        return Gaussian(theta - step_size * direction, start.precision)
    target_precision = global_.precision + (hessian - duals.precision) / rho
    precision = (1 - step_size) * start.precision + step_size * target_precision
    direction = solve(
        precision, (gradient + duals.mean - duals.precision @ theta) / rho + global_.precision @ (theta - global_.mean)
    )
    return Gaussian(theta - step_size * direction, precision)


def delta_objective(loss_sum, global_: Gaussian, duals: Duals, rho: float):
    """Eq. 34 under the delta approximation as a function of the mean θ (what `newton_client_step`
    descends): (1/ρ)·[loss(θ) + v·θ - ½θ·Uθ] + ½(θ - m̄)·S̄(θ - m̄)."""

    def objective(theta: torch.Tensor) -> torch.Tensor:
        offset = theta - global_.mean
        lagrange = duals.mean @ theta - 0.5 * theta @ (duals.precision @ theta)
        return (loss_sum(theta) + lagrange) / rho + 0.5 * offset @ (global_.precision @ offset)

    return objective


# ---- precisions on the wire: shaped like the parameters (diagonal), one (P, P) matrix (full), none (isotropic:
# fixed unit covariance, U_k = 0) --------------------------------------------------------------------------------
def unit_precision() -> torch.Tensor:
    return torch.tensor(1.0, dtype=torch.float64)


def precision_layout(family: str, layout: TensorLayout) -> TensorLayout:
    if family == "isotropic":
        return {}
    if family == "full":
        size = sum(math.prod(shape) for shape in layout.values())
        return {"matrix": (size, size)}
    return layout


def precision_to_wire(precision: torch.Tensor, family: str, layout: TensorLayout) -> Tensors:
    if family == "isotropic":
        return {}
    if family == "full":
        return {"matrix": precision.numpy().astype(np.float32)}
    return unflatten(precision.numpy(), layout)


def precision_from_wire(arrays: Tensors, family: str, layout: TensorLayout) -> torch.Tensor:
    if family == "isotropic":
        return unit_precision()
    wire_layout = precision_layout(family, layout)
    flat = torch.from_numpy(flatten(arrays, wire_layout))
    return flat.view(wire_layout["matrix"]) if family == "full" else flat


def check_full_family_fits(settings: RunSettings, layout: TensorLayout) -> None:
    size = sum(math.prod(shape) for shape in layout.values())
    if settings.model != "logreg":
        raise ConfigError("strategy 'bayesadmm-full' needs model=logreg: its Newton steps need a convex loss")
    if size > MAX_FULL_PARAMETERS:
        raise ConfigError(
            f"strategy 'bayesadmm-full' sends {size}x{size} precisions; the model has {size} parameters and "
            f"at most {MAX_FULL_PARAMETERS} are allowed: shrink the input, e.g. pool=4 (FMNIST 7x7, 500 parameters)"
        )


# ---- server half ----------------------------------------------------------------------------------
class BayesADMM(WireStrategy):
    """BayesADMM over the network in one of three families (see the module docstring): `diagonal`
    (Alg. 1, IVON clients), `full` (App. C.4, Newton clients) or `isotropic` (= federated ADMM)."""

    reply_type = pb.BayesADMMReply
    robust_rules = ("none", "clip")

    def __init__(self, settings: RunSettings, layout: TensorLayout, family: str = "diagonal") -> None:
        if family not in FAMILIES:
            raise ValueError(f"unknown BayesADMM family {family!r}")
        if family == "full":
            check_full_family_fits(settings, layout)
        super().__init__(settings, layout)
        self.family = family
        self.isotropic = family == "isotropic"
        self.size = sum(math.prod(shape) for shape in layout.values())
        self.global_: Gaussian | None = None  # q̄ as the clients receive it; set from the initial model in round 1
        self.duals: dict[str, Duals] = {}  # client id -> its duals after its last accepted round

    @property
    def dual_step_size(self) -> float:
        # γ = damping·ρ as in the reference code; federated ADMM's dual step is ρ itself (Eq. 22).
        return self.settings.rho if self.isotropic else self.settings.dual_damping * self.settings.rho

    def _initial_global(self, arrays: ArrayRecord) -> Gaussian:
        """q̄ at the start: the model's initial weights as mean (m̄ = 0 would make the MLP's hidden
        units identical), precision δ (Alg. 1 init), or 1 for the fixed-covariance family."""
        mean = torch.from_numpy(flatten({n: arrays[n].numpy() for n in self.layout}, self.layout))
        if self.isotropic:
            return Gaussian(mean, unit_precision())
        if self.family == "full":
            return as_sent(Gaussian(mean, self.settings.prior_precision * torch.eye(self.size, dtype=torch.float64)))
        return as_sent(Gaussian(mean, torch.full_like(mean, self.settings.prior_precision)))

    def instruction(self, server_round, arrays, nodes):
        if self.global_ is None:
            self.global_ = self._initial_global(arrays)
        settings = self.settings
        instruction = pb.BayesADMMInstruction(
            training=local_training(settings, server_round), family=self.family,
            rho=settings.rho, dual_step=self.dual_step_size, temperature=settings.temperature,
            hess_init=settings.hess_init, beta1=settings.beta1, beta2=settings.beta2,
            mc_samples=settings.mc_samples, rescale_lr=settings.rescale_lr, reset_posterior=settings.reset_posterior,
            shared_noise=settings.noise == "shared", noise_seed=settings.seed,
        )
        tensors = {"global_mean": unflatten(self.global_.mean.numpy(), self.layout),
                   "global_precision": precision_to_wire(self.global_.precision, self.family, self.layout)}
        return instruction, tensors

    def reply_layouts(self):
        precision_wire = precision_layout(self.family, self.layout)
        return {"local_mean": self.layout, "local_precision": precision_wire,
                "dual_mean": self.layout, "dual_precision": precision_wire}

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        locals_ = [self._local_posterior(payload) for payload in payloads]
        duals = self.duals | {p.message.header.client_id: self._reported_duals(p, server_round) for p in payloads}
        used_locals, used_duals = locals_, list(duals.values())
        if self.settings.robust_aggregation == "clip":
            used_locals, used_duals = bounded_influence(locals_, used_duals, self.global_, self.settings.clip_ratio)
        eta, precision = server_natural(used_locals, used_duals, self.settings.rho, self.settings.prior_precision)
        problem = self._precision_problem(precision)  # before the solve: a singular S̄ must not raise there
        if problem:
            raise RoundRejected(problem)
        updated = Gaussian(solve(precision, eta), unit_precision() if self.isotropic else precision)
        updated = as_sent(updated)
        problem = self._global_problem(updated)
        if problem:
            raise RoundRejected(problem)
        return Update(updated.mean.numpy(), {"duals": duals, "global_": updated},
                      {"known-clients": len(duals), **precision_summary(updated)})

    def forget(self, client: str) -> Forgotten:
        """forget.md: drop client k's duals and rebuild q̄ at the fixed point from the remaining ones,
        S̄' = δI + Σ_{j≠k} U_j, m̄' = S̄'⁻¹ Σ_{j≠k} v_j (tempered as the server step tempers them under `clip`); what
        that is per family: the module docstring. The remaining duals stay, so the next ordinary round goes on from
        them; client k's accepted round and identity go."""
        self.check_forgettable(client, self.duals)
        duals = {c: d for c, d in self.duals.items() if c != client}
        delta = self.settings.prior_precision
        eta, precision = fixed_point_natural(self._summed_duals(duals), delta, self.global_.precision)
        residual = fixed_point_residual(self.global_, self._summed_duals(self.duals), delta)
        problem = self._precision_problem(precision)  # before the solve, as in absorb
        if problem is None:
            forgotten = as_sent(Gaussian(solve(precision, eta), unit_precision() if self.isotropic else precision))
            problem = self._global_problem(forgotten)
        if problem is not None:
            raise ForgetRefused(f"without client {client!r}, {problem.split(';')[0]}: the remaining duals are not yet "
                                f"sites (q̄ is {residual:.2g} from its duals' fixed point); run more rounds first, "
                                "or retrain")
        kl = None if self.isotropic else kl_divergence(self.global_, forgotten)
        what = {"full": "exact for a quadratic loss, one Newton step on the remaining data for cross-entropy",
                "diagonal": "the sites of IVON's approximate fixed point: an estimate",
                "isotropic": "θ̄' = Σ v_j/δ, one gradient step of size 1/δ on the remaining objective"}[self.family]
        note = (f"q̄ from the {len(duals)} remaining clients' duals at the fixed point ({what}); q̄ was {residual:.2g} "
                f"from its duals' fixed point; refinement rounds move it to the fixed point without {client!r}")
        state = {"duals": duals, "global_": forgotten, **self.core_state_without(client)}
        # exact only for a quadratic loss, which no client here trains (the full family's is cross-entropy)
        return Forgotten(forgotten.mean.numpy(), state, exact=False, kl_before_after=kl, note=note)

    def _summed_duals(self, duals: dict[str, Duals]) -> list[Duals]:
        """The duals as the server step sums them: tempered under the `clip` rule."""
        if self.settings.robust_aggregation == "clip":
            return tempered_duals(list(duals.values()), self.settings.clip_ratio)
        return list(duals.values())

    def update_of(self, payload: Payload) -> np.ndarray:
        """(m_k − m̄, log S_k − log S̄): the local posterior against q̄, in mean and log precision (the diagonal's, for
        the full family; none for the fixed-covariance one). check_reply has made sure S_k is positive."""
        return (mean_log_precision(self._local_posterior(payload)) - mean_log_precision(self.global_)).numpy()

    def state_norm(self) -> float:
        return mean_log_precision(self.global_).norm().item()

    def check_reply(self, payload: Payload) -> None:
        """A local posterior must be a Gaussian: positive precisions (diagonal) or a positive-definite
        precision matrix (full); the isotropic family sends none. The reported duals must be the dual step
        (Alg. 1 lines 5-6) from the duals of the client's last accepted round (zero for a new client or one
        that lost its state), as the server replays it: the duals feed the server's sums."""
        local = self._local_posterior(payload)
        if self.family == "full":
            if torch.linalg.cholesky_ex(local.precision).info != 0:
                raise PayloadError("field 'local_precision': the precision matrix is not positive definite")
        elif not self.isotropic and (local.precision <= 0).any():
            raise PayloadError(f"field 'local_precision': {(local.precision <= 0).sum().item()} precisions are <= 0")
        message = payload.message
        continued = self.check_resumed(payload, "it starts again from zero duals")
        previous = self.duals[message.header.client_id] if continued else Duals(
            torch.zeros_like(local.mean), torch.zeros_like(self.global_.precision))
        expected = dual_step(previous, local, self.global_, self.dual_step_size, message.header.server_round)
        reported = self._reported_duals(payload, message.header.server_round)
        tolerance = replay_tolerance(previous, local, self.global_, self.dual_step_size, reported)
        for name, mine, theirs, allowed in (("dual_mean", expected.mean, reported.mean, tolerance.mean),
                                            ("dual_precision", expected.precision, reported.precision,
                                             tolerance.precision)):
            excess = ((mine - theirs).abs() / allowed).max().item()
            if excess > 1.0:
                raise PayloadError(f"field '{name}': differs from the server's replay of the dual step by "
                                   f"{excess:.3g} times the tolerance of an entry ({DUAL_CHECK_RTOL:g} of the "
                                   "magnitudes that make it)")

    def _local_posterior(self, payload: Payload) -> Gaussian:
        mean = torch.from_numpy(flatten(payload.tensors["local_mean"], self.layout))
        if self.isotropic:
            return Gaussian(mean, unit_precision())
        return Gaussian(mean, precision_from_wire(payload.tensors["local_precision"], self.family, self.layout))

    def _reported_duals(self, payload: Payload, server_round: int) -> Duals:
        mean = torch.from_numpy(flatten(payload.tensors["dual_mean"], self.layout))
        if self.isotropic:
            return Duals(mean, torch.tensor(0.0, dtype=torch.float64), server_round)
        return Duals(mean, precision_from_wire(payload.tensors["dual_precision"], self.family, self.layout),
                     server_round)

    def state_dict(self) -> ServerState:
        """q̄ and every known client's duals (with the round they were last updated in), in float64."""
        state = super().state_dict()
        if self.global_ is not None:
            state.tensors |= {"global_mean": self.global_.mean.numpy(), "global_precision": self.global_.precision.numpy()}
            state.add_per_client("duals", self.duals)
        return state

    def load_state_dict(self, state: ServerState) -> None:
        super().load_state_dict(state)
        if "global_mean" not in state.tensors:
            return
        self.global_ = Gaussian(torch.from_numpy(state.tensors["global_mean"].copy()),
                                torch.from_numpy(state.tensors["global_precision"].copy()))
        self.duals = state.per_client("duals", Duals)

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
            return ("the global precision matrix would not be positive definite; lower dual-damping "
                    "or raise prior-precision")
        if self.family == "diagonal" and (precision <= 0).any():
            return (f"{(precision <= 0).sum().item()} global precisions would be <= 0; lower "
                    "dual-damping or raise prior-precision")
        return None

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        """Weights sampled from q̄ for the predictive ensemble (none for the fixed-covariance family)."""
        if self.isotropic or self.global_ is None or count == 0:
            return []
        samples = Gaussian(self.global_.mean, self.global_.precision).sample(count, generator)
        return [unflatten(sample.numpy(), self.layout) for sample in samples]

    def global_posterior(self) -> GlobalPosterior:
        if self.isotropic:
            return GlobalPosterior("a point estimate m̄: federated ADMM fixes the covariance at the identity, a device "
                                   "of the algorithm, not a learnt posterior")
        if self.global_ is None:
            return super().global_posterior()
        return GlobalPosterior(f"q̄ = N(m̄, S̄⁻¹) with a {self.family} precision S̄ (BayesADMM Alg. 1)", self.global_)


def mean_log_precision(q: Gaussian) -> torch.Tensor:
    """(m, log diag S) as one flat vector; m alone for the fixed-covariance family."""
    if q.kind == "isotropic":
        return q.mean
    diagonal = q.precision.diagonal() if q.precision.ndim == 2 else q.precision
    return torch.cat([q.mean, diagonal.log()])


def precision_summary(q: Gaussian) -> dict[str, float]:
    """The median of the global precision S̄ (its diagonal for the full family): how fast q̄ concentrates,
    which is what shared training noise speeds up (README, Results)."""
    if q.kind == "isotropic":
        return {}
    diagonal = q.precision.diagonal() if q.precision.ndim == 2 else q.precision
    return {"global-precision-median": float(diagonal.median())}


def as_sent(q: Gaussian) -> Gaussian:
    """`q` rounded to float32, as the clients receive it: the server replays their dual steps from the same q̄."""
    return Gaussian(q.mean.to(torch.float32).double(), q.precision.to(torch.float32).double())


def fedadmm(settings: RunSettings, layout: TensorLayout) -> BayesADMM:
    return BayesADMM(settings, layout, family="isotropic")


def bayesadmm_full(settings: RunSettings, layout: TensorLayout) -> BayesADMM:
    return BayesADMM(settings, layout, family="full")


# ---- client half ----------------------------------------------------------------------------------
def instruction_layouts(instruction: pb.BayesADMMInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    if instruction.family not in FAMILIES:
        raise PayloadError(f"field 'family': {instruction.family[:32]!r} is not one of {', '.join(FAMILIES)}")
    return {"global_mean": layout, "global_precision": precision_layout(instruction.family, layout)}


def local_update(local: LocalRound) -> LocalResult:
    """Alg. 1 lines 4-6 on this client; duals and IVON state persist in the durable store."""
    instruction, runtime, stored = local.instruction, local.runtime, local.stored
    family = instruction.family
    global_ = Gaussian(torch.from_numpy(flatten(local.tensors["global_mean"], runtime.layout)),
                       precision_from_wire(local.tensors["global_precision"], family, runtime.layout))
    duals = _stored_duals(stored, global_)
    torch.manual_seed(training_seed(instruction, runtime))
    train = {"isotropic": _train_isotropic, "full": _train_full, "diagonal": _train_ivon}[family]
    posterior, (train_loss, compute_seconds), optimizer_state = train(runtime, instruction, global_, duals, stored)
    duals = dual_step(duals, posterior, global_, instruction.dual_step, local.server_round)
    if family == "isotropic":  # U_k stays 0: the covariance is fixed
        duals.precision = torch.zeros_like(duals.precision)
    tensors = {
        "local_mean": unflatten(posterior.mean.numpy(), runtime.layout),
        "local_precision": precision_to_wire(posterior.precision, family, runtime.layout),
        "dual_mean": unflatten(duals.mean.numpy(), runtime.layout),
        "dual_precision": precision_to_wire(duals.precision, family, runtime.layout),
    }
    state = {"dual_mean": duals.mean, "dual_precision": duals.precision, **optimizer_state}
    return LocalResult(pb.BayesADMMReply(train_loss=train_loss, compute_seconds=compute_seconds), tensors, state)


client_update = ClientHalf(pb.BayesADMMInstruction, local_update, instruction_layouts, stateful=True)


def training_seed(instruction: pb.BayesADMMInstruction, runtime: ClientRuntime) -> int:
    """The seed of this round's random numbers: IVON's weight noise (torch's global generator) and the
    minibatch order. Run config `noise`: shared = the server's noise seed, the same for every client in every
    round (the reference code calls torch.manual_seed(seed) at the start of each local training); independent =
    a seed of this client's own for this round."""
    if instruction.shared_noise:
        return instruction.noise_seed
    return runtime.local_seed(instruction.training.seed, instruction.header.server_round)


def _stored_duals(stored: ClientState | None, global_: Gaussian) -> Duals:
    """This client's duals from its store (zeros in its first round), shaped like q̄ as received: U_k is
    (P,) for the diagonal family, (P, P) for the full one and a zero scalar for the isotropic one."""
    shapes = {"dual_mean": global_.mean.shape, "dual_precision": global_.precision.shape}
    if stored is None:
        return Duals(torch.zeros(shapes["dual_mean"], dtype=torch.float64),
                     torch.zeros(shapes["dual_precision"], dtype=torch.float64), 0)
    for name, shape in shapes.items():
        if stored.tensors[name].shape != shape:
            raise ValueError(f"stored {name} has shape {tuple(stored.tensors[name].shape)}, this run needs {tuple(shape)}")
    return Duals(stored.tensors["dual_mean"].double(), stored.tensors["dual_precision"].double(), stored.round)


def _train_ivon(runtime: ClientRuntime, instruction, global_: Gaussian, duals: Duals, stored: ClientState | None):
    """Line 4 with IVON: ess = N_k/(ρτ), prior q̄, Lagrange terms τ v_k / N_k and τ u_k / N_k (Eq. 41)."""
    num_examples = len(runtime.data.labels)
    ess = num_examples / (instruction.rho * instruction.temperature)
    model = runtime.model.to(runtime.device)
    optimizer = IVONWithPrior(
        model.parameters(), lr=instruction.training.learning_rate, ess=ess, hess_init=instruction.hess_init,
        beta1=instruction.beta1, beta2=instruction.beta2, mc_samples=instruction.mc_samples,
        rescale_lr=instruction.rescale_lr,
    )
    device_dtype = dict(device=runtime.device, dtype=torch.float32)
    optimizer.set_prior(global_.mean.to(**device_dtype), global_.precision.to(**device_dtype))
    scale = instruction.temperature / num_examples
    optimizer.set_lagrange((scale * duals.mean).to(**device_dtype), (scale * duals.precision).to(**device_dtype))
    if stored is not None and "ivon_hess" in stored.tensors:  # IVON's state carries over between rounds
        group = optimizer.param_groups[0]
        group["momentum"] = stored.tensors["ivon_momentum"].to(**device_dtype)
        group["hess"] = stored.tensors["ivon_hess"].to(**device_dtype)
        optimizer.current_step = int(stored.tensors["ivon_step"].item())
    if instruction.reset_posterior and stored is not None:  # start at q̄, as the reference code does
        optimizer.set_posterior(global_.mean.to(**device_dtype), global_.precision.to(**device_dtype))
    else:  # start at m̄ with IVON's own Hessian estimate (h0 in a client's first round)
        optimizer.set_posterior(global_.mean.to(**device_dtype), optimizer.posterior()[1])
    loss_and_seconds = train_epochs(
        model, runtime.data, optimizer, instruction.training.epochs, instruction.training.batch_size,
        runtime.device, seed=training_seed(instruction, runtime),
        sampled_weights=lambda: optimizer.sampled_params(train=True), mc_samples=instruction.mc_samples,
    )
    mean, precision = optimizer.posterior()
    group = optimizer.param_groups[0]
    state = {
        "ivon_momentum": group["momentum"].cpu(),
        "ivon_hess": group["hess"].cpu(),
        "ivon_step": torch.tensor([optimizer.current_step]),
    }
    model.cpu()
    local = Gaussian(mean.detach().cpu().double(), precision.detach().cpu().double())
    return local, loss_and_seconds, state


def _train_full(runtime: ClientRuntime, instruction, global_: Gaussian, duals: Duals, stored: ClientState | None):
    """Line 4 for the full family (App. C.4): `epochs` VON/Newton steps from q̄ on Eq. 34, whose loss is
    the client's summed cross-entropy tempered by τ (the same units as the diagonal family's
    ess = N_k/(ρτ)). Each step starts at size `learning_rate` and halves until Eq. 34 decreases:
    undamped Newton can diverge on a logistic loss far from its minimum. Full-batch, CPU, float64."""
    images, labels = runtime.data.images.double(), runtime.data.labels

    def tempered_loss_sum(theta: torch.Tensor) -> torch.Tensor:
        weights, offset = {}, 0
        for name, shape in runtime.layout.items():
            weights[name] = theta[offset : offset + math.prod(shape)].view(shape)
            offset += math.prod(shape)
        logits = torch.func.functional_call(runtime.model, weights, (images,))
        return torch.nn.functional.cross_entropy(logits, labels, reduction="sum") / instruction.temperature

    objective = delta_objective(tempered_loss_sum, global_, duals, instruction.rho)
    started = time.perf_counter()
    local, value = global_, objective(global_.mean)
    for _ in range(instruction.training.epochs):
        step_size = instruction.training.learning_rate
        while True:
            candidate = newton_client_step(tempered_loss_sum, global_, duals, instruction.rho, local, step_size)
            candidate_value = objective(candidate.mean)
            if candidate_value <= value or step_size < MIN_NEWTON_STEP:  # the latter: converged to round-off
                break
            step_size /= 2
        local, value = candidate, candidate_value
    local = Gaussian(local.mean, 0.5 * (local.precision + local.precision.T))  # exact symmetry for the wire
    seconds = time.perf_counter() - started
    train_loss = tempered_loss_sum(local.mean).item() * instruction.temperature / max(len(labels), 1)
    return local, (train_loss, seconds), {}


def _train_isotropic(runtime: ClientRuntime, instruction, global_: Gaussian, duals: Duals,
                     stored: ClientState | None):
    """Federated ADMM's client step (Eq. 21) on the mean loss: loss + (v·θ + ρ/2 ‖θ - m̄‖²)/N_k."""
    num_examples = len(runtime.data.labels)
    model = runtime.model.to(runtime.device)
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(global_.mean[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    anchor = global_.mean.to(runtime.device, torch.float32)
    dual = duals.mean.to(runtime.device, torch.float32)

    def admm_terms(module: torch.nn.Module) -> torch.Tensor:
        theta = torch.cat([p.flatten() for p in module.parameters()])
        return (dual @ theta + 0.5 * instruction.rho * (theta - anchor).square().sum()) / num_examples

    loss_and_seconds = train_epochs(
        model, runtime.data, make_optimizer(model, instruction.training), instruction.training.epochs,
        instruction.training.batch_size, runtime.device,
        seed=training_seed(instruction, runtime), extra_loss=admm_terms,
    )
    mean = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().double()
    model.cpu()
    return Gaussian(mean, unit_precision()), loss_and_seconds, {}
