"""FedDyn (Acar et al., 2021) in the official code's form (../shared/specs/feddyn-fedlap-splits.md §2.2).

  client k:  w_k ← argmin_w  L_k(w) + (α_k/2)‖w − (w_g − λ_k)‖² + (wd/2)‖w‖²,   α_k = α·N/(K·N_k)
             λ_k ← λ_k + (w_k − w_g)                                         ("local_param_list += curr − cld")
  server:    w_g ← mean_{k replied} w_k + (1/K) Σ_{all k} λ_k
L_k is the mean minibatch loss; wd is the run's `weight-decay` (Adam's coupled weight decay, = the explicit
term). Eq. 2 of [P] with v_k = α_k λ_k is the same algorithm (§2.3). Fixed point: argmin Σ_k ℓ_k + (N·wd/2)‖w‖²
(§2.3), with wd = 0 the unregularised optimum. Each client uses its own α_k (the reference code overwrote every
client's α with the last client's; we do not).

Where the state lives: λ_k in the client's durable store (client/state.py), so it survives a SuperNode restart.
The server keeps its own replay of every λ_k (λ_k += w_k − w_g from the w_k it receives), so it knows
Λ = Σ_k λ_k without the clients sending λ_k; the uplink is w_k plus a sketch R·λ_k of SKETCH_ROWS numbers (R a
±1 matrix drawn from the round's seed), which the server compares with R applied to its replay: a client whose
λ_k has drifted from the server's (an edited or foreign state) is refused, not trusted.

Robust aggregation (run config `robust-aggregation`): w_g ← w_g + R_k(w_k − w_g) + R_k(λ_k), with R the clip,
median or trimmed-mean of bayes/robust.py over this round's replies and over every known λ_k; `none` is the
plain means above.

Membership (strategies/base.py Membership): K and N count the clients the server has heard from. Partial
participation (`fraction-train` < 1): the mean runs over this round's repliers, Λ over every known client's λ_k,
as in FedDyn's Alg. 1. In round 1 the server knows no sizes, so every client uses α_k = α. A client joining
mid-run starts at λ_k = 0 and the current w_g, and counts itself into K and N for its α_k; from its first reply
on it is in the server's K and N, which moves every α_k a little (the fixed point only depends on the final
α_k). A client that lost its state (it reports resumed_from_round 0 but the server knows it) starts again from
λ_k = 0; the server resets its replay of that λ_k too, so Λ stays the sum of the clients' actual λ_k.

Forgetting a client (`forget`, ../shared/specs/forget.md): λ_k is a gradient correction, not a probabilistic factor,
and the server does not store the clients' last models. At the fixed point every w_j = w_g, Σ_j λ_j = 0 and
α_j λ_j = −(∇L_j(w*) + wd·w*); a remaining client whose w_g and λ_j did not change replies w_g, so the first server
step without k needs no client work: w_g' = w_g + Σ_{j≠k} λ_j/(K−1) = w_g − λ_k/(K−1) (`server_step_without`). As
N_j α_j = αN/K, that is one gradient step of size K/((K−1)αN) from w* on the remaining objective
Σ_{j≠k} ℓ_j + (N'·wd/2)‖w‖² (N' = N − N_k): an estimate, not the model trained without k. The remaining λ_j stay (the
clients hold them; the server's replay must match) and K, N stop counting k, which moves every α_j a little; refinement
rounds among the remaining clients are the honest route to the model without k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedbayes.bayes.params import flatten, unflatten
from fedbayes.bayes.robust import RULES, robust_mean
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_layouts
from fedbayes.client.training import train_anchored
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, PayloadError, TensorLayout
from fedbayes.strategies.base import (
    ForgetRefused, Forgotten, Membership, RoundRejected, ServerState, Update, WireStrategy, client_population,
    local_training,
)
from fedbayes.tasks.config import NON_NEGATIVE, POSITIVE, Key, RunSettings, round_seed

# ../shared/specs/feddyn-fedlap-splits.md §2, §8. The local weight decay is the run's `weight-decay`.
MAX_GRAD_NORM = Key("max-grad-norm", 0.0, "clip local gradients at this norm; 0 = off (the official FedDyn code: 10)",
                    NON_NEGATIVE)
HYPERPARAMETERS = (
    Key("feddyn-alpha", 0.01, "α; client k uses α_k = α·N/(K·N_k) (paper FMNIST grid 1e-2..1e-6)", POSITIVE),
    MAX_GRAD_NORM,
)


# ---- the math ---------------------------------------------------------------------------------------
def client_alpha(alpha: float, num_examples: int, known_clients: int, known_examples: int) -> float:
    """α_k = α·N/(K·N_k) ("alpha_coef_adpt" = α / (K·N_k/N)); α while no sizes are known (round 1)."""
    if known_examples == 0:
        return alpha
    return alpha * known_examples / (known_clients * num_examples)


def lambda_step(lam: torch.Tensor, local: torch.Tensor, global_: torch.Tensor) -> torch.Tensor:
    """λ_k ← λ_k + (w_k − w_g)."""
    return lam + (local - global_)


def server_step(local_weights: list[torch.Tensor], lambda_sum: torch.Tensor, known_clients: int) -> torch.Tensor:
    """w_g ← mean of this round's w_k + Λ/K."""
    return torch.stack(local_weights).mean(0) + lambda_sum / known_clients


