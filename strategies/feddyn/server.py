"""FedDyn's server half: w_g, its replay of every client's λ_k (checked against each reply's sketch), K and N."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from flwr.app import ArrayRecord

from fedbayes.bayes.params import TensorLayout, flatten, unflatten
from fedbayes.bayes.robust import RULES, robust_mean
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, PayloadError
from fedbayes.strategies.base import (
    ForgetRefused,
    Forgotten,
    RoundRejected,
    ServerState,
    ServerStrategy,
    TensorGroups,
    Update,
    local_training,
    steps_per_epoch,
)
from fedbayes.strategies.feddyn.math import (
    SKETCH_ROWS,
    SKETCH_RTOL,
    ClientLambda,
    as_sent,
    lambda_step,
    server_step,
    server_step_without,
    sketch_mismatch,
    total_lambda,
)
from fedbayes.strategies.feddyn.settings import FedDynSettings
from fedbayes.strategies.membership import Membership


@dataclass(frozen=True)
class FedDynState:
    """w_g as sent (float32-representable float64; None until round 1 sets it from the initial model), the server's
    replay of every known client's λ_k, and the clients it counts in K and N."""

    global_: torch.Tensor | None = None
    lambdas: dict[str, ClientLambda] = field(default_factory=dict)
    membership: Membership = field(default_factory=Membership)


