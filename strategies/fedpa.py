"""FedPA (Al-Shedivat et al., "Federated Learning via Posterior Averaging", ICLR 2021) over the fedbayes
wire schema; the spec is ../shared/specs/fedpa.md.

Server half (Alg. 1): Δ = Σ n_i Δ_i / Σ n_i, the example-weighted mean of the client deltas, is the
gradient of a torch optimizer over the flat global model (SERVEROPT: SGD with momentum, Adam or
Adagrad). Deltas point "old - new", so the server descends: SGD with lr 1 and no momentum on FedAvg
deltas is FedAvg. The optimizer's state is checkpointed and never reset when the clients switch phase.
The server tells each client whether the round is a burn-in or a sampling round. With run config
`robust-aggregation`, Δ is the clip, median or trimmed-mean of the deltas instead (bayes/robust.py).

Client half. Rounds 1..burn-in-rounds (the released code's 0-based `round >= burn-in` switch):
  burn-in   FedAvg's client exactly (strategies/fedavg.train_locally); Δ = x_0 - θ_final (Alg. 2).
  sampling  IASG (Alg. 4) from x_0: `local-burnin-epochs` epochs are discarded, then each of `samples`
            epochs is averaged into one sample (K = one epoch's minibatch steps, the paper's "one
            sample per epoch"). The samples stream into the dynamic programme of App. C, which returns
            Δ = Σ̂_ℓ⁻¹(x_0 - x̄_ℓ) for the shrinkage covariance Σ̂_ℓ = ρ_ℓ I + (1 - ρ_ℓ) Ŝ_ℓ,
            ρ_ℓ = 1/(1 + (ℓ-1)ρ) (Eq. 10, Thm 3), in O(ℓ²d) time and O(ℓd) memory: no d x d matrix.
Local burn-in: we follow the released code's default of 1 discarded epoch (spec §3.3, pitfall 3); the
paper's fn. 11 reads as 0, which is `local-burnin-epochs=0`. IASG uses FedAvg's client optimizer
(`optimizer`, `lr`), fresh each round, its state carrying over across the epochs of the round.
The sampler is pluggable: anything that hands flat samples to a callback (`ExactGaussianSampler` in
the tests).
"""

from __future__ import annotations

import copy

import math
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO

import numpy as np
import torch
import torch.nn.functional as F
from flwr.common import log
from torch.nn.utils import parameters_to_vector

from fedbayes.bayes.params import flatten, set_parameters, unflatten
from fedbayes.bayes.robust import RULES, robust_mean
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_layouts
from fedbayes.client.training import Loss, make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, TensorLayout
from fedbayes.strategies.base import GlobalPosterior, RoundRejected, ServerState, Update, WireStrategy, local_training
from fedbayes.strategies.fedavg import train_locally
from fedbayes.tasks.config import AT_LEAST_ONE, MOMENTUM, NON_NEGATIVE, POSITIVE, Key, RunSettings

# ../shared/specs/fedpa.md §7. Rounds 1..burn-in-rounds are FedAvg rounds; each later round runs
# local-burnin-epochs discarded epochs, then `samples` epochs, each averaged into one IASG sample.
HYPERPARAMETERS = (
    Key("burn-in-rounds", 10, "rounds of FedAvg before sampling starts", NON_NEGATIVE),
    Key("samples", 4, "ℓ: IASG samples per sampling round, one per epoch", AT_LEAST_ONE),
    Key("local-burnin-epochs", 1, "epochs discarded at the start of a sampling round (the released code: 1)",
        NON_NEGATIVE),
    Key("shrinkage", 0.01, "ρ of Thm 3; the identity weight is ρ_ℓ = 1/(1 + (ℓ-1)ρ)", NON_NEGATIVE),
    Key("server-optimizer", "sgd", "the server's optimizer on the averaged delta",
        choices=("sgd", "adam", "adagrad")),
    Key("server-lr", 1.0, "the server optimizer's learning rate", POSITIVE),
    Key("server-momentum", 0.0, "sgd's momentum", MOMENTUM),
    Key("server-beta1", 0.9, "adam's β1", MOMENTUM),
    Key("server-beta2", 0.99, "adam's β2", MOMENTUM),
    Key("server-eps", 0.001, "τ of adam and adagrad", POSITIVE),
    Key("server-adagrad-init", 0.1, "adagrad's initial accumulator (Keras' default, as the released code)",
        NON_NEGATIVE),
)
from fedbayes.tasks.datasets import Dataset

SampleSink = Callable[[torch.Tensor], None]  # receives one flat posterior sample x_t