def server_step_without(global_: torch.Tensor, remaining_lambdas: list[torch.Tensor]) -> torch.Tensor:
    """forget.md: the first server step without client k, each remaining client's reply taken to be w_g (its reply at
    the fixed point): w_g' = w_g + Σ_{j≠k} λ_j/(K−1), which is w_g − λ_k/(K−1) there (module docstring)."""
    return server_step([global_], torch.stack(remaining_lambdas).sum(0), len(remaining_lambdas))


SKETCH_ROWS = 8
SKETCH_RTOL = 1e-9  # both sides compute λ_k from the same float32 w_k and w_g in float64: only summation order differs


def lambda_sketch(lam: torch.Tensor, seed: int, server_round: int) -> torch.Tensor:
    """R·λ_k, R a SKETCH_ROWS x P matrix of ±1 drawn from (seed, round): the same on the client and the server.
    Any change of λ_k moves it except one orthogonal to all rows (probability 0 for a change not made to fool it;
    a client set on fooling it can just as well send a bad w_k, which the screen and robust aggregation bound)."""
    generator = torch.Generator().manual_seed(round_seed(seed, server_round))
    signs = torch.randint(0, 2, (SKETCH_ROWS, lam.numel()), generator=generator, dtype=torch.int8)
    return (2 * signs.double() - 1) @ lam.double()


def sketch_mismatch(reported: torch.Tensor, lam: torch.Tensor, seed: int, server_round: int) -> float:
    """The largest difference between a reported sketch and the sketch of `lam`, relative to Σ|λ_k| (which bounds
    every entry of a ±1 sketch)."""
    expected = lambda_sketch(lam, seed, server_round)
    return (reported - expected).abs().max().item() / max(lam.abs().sum().item(), 1e-300)


def as_sent(flat: torch.Tensor) -> torch.Tensor:
    """`flat` rounded to float32, as the clients receive it: the server replays λ_k += w_k − w_g with the same
    w_g the client subtracted, so the replay matches the client bit for bit."""
    return flat.to(torch.float32).double()


@dataclass
class ClientLambda:
    value: torch.Tensor  # λ_k (float64)
    round: int  # the round it was last updated in


def total_lambda(lambdas: dict[str, ClientLambda]) -> torch.Tensor:
    """Λ = Σ_k λ_k over every known client."""
    return torch.stack([entry.value for entry in lambdas.values()]).sum(0)