class FedDyn(ServerStrategy[FedDynState]):
    """FedDyn: w_g ← mean of this round's w_k + Λ/K, with Λ = Σ_k λ_k over every known client (the package
    docstring)."""

    reply_type = pb.FedDynReply
    robust_rules = RULES
    fresh_start = "its λ_k restarts from zero"
    hyperparameters: FedDynSettings

    def initial_state(self) -> FedDynState:
        """The state before round 1.

        Returns:
            No w_g yet (round 1's instruction sets it from the initial model), no λ_k, no known clients.
        """
        return FedDynState()

    @property
    def global_(self) -> torch.Tensor:
        assert self.state.global_ is not None, "w_g is set in round 1's instruction"
        return self.state.global_

    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedDynInstruction, TensorGroups]:
        """This round's instruction: the anchored local solve from w_g. Round 1's also sets w_g from `arrays`.

        Args:
            server_round: the round, >= 1; it sets the learning rate.
            arrays: the global arrays the core holds; only round 1 reads them (the parameters of `layout`).
            nodes: the nodes the round is sent to; their count stands in for K while no client is known yet.

        Returns:
            The instruction (local training, α, K and N as the server counts them, the gradient-norm clip) and its
            tensor group "global_weights": w_g as float32 arrays.
        """
        if self.state.global_ is None:
            initial = flatten({n: arrays[n].numpy() for n in self.layout}, self.layout)
            self.state = replace(self.state, global_=as_sent(torch.from_numpy(initial)))
        membership = self.state.membership
        instruction = pb.FedDynInstruction(
            training=local_training(self.settings.training, server_round, weight_decay=self.settings.weight_decay),
            alpha=self.hyperparameters.feddyn_alpha,
            known_clients=membership.clients or len(nodes),
            known_examples=membership.total_examples,
            max_grad_norm=self.hyperparameters.max_grad_norm,
        )
        return instruction, {"global_weights": unflatten(self.global_.numpy(), self.layout)}

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layout of a reply's tensors.

        Returns:
            {"weights": layout}: the client's w_k.
        """
        return {"weights": self.layout}

    def check_reply(self, payload: Payload) -> None:
        """The server replays λ_k from the round the client started from: its last accepted round, or 0 when the client
        is
        new or lost its state (λ_k = 0 on both sides then); the client's sketch of its λ_k must match the sketch of that
        replay.

        Args:
            payload: a reply the core has checked; its `lambda_sketch` and w_k are compared.

        Raises:
            PayloadError: the sketch does not have SKETCH_ROWS values, or is off the replay's by more than SKETCH_RTOL
                of Σ|λ_k|.
        """
        message = payload.message
        if len(message.lambda_sketch) != SKETCH_ROWS:
            raise PayloadError(f"field 'lambda_sketch': {len(message.lambda_sketch)} values, expected {SKETCH_ROWS}")
        replayed = self._replayed_lambda(payload)
        mismatch = sketch_mismatch(
            torch.tensor(list(message.lambda_sketch), dtype=torch.float64),
            replayed,
            self.settings.seed,
            payload.header.server_round,
        )
        if mismatch > SKETCH_RTOL:
            raise PayloadError(
                f"field 'lambda_sketch': the client's λ_k differs from the server's replay "
                f"(sketch off by {mismatch:.2e} of Σ|λ_k|; at most {SKETCH_RTOL:g})"
            )

    def _replayed_lambda(self, payload: Payload) -> torch.Tensor:
        """λ_k after this reply, as the server replays it (λ_k += w_k − w_g from the state it started from)."""
        previous = (
            self.state.lambdas[payload.header.client_id].value
            if payload.reply.resumed_from_round
            else torch.zeros_like(self.global_)
        )
        return lambda_step(previous, self._local(payload), self.global_)

    def _local(self, payload: Payload) -> torch.Tensor:
        return torch.from_numpy(flatten(payload.tensors["weights"], self.layout))

    def update_of(self, payload: Payload) -> np.ndarray:
        """The reply's update, what the screen measures.

        Args:
            payload: an accepted reply.

        Returns:
            w_k − w_g, flat float64 in layout order.
        """
        return (self._local(payload) - self.global_).numpy()

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`.

        Returns:
            ‖w_g‖.
        """
        return self.global_.norm().item()

    def update_scale(self, payload: Payload) -> float:
        """The client's SGD steps an epoch: its weights' change is their sum.

        Args:
            payload: an accepted reply; its num_examples sets the steps.

        Returns:
            ⌈num_examples / batch-size⌉, > 0.
        """
        return steps_per_epoch(payload, self.settings.training)

    def absorb(self, payloads: list[Payload], server_round: int) -> Update[FedDynState]:
        """The server step from the round's accepted replies, without changing the strategy: each reply's λ_k replayed,
        its client counted in K and N, and w_g ← mean of this round's w_k + Λ/K (under a robust rule, w_g + R(w_k − w_g)
        + R(λ_k)).

        Args:
            payloads: the accepted replies, in client-id order, checked by check_reply.
            server_round: the round, recorded as each replying client's last.

        Returns:
            The new w_g (as sent: float32 values), the state with the replayed λ_k and membership, and the metric
            "known-clients" (K).

        Raises:
            RoundRejected: the new w_g would be non-finite.
        """
        locals_, lambdas, membership = [], dict(self.state.lambdas), self.state.membership.copy()
        for payload in payloads:
            client = payload.header.client_id
            lambdas[client] = ClientLambda(self._replayed_lambda(payload), server_round)
            membership.record(client, payload.reply.num_examples, server_round)
            locals_.append(self._local(payload))
        if self.settings.robust_aggregation == "none":
            global_ = server_step(locals_, total_lambda(lambdas), membership.clients)
        else:
            global_ = self.global_ + self._robust_step(locals_, lambdas)
        global_ = as_sent(global_)
        if not torch.isfinite(global_).all():
            raise RoundRejected("the global model would be non-finite; lower feddyn-alpha or lr")
        return Update(global_.numpy(), FedDynState(global_, lambdas, membership), {"known-clients": membership.clients})

    def forget(self, client: str) -> Forgotten[FedDynState]:
        """Drop λ_k and client k from K and N; w_g' = the first server step without k at the fixed point
        (`server_step_without`; under a robust rule, that rule over the remaining λ_j): an estimate (package doc).

        Args:
            client: the client id to forget.

        Returns:
            The new w_g and state, not exact, with no KL (FedDyn holds no posterior) and a note on what was done.

        Raises:
            ForgetRefused: the client is unknown or the last one (check_forgettable), or w_g' would be non-finite.
        """
        self.check_forgettable(client, self.state.lambdas)
        lambdas = {c: entry for c, entry in self.state.lambdas.items() if c != client}
        if self.settings.robust_aggregation == "none":
            global_ = server_step_without(self.global_, [entry.value for entry in lambdas.values()])
        else:
            global_ = self.global_ + self._robust_step([self.global_], lambdas)
        global_ = as_sent(global_)
        if not torch.isfinite(global_).all():
            raise ForgetRefused(f"without client {client!r} the global model would be non-finite")
        rule = "mean" if self.settings.robust_aggregation == "none" else self.settings.robust_aggregation
        note = (
            f"w_g + the {rule} of the {len(lambdas)} remaining λ_j: FedDyn's first server step without {client!r} "
            "at the fixed point, not the model trained without it; run refinement rounds among the others"
        )
        state = FedDynState(global_, lambdas, self.state.membership.without(client))
        return Forgotten(global_.numpy(), state, exact=False, kl_before_after=None, note=note)

    def _robust_step(self, locals_: list[torch.Tensor], lambdas: dict[str, ClientLambda]) -> torch.Tensor:
        """R(w_k − w_g) over this round's replies + R(λ_k) over every known client: server_step with each mean
        replaced by the run's robust rule (unweighted, as FedDyn's means are)."""
        settings = self.settings

        def robust(vectors: list[torch.Tensor]) -> torch.Tensor:
            values = [vector.numpy() for vector in vectors]
            return torch.from_numpy(
                robust_mean(
                    values,
                    [1.0] * len(values),
                    settings.robust_aggregation,
                    settings.clip_ratio,
                    settings.trim_fraction,
                )
            )

        return robust([local - self.global_ for local in locals_]) + robust([entry.value for entry in lambdas.values()])

    def save_state(self, state: FedDynState) -> ServerState:
        """`state` as a checkpoint holds it.

        Args:
            state: a FedDyn state.

        Returns:
            w_g ("global"), every λ_k with its round ("lambda"), and the membership as metadata; nothing before round 1.
        """
        saved = ServerState()
        if state.global_ is not None:
            saved.tensors["global"] = state.global_.numpy()
            saved.add_per_client("lambda", state.lambdas)
            saved.metadata |= state.membership.to_metadata()
        return saved

    def load_state(self, saved: ServerState) -> FedDynState:
        """The state `save_state` saved.

        Args:
            saved: a checkpoint's strategy state.

        Returns:
            w_g, the λ_k and the membership; the initial state for a checkpoint saved before round 1.
        """
        if "global" not in saved.tensors:
            return FedDynState()
        return FedDynState(
            torch.from_numpy(saved.tensors["global"].copy()),
            saved.per_client("lambda", ClientLambda),
            Membership.from_metadata(saved.metadata),
        )