# ---- the client's math: App. C ---------------------------------------------------------------------
class ShrinkageDelta:
    """Δ̂_t = Σ̂_t⁻¹(x_0 - x̄_t), updated online as each sample x_t arrives (App. C, Eqs. 20-28).

    Σ̃_t = I + (t-1)ρ Ŝ_t = Σ̃_{t-1} + γ_t u_t u_tᵀ (Eq. 18) is a rank-1 update, so Sherman-Morrison
    gives Δ̃_t = Σ̃_t⁻¹(x_0 - x̄_t) from Δ̃_{t-1} and the vectors v_{k-1,k} = Σ̃_{k-1}⁻¹ u_k; Σ̂_t = ρ_t Σ̃_t.
    Keeps the t-1 vectors v_{k-1,k} as rows of one matrix, so Eq. 28's t-2 dot products and axpys are
    two matrix-vector products: O(td) per sample, O(ℓ²d) time and O(ℓd) memory in all. Works in the
    dtype and on the device of `x0`, without host syncs. Any-time: `delta()` is valid after every sample.
    `capacity`: the number of samples expected (the buffer grows if more arrive)."""

    def __init__(self, x0: torch.Tensor, shrinkage: float, capacity: int = 8) -> None:
        self.x0 = x0
        self.shrinkage = float(shrinkage)  # ρ
        self.count = 0  # t
        self.mean: torch.Tensor | None = None  # x̄_t
        self.scaled_delta: torch.Tensor | None = None  # Δ̃_t
        self.directions = x0.new_empty((max(capacity - 1, 1), x0.numel()))  # row k-2: v_{k-1,k}, k = 2..t
        self.weights = x0.new_empty(max(capacity - 1, 1))  # row k-2: γ_k / (1 + γ_k u_kᵀ v_{k-1,k})

    def gamma(self, t: int) -> float:
        return self.shrinkage * (t - 1) / t  # γ_t = β_t / t, β_t = (t-1)ρ (Eq. 17)

    @torch.no_grad()
    def add_sample(self, x: torch.Tensor) -> None:
        self.count += 1
        t = self.count
        if t == 1:
            self.mean = x.clone()
            self.scaled_delta = self.x0 - x  # Eq. 21
            return
        stored = t - 2
        directions = self.directions[:stored]
        u = x - self.mean  # Eq. 22
        v = u - directions.T @ (self.weights[:stored] * (directions @ u))  # Eqs. 25, 28: v_{t-1,t} = Σ̃_{t-1}⁻¹ u_t
        gamma = self.gamma(t)
        denominator = 1.0 + gamma * torch.dot(u, v)  # >= 1: Σ̃_{t-1} is positive definite
        # Eq. 23, its coefficient simplified: 1 + γ(t uᵀΔ̃ - uᵀv)/den = (1 + γ t uᵀΔ̃)/den.
        coefficient = (1.0 + gamma * t * torch.dot(u, self.scaled_delta)) / (denominator * t)
        self.scaled_delta.sub_(coefficient * v)
        self._store(stored, v, gamma / denominator)
        self.mean.add_(u, alpha=1.0 / t)  # Eq. 13, only after u_t was used

    def _store(self, row: int, direction: torch.Tensor, weight: torch.Tensor) -> None:
        if row == len(self.directions):  # more samples than the capacity: double it
            self.directions = torch.cat([self.directions, torch.empty_like(self.directions)])
            self.weights = torch.cat([self.weights, torch.empty_like(self.weights)])
        self.directions[row] = direction
        self.weights[row] = weight

    def delta(self) -> torch.Tensor:
        """Δ̂_t = Δ̃_t / ρ_t (Eq. 24)."""
        if self.count == 0:
            raise ValueError("no posterior sample yet")
        return self.scaled_delta * (1.0 + (self.count - 1) * self.shrinkage)

    def iterate_average_delta(self) -> torch.Tensor:
        """x_0 - x̄_t: the delta with Σ̂ = I (ρ = 0)."""
        return self.x0 - self.mean


# ---- samplers: each hands flat samples to a SampleSink as soon as it has them ----------------------
@dataclass
class IASG:
    """Alg. 4 with K = one epoch: train `burnin_epochs + samples` epochs; after the burn-in epochs, the
    mean of each epoch's post-step iterates is one sample. The chain (weights and optimizer state) runs
    on across epochs. Returns the last epoch's mean loss and the seconds spent, DP included."""

    model: torch.nn.Module  # on `device`, at x_0
    data: Dataset
    optimizer: torch.optim.Optimizer
    batch_size: int
    device: torch.device
    seed: int
    burnin_epochs: int
    samples: int
    loss_fn: Loss = F.cross_entropy

    def __call__(self, emit: SampleSink) -> tuple[float, float]:
        parameters = list(self.model.parameters())
        steps_per_epoch = math.ceil(len(self.data.labels) / self.batch_size)
        discarded = self.burnin_epochs * steps_per_epoch
        window = [torch.zeros_like(p) for p in parameters]
        step = 0

        @torch.no_grad()
        def average_iterates() -> None:
            nonlocal step
            step += 1
            if step <= discarded:
                return
            for total, parameter in zip(window, parameters):
                total.add_(parameter)
            if (step - discarded) % steps_per_epoch == 0:
                emit(torch.cat([total.flatten() for total in window]).div_(steps_per_epoch))
                for total in window:
                    total.zero_()

        return train_epochs(
            self.model, self.data, self.optimizer, self.burnin_epochs + self.samples, self.batch_size, self.device,
            seed=self.seed, loss_fn=self.loss_fn, after_step=average_iterates,
        )