# ---- server half --------------------------------------------------------------------------------------
class FedDyn(WireStrategy):
    reply_type = pb.FedDynReply
    robust_rules = RULES

    def __init__(self, settings: RunSettings, layout: TensorLayout) -> None:
        super().__init__(settings, layout)
        self.global_: torch.Tensor | None = None  # w_g, float32-representable float64
        self.lambdas: dict[str, ClientLambda] = {}  # the server's replay of every known client's λ_k
        self.membership = Membership()

    def instruction(self, server_round, arrays, nodes):
        if self.global_ is None:
            self.global_ = as_sent(torch.from_numpy(flatten({n: arrays[n].numpy() for n in self.layout}, self.layout)))
        settings = self.settings
        instruction = pb.FedDynInstruction(
            training=local_training(settings, server_round, weight_decay=settings.weight_decay),
            alpha=settings.feddyn_alpha,
            known_clients=self.membership.clients or len(nodes),
            known_examples=self.membership.total_examples,
            max_grad_norm=settings.max_grad_norm,
        )
        return instruction, {"global_weights": unflatten(self.global_.numpy(), self.layout)}

    def reply_layouts(self):
        return {"weights": self.layout}

    def check_reply(self, payload: Payload) -> None:
        """The server replays λ_k from the round the client started from: its last accepted round, or 0 when
        the client is new or lost its state (λ_k = 0 on both sides then); the client's sketch of its λ_k must
        match the sketch of that replay."""
        self.check_resumed(payload, "its λ_k restarts from zero")
        message = payload.message
        if len(message.lambda_sketch) != SKETCH_ROWS:
            raise PayloadError(f"field 'lambda_sketch': {len(message.lambda_sketch)} values, expected {SKETCH_ROWS}")
        replayed = self._replayed_lambda(payload)
        mismatch = sketch_mismatch(torch.tensor(list(message.lambda_sketch), dtype=torch.float64), replayed,
                                   self.settings.seed, message.header.server_round)
        if mismatch > SKETCH_RTOL:
            raise PayloadError(f"field 'lambda_sketch': the client's λ_k differs from the server's replay "
                               f"(sketch off by {mismatch:.2e} of Σ|λ_k|; at most {SKETCH_RTOL:g})")

    def _replayed_lambda(self, payload: Payload) -> torch.Tensor:
        """λ_k after this reply, as the server replays it (λ_k += w_k − w_g from the state it started from)."""
        message = payload.message
        previous = (self.lambdas[message.header.client_id].value if message.resumed_from_round
                    else torch.zeros_like(self.global_))
        return lambda_step(previous, self._local(payload), self.global_)

    def _local(self, payload: Payload) -> torch.Tensor:
        return torch.from_numpy(flatten(payload.tensors["weights"], self.layout))

    def update_of(self, payload: Payload) -> np.ndarray:
        return (self._local(payload) - self.global_).numpy()

    def state_norm(self) -> float:
        return self.global_.norm().item()

    def absorb(self, payloads: list[Payload], server_round: int) -> Update:
        locals_, lambdas, membership = [], dict(self.lambdas), self.membership.copy()
        for payload in payloads:
            message = payload.message
            client = message.header.client_id
            lambdas[client] = ClientLambda(self._replayed_lambda(payload), server_round)
            membership.record(client, message.num_examples, server_round)
            locals_.append(self._local(payload))
        if self.settings.robust_aggregation == "none":
            global_ = server_step(locals_, total_lambda(lambdas), membership.clients)
        else:
            global_ = self.global_ + self._robust_step(locals_, lambdas)
        global_ = as_sent(global_)
        if not torch.isfinite(global_).all():
            raise RoundRejected("the global model would be non-finite; lower feddyn-alpha or lr")
        return Update(global_.numpy(), {"global_": global_, "lambdas": lambdas, "membership": membership},
                      {"known-clients": membership.clients})

    def forget(self, client: str) -> Forgotten:
        """forget.md: drop λ_k and client k from K and N; w_g' = the first server step without k at the fixed point
        (`server_step_without`; under a robust rule, that rule over the remaining λ_j): an estimate (module doc)."""
        self.check_forgettable(client, self.lambdas)
        lambdas = {c: entry for c, entry in self.lambdas.items() if c != client}
        if self.settings.robust_aggregation == "none":
            global_ = server_step_without(self.global_, [entry.value for entry in lambdas.values()])
        else:
            global_ = self.global_ + self._robust_step([self.global_], lambdas)
        global_ = as_sent(global_)
        if not torch.isfinite(global_).all():
            raise ForgetRefused(f"without client {client!r} the global model would be non-finite")
        rule = "mean" if self.settings.robust_aggregation == "none" else self.settings.robust_aggregation
        note = (f"w_g + the {rule} of the {len(lambdas)} remaining λ_j: FedDyn's first server step without {client!r} "
                "at the fixed point, not the model trained without it; run refinement rounds among the others")
        state = {"global_": global_, "lambdas": lambdas, "membership": self.membership.without(client),
                 **self.core_state_without(client)}
        return Forgotten(global_.numpy(), state, exact=False, kl_before_after=None, note=note)

    def _robust_step(self, locals_: list[torch.Tensor], lambdas: dict[str, ClientLambda]) -> torch.Tensor:
        """R(w_k − w_g) over this round's replies + R(λ_k) over every known client: server_step with each mean
        replaced by the run's robust rule (unweighted, as FedDyn's means are)."""
        settings = self.settings

        def robust(vectors: list[torch.Tensor]) -> torch.Tensor:
            values = [vector.numpy() for vector in vectors]
            return torch.from_numpy(robust_mean(values, [1.0] * len(values), settings.robust_aggregation,
                                                settings.clip_ratio, settings.trim_fraction))

        return robust([local - self.global_ for local in locals_]) + robust([entry.value for entry in lambdas.values()])

    @property
    def lambda_sum(self) -> torch.Tensor:
        return total_lambda(self.lambdas)

    def state_dict(self) -> ServerState:
        state = super().state_dict()
        if self.global_ is not None:
            state.tensors["global"] = self.global_.numpy()
            state.add_per_client("lambda", self.lambdas)
            state.metadata |= self.membership.to_metadata()
        return state

    def load_state_dict(self, state: ServerState) -> None:
        super().load_state_dict(state)
        if "global" not in state.tensors:
            return
        self.global_ = torch.from_numpy(state.tensors["global"].copy())
        self.lambdas = state.per_client("lambda", ClientLambda)
        self.membership = Membership.from_metadata(state.metadata)


# ---- client half ----------------------------------------------------------------------------------
LAMBDA_KEY = "feddyn_lambda"


def local_update(local: LocalRound) -> LocalResult:
    """Train on the FedDyn objective from w_g, update λ_k (kept in the durable store), send w_k back."""
    instruction, runtime, stored = local.instruction, local.runtime, local.stored
    global_ = torch.from_numpy(flatten(local.tensors["global_weights"], runtime.layout))
    lam = stored.tensors[LAMBDA_KEY].double() if stored is not None else torch.zeros_like(global_)
    if lam.shape != global_.shape:
        raise ValueError(f"stored λ_k has {lam.numel()} values, this run's model has {global_.numel()}")
    known_clients, known_examples = client_population(
        instruction.known_clients, instruction.known_examples, local.num_examples, fresh=stored is None
    )
    alpha_k = client_alpha(instruction.alpha, local.num_examples, known_clients, known_examples)
    weights, train_loss, seconds = train_anchored(
        runtime, instruction.training, start=global_, anchor=global_ - lam, weight=alpha_k,
        server_round=local.server_round, max_grad_norm=instruction.max_grad_norm,
    )
    lam = lambda_step(lam, weights, global_)
    sketch = lambda_sketch(lam, instruction.training.seed, local.server_round)
    return LocalResult(pb.FedDynReply(train_loss=train_loss, compute_seconds=seconds, lambda_sketch=sketch.tolist()),
                       {"weights": unflatten(weights.numpy(), runtime.layout)}, {LAMBDA_KEY: lam})


client_update = ClientHalf(pb.FedDynInstruction, local_update, model_layouts("global_weights"), stateful=True)