@dataclass
class ExactGaussianSampler:
    """`count` exact samples of N(mean, covariance_factor covariance_factorᵀ) (the spec's T3 sampler,
    [C-JAX] ExactQuadraticSampler): the local posterior of a least-squares client, no SGD."""

    mean: torch.Tensor
    covariance_factor: torch.Tensor  # L with Σ_i = L Lᵀ
    count: int
    generator: torch.Generator

    def __call__(self, emit: SampleSink) -> None:
        for _ in range(self.count):
            noise = torch.randn(self.mean.numel(), generator=self.generator, dtype=self.mean.dtype)
            emit(self.mean + self.covariance_factor @ noise)


# ---- server half ----------------------------------------------------------------------------------
class ServerOptimizer:
    """SERVEROPT of Alg. 1: a torch optimizer over the flat global model (float64), stepped with the
    averaged client delta as its gradient (spec §2.2: SGD/momentum = FedAvgM, Adam with bias correction
    as the released code's Keras Adam, Adagrad with an initial accumulator)."""

    def __init__(self, settings: RunSettings, size: int) -> None:
        self.theta = torch.nn.Parameter(torch.zeros(size, dtype=torch.float64))
        if settings.server_optimizer == "sgd":
            self.optimizer = torch.optim.SGD([self.theta], lr=settings.server_lr, momentum=settings.server_momentum)
        elif settings.server_optimizer == "adam":
            self.optimizer = torch.optim.Adam([self.theta], lr=settings.server_lr,
                                              betas=(settings.server_beta1, settings.server_beta2),
                                              eps=settings.server_eps)
        else:
            self.optimizer = torch.optim.Adagrad([self.theta], lr=settings.server_lr, eps=settings.server_eps,
                                                 initial_accumulator_value=settings.server_adagrad_init)

    def step(self, theta: torch.Tensor, pseudo_gradient: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.theta.copy_(theta)
        self.theta.grad = pseudo_gradient.to(torch.float64).clone()
        self.optimizer.step()
        return self.theta.detach().clone()

    def state(self) -> dict[str, np.ndarray]:
        state = self.optimizer.state_dict()["state"].get(0, {})
        return {key: value.detach().numpy().copy() for key, value in state.items() if isinstance(value, torch.Tensor)}

    def load_state(self, tensors: dict[str, np.ndarray]) -> None:
        saved = self.optimizer.state_dict()
        saved["state"] = {0: {key: torch.from_numpy(value.copy()) for key, value in tensors.items()}} if tensors else {}
        self.optimizer.load_state_dict(saved)


def weighted_mean_delta(deltas: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Alg. 1 line 8 as both official codes compute it: Σ n_i Δ_i / Σ n_i (spec §2.1, pitfall 7)."""
    total = sum(weights)
    return sum(w / total * delta for w, delta in zip(weights, deltas))


class FedPA(WireStrategy):
    """FedPA's server: generalized federated optimization (Alg. 1) with burn-in and sampling rounds."""

    reply_type = pb.FedPAReply
    robust_rules = RULES

    def __init__(self, settings: RunSettings, layout: TensorLayout) -> None:
        super().__init__(settings, layout)
        self.server_optimizer = ServerOptimizer(settings, sum(math.prod(shape) for shape in layout.values()))
        self.theta: torch.Tensor | None = None  # the global model sent this round, flat float64

    def is_sampling_round(self, server_round: int) -> bool:
        return server_round > self.settings.burn_in_rounds

    def instruction(self, server_round, arrays, nodes):
        settings = self.settings
        weights = {name: arrays[name].numpy() for name in self.layout}
        self.theta = torch.from_numpy(flatten(weights, self.layout))
        sampling = self.is_sampling_round(server_round)
        instruction = pb.FedPAInstruction(
            training=local_training(
                settings, server_round, weight_decay=settings.weight_decay,
                epochs=settings.local_burnin_epochs + settings.samples if sampling else None,
            ),
            sampling=sampling, shrinkage=settings.shrinkage, local_burnin_epochs=settings.local_burnin_epochs,
            samples=settings.samples,
        )
        return instruction, {"weights": weights}

    def reply_layouts(self):
        return {"delta": self.layout}

    def update_of(self, payload: Payload) -> np.ndarray:
        return flatten(payload.tensors["delta"], self.layout)

    def state_norm(self) -> float:
        return self.theta.norm().item()

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        examples = [float(p.message.num_examples) for p in payloads]
        settings = self.settings
        if settings.robust_aggregation == "none":
            deltas = [torch.from_numpy(self.update_of(p)) for p in payloads]
            pseudo_gradient = weighted_mean_delta(deltas, examples)
        else:
            pseudo_gradient = torch.from_numpy(robust_mean([self.update_of(p) for p in payloads], examples,
                                                           settings.robust_aggregation, settings.clip_ratio,
                                                           settings.trim_fraction))
        if not torch.isfinite(pseudo_gradient).all():  # finite deltas can still overflow their sum
            raise RoundRejected("the averaged delta is not finite")
        server_optimizer = copy.deepcopy(self.server_optimizer)  # stepped here, kept only if the round commits
        theta = server_optimizer.step(self.theta, pseudo_gradient)
        if not torch.isfinite(theta).all():
            raise RoundRejected("the global model would be non-finite; lower server-lr")
        metrics = {
            "delta-norm": pseudo_gradient.norm().item(),
            "samples": float(np.mean([p.message.samples for p in payloads])),
            "correction-norm": float(np.mean([p.message.correction_norm for p in payloads])),
        }
        log(INFO, "round %d (%s): |Δ| %.4g, mean samples %.1f, mean |Δ - (x0 - x̄)| %.4g", server_round,
            "sampling" if self.is_sampling_round(server_round) else "burn-in", metrics["delta-norm"],
            metrics["samples"], metrics["correction-norm"])
        return Update(theta.numpy(), {"server_optimizer": server_optimizer}, metrics)

    def state_dict(self) -> ServerState:
        """The server optimizer's state (momentum, Adam moments, Adagrad sums, step count)."""
        state = super().state_dict()
        state.tensors |= {f"optimizer/{key}": value for key, value in self.server_optimizer.state().items()}
        return state

    def global_posterior(self) -> GlobalPosterior:
        return GlobalPosterior("a point estimate θ: FedPA's server holds no posterior estimate beyond it (each "
                               "client's shrinkage covariance Σ̂ stays on the client, which sends only "
                               "Δ = Σ̂⁻¹(θ − x̄))")

    def load_state_dict(self, state: ServerState) -> None:
        super().load_state_dict(state)
        prefix = "optimizer/"
        self.server_optimizer.load_state(
            {name[len(prefix):]: value for name, value in state.tensors.items() if name.startswith(prefix)})


# ---- client half ----------------------------------------------------------------------------------
def local_update(local: LocalRound) -> LocalResult:
    """FedAvg's local training in burn-in rounds; IASG + the App. C delta in sampling rounds."""
    instruction, runtime, server_round = local.instruction, local.runtime, local.server_round
    set_parameters(runtime.model, local.tensors["weights"])
    x0 = parameters_to_vector(runtime.model.parameters()).detach().clone()
    samples, correction_norm = 0, 0.0
    if instruction.sampling:
        model = runtime.model.to(runtime.device)
        estimate = ShrinkageDelta(x0.to(runtime.device), instruction.shrinkage, capacity=instruction.samples)
        iasg = IASG(model, runtime.data, make_optimizer(model, instruction.training), instruction.training.batch_size,
                    runtime.device, runtime.local_seed(instruction.training.seed, server_round),
                    instruction.local_burnin_epochs, instruction.samples)
        train_loss, compute_seconds = iasg(estimate.add_sample)
        delta = estimate.delta()
        samples, correction_norm = estimate.count, (delta - estimate.iterate_average_delta()).norm().item()
        delta = delta.cpu()
        model.cpu()
    else:
        train_loss, compute_seconds = train_locally(runtime, instruction.training, server_round)
        delta = x0 - parameters_to_vector(runtime.model.parameters()).detach()
    if not torch.isfinite(delta).all():
        raise FloatingPointError(
            f"{runtime.node.client_id}: the FedPA delta of round {server_round} is not finite "
            f"({'sampling' if instruction.sampling else 'burn-in'} round); lower lr or shrinkage"
        )
    reply = pb.FedPAReply(train_loss=train_loss, compute_seconds=compute_seconds, samples=samples,
                          correction_norm=correction_norm)
    return LocalResult(reply, {"delta": unflatten(delta.numpy(), runtime.layout)})


client_update = ClientHalf(pb.FedPAInstruction, local_update, model_layouts("weights"))
