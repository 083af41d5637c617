"""FedLap-Func's server half: FedLap's sites give w_lap, the server's fit to the clients' memory predictions gives w_g
([P] Eq. 17). The clients' memory inputs stay in this state: no instruction carries them."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import torch
from flwr.app import ArrayRecord
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.gaussian import Gaussian, kl_divergence
from fedbayes.bayes.params import TensorLayout, parameter_layout
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
)
from fedbayes.strategies.fedlap.math import as_sent
from fedbayes.strategies.fedlap.server import FedLap, FedLapState
from fedbayes.strategies.fedlap_func.math import fit_global, point_weights, probability_rows_error
from fedbayes.strategies.fedlap_func.settings import FedLapFuncSettings
from fedbayes.tasks.compute import resolve_device
from fedbayes.tasks.config import ConfigError, RunSettings
from fedbayes.tasks.models import build_run_model
from fedbayes.tasks.preflight import input_shape_and_classes

PROBABILITY_TOLERANCE = 1e-4  # a float32 softmax row sums to 1 within ~1e-6 for any class count used here
EXAMPLES_TOLERANCE = 1e-9  # relative: Σ_i N_{k,c}/M_{k,c} = N_k up to float64 rounding


@dataclass
class Memory:
    """One client's memory points M_k as the server keeps them: its raw training inputs (float32, the task's input
    shape), the examples each stands for (N_{k,c}/M_{k,c}, float64), and its soft predictions on them at its w_k of
    `round` (float32, as sent)."""

    inputs: torch.Tensor
    represented: torch.Tensor
    predictions: torch.Tensor
    round: int = 0


@dataclass(frozen=True)
class FedLapFuncState:
    """FedLap's state (its global_mean is w_g, the server's fit; w_lap is computed from the sites) and every client's
    memory points."""

    sites: FedLapState = field(default_factory=FedLapState)
    memories: dict[str, Memory] = field(default_factory=dict)


class FedLapFunc(ServerStrategy[FedLapFuncState]):
    """FedLap-Func (the package docstring): FedLap's server half for the sites, then the fit of w_g."""

    reply_type = pb.FedLapFuncReply
    robust_rules = FedLap.robust_rules
    fresh_start = "its new site and predictions replace the old ones; its memory inputs must be the ones it sent"
    hyperparameters: FedLapFuncSettings

    def __init__(self, settings: RunSettings, layout: TensorLayout, buffer_layout: TensorLayout | None = None) -> None:
        if buffer_layout and settings.hyperparameters(FedLapFuncSettings).memory_points_per_class:
            # the fit runs the model on the memory points between rounds, where it has no global buffers to run with
            raise ConfigError(
                f"fedlap-func: the model has buffers ({', '.join(list(buffer_layout)[:3])}); the server's fit of w_g "
                "runs the model without the global batch statistics: use a model without BatchNorm (e.g. GroupNorm), "
                "or memory-points-per-class=0 (FedLap)"
            )
        self.fedlap = FedLap(settings, layout, buffer_layout)  # the weight-space half, on this state's sites
        super().__init__(settings, layout, buffer_layout)

    def initial_state(self) -> FedLapFuncState:
        """The state before round 1.

        Returns:
            FedLap's initial state (no q_g, no sites, no known clients) and no memory points.
        """
        return FedLapFuncState()

    def _weight_space(self) -> FedLap:
        """FedLap's half holding this state's sites: the weight-space part of every hook."""
        self.fedlap.commit(self.state.sites)
        return self.fedlap

    @cached_property
    def task(self) -> tuple[tuple[int, ...], int]:
        """One example's shape and the class count of the run's dataset: what a memory input and a prediction are."""
        return input_shape_and_classes(self.settings.dataset)

    @cached_property
    def model(self) -> torch.nn.Module:
        """The run's model in eval mode on the run's device: the server's fit trains its parameters from w_lap."""
        shape, classes = self.task
        settings = self.settings
        model = build_run_model(settings.architecture, shape, classes)
        if parameter_layout(model) != dict(self.layout):
            raise ConfigError(
                f"fedlap-func: the model {settings.model!r} built for {settings.dataset!r} has other parameters than "
                "the run's: the server's fit needs the clients' model"
            )
        return model.eval().to(resolve_device(settings.device))

    @property
    def capacity(self) -> int:
        """The most memory points a client may send: memory-points-per-class for every class."""
        return self.hyperparameters.memory_points_per_class * self.task[1]

    # ---- the round -------------------------------------------------------------------------------------------------
    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[pb.FedLapFuncInstruction, TensorGroups]:
        """This round's instruction: FedLap's (round 1's also sets q_g from `arrays`) plus the memory's settings.

        Args:
            server_round: the round, >= 1; it sets the learning rate.
            arrays: the global arrays the core holds; only round 1 reads them.
            nodes: the nodes the round is sent to (FedLap.instruction: K while no client is known, round 1's initial
                share).

        Returns:
            The instruction (FedLap's fields, memory-points-per-class and the function-space weight) and its tensor
                group
            "global_mean": w_g as float32 arrays (no precision travels: S_g = δ).
        """
        fedlap = self._weight_space()
        message, tensors = fedlap.instruction(server_round, arrays, nodes)
        self.state = replace(self.state, sites=fedlap.state)  # round 1: q_g from the initial model
        instruction = pb.FedLapFuncInstruction(
            training=message.training,
            prior_precision=message.prior_precision,
            known_clients=message.known_clients,
            known_examples=message.known_examples,
            initial_share=message.initial_share,
            max_grad_norm=message.max_grad_norm,
            site_damping=message.site_damping,
            memory_points_per_class=self.hyperparameters.memory_points_per_class,
            function_weight=self.hyperparameters.function_weight,
        )
        return instruction, {"global_mean": tensors["global_mean"]}

    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """A reply without memory points (the least a reply holds: what the payload-size checks bound).

        Returns:
            "site_mean": `layout`; "memory_inputs" and "memory_predictions": empty.
        """
        return {"site_mean": self.layout, "memory_inputs": {}, "memory_predictions": {}}

    def reply_layouts_for(self, message: ProtoMessage) -> Mapping[str, TensorLayout]:
        """M_k = `memory_points` rows of inputs (where it sends them) and of predictions; at most `capacity`.

        Args:
            message: the reply's FedLapFuncReply; `memory_points` and `sends_inputs` set the shapes.

        Returns:
            "site_mean": `layout`; "memory_inputs": {"inputs": (M_k, *input shape)} where it sends them, else empty;
            "memory_predictions": {"predictions": (M_k, classes)}, empty for M_k = 0.

        Raises:
            PayloadError: `memory_points` is over `capacity`.
        """
        assert isinstance(message, pb.FedLapFuncReply)
        count = message.memory_points
        if count > self.capacity:
            raise PayloadError(
                f"field 'memory_points': {count} is more than memory-points-per-class x classes = {self.capacity}"
            )
        shape, classes = self.task
        return {
            "site_mean": self.layout,
            "memory_inputs": {"inputs": (count, *shape)} if message.sends_inputs and count else {},
            "memory_predictions": {"predictions": (count, classes)} if count else {},
        }

    def check_reply(self, payload: Payload[pb.FedLapFuncReply]) -> None:
        """The memory points: at least one and at most memory-points-per-class x classes, their inputs once (from a
        client
        that starts afresh) and unchanged, the examples each stands for N_{k,c}/M_{k,c} summing to N_k, the predictions
        probability vectors.

        Args:
            payload: a reply the core has checked, its tensor shapes those of reply_layouts_for.

        Raises:
            PayloadError: no memory point where the run keeps some, inputs sent by a resuming client or not by a fresh
                one, predictions that are not probability rows, a count other than the points the server holds of the
                client, represented examples that are not N_{k,c}/M_{k,c} summing to N_k, or memory inputs other than
                those the client sent before.
        """
        message, client = payload.message, payload.header.client_id
        count, resumed = message.memory_points, payload.reply.resumed_from_round
        if self.hyperparameters.memory_points_per_class and count == 0:
            raise PayloadError("field 'memory_points': 0, but every client sends at least one memory point")
        if message.sends_inputs != (count > 0 and resumed == 0):
            raise PayloadError(
                "field 'sends_inputs': a client sends its memory inputs when it starts afresh (resumed_from_round 0), "
                f"and only then; this one resumes from round {resumed} with {count} memory points"
            )
        if count:
            error = probability_rows_error(self._predictions(payload), PROBABILITY_TOLERANCE)
            if error:
                raise PayloadError(f"field 'memory_predictions/predictions': {error}")
        known = self.state.memories.get(client)
        if message.sends_inputs:
            self._check_new_memory(payload, known)
        elif count and (known is None or len(known.inputs) != count):
            held = "none" if known is None else len(known.inputs)
            raise PayloadError(f"field 'memory_points': {count}, but the server holds {held} of client {client!r}")
        elif message.represented_examples:
            raise PayloadError("field 'represented_examples': sent with the memory inputs only")

    def _check_new_memory(self, payload: Payload[pb.FedLapFuncReply], known: Memory | None) -> None:
        message, client = payload.message, payload.header.client_id
        represented = np.asarray(message.represented_examples, dtype=np.float64)
        examples = payload.reply.num_examples
        if len(represented) != message.memory_points:
            raise PayloadError(
                f"field 'represented_examples': {len(represented)} values for {message.memory_points} memory points"
            )
        if (represented < 1).any() or abs(represented.sum() - examples) > EXAMPLES_TOLERANCE * examples:
            raise PayloadError(
                f"field 'represented_examples': each point stands for at least itself and together for the "
                f"client's {examples} examples; got {represented.min():g}..{represented.max():g}, sum "
                f"{represented.sum():g}"
            )
        class_sizes = represented * self.hyperparameters.memory_points_per_class  # N_{k,c} where the class has m
        if not np.all((represented == 1) | (np.abs(class_sizes - np.round(class_sizes)) <= EXAMPLES_TOLERANCE)):
            raise PayloadError(
                "field 'represented_examples': each is N_{k,c}/M_{k,c}, a class's examples over its memory points "
                "(memory-points-per-class of them, or all of a smaller class: then 1)"
            )
        if known is not None and not (
            np.array_equal(known.inputs.numpy(), payload.tensors["memory_inputs"]["inputs"])
            and np.array_equal(known.represented.numpy(), represented)
        ):
            raise PayloadError(
                f"field 'memory_inputs/inputs': client {client!r} sent other memory points before (round "
                f"{known.round} holds its newest predictions); a client's memory points are fixed once sent"
            )

    def absorb(self, payloads: list[Payload[pb.FedLapFuncReply]], server_round: int) -> Update[FedLapFuncState]:
        """FedLap's absorb (w_lap), each client's memory updated, then the fit of w_g; without changing the strategy.

        Args:
            payloads: the accepted replies, in client-id order, checked by check_reply.
            server_round: the round, recorded as each replying client's last and its predictions' round.

        Returns:
            w_g, the server's fit from w_lap to every client's memory predictions (as sent), the state with the sites
            and memories, and the metrics: FedLap's, "memory-points", "server-fit-seconds" and, where a fit ran,
            "server-fit-objective".

        Raises:
            RoundRejected: q_g (FedLap's absorb) or the fitted w_g would be non-finite.
        """
        weight_space = self._weight_space().absorb(payloads, server_round)
        memories = dict(self.state.memories)
        for payload in payloads:
            if payload.message.memory_points:
                client = payload.header.client_id
                memories[client] = self._memory(payload, memories.get(client), server_round)
        started = time.perf_counter()
        mean, objective = self._fit(weight_space.state.global_mean, memories)
        seconds = time.perf_counter() - started
        if not torch.isfinite(mean).all():
            raise RoundRejected("the server's fit of w_g to the memory predictions would be non-finite")
        state = FedLapFuncState(replace(weight_space.state, global_mean=mean), memories)
        metrics = {
            **weight_space.metrics,
            "memory-points": sum(len(memory.inputs) for memory in memories.values()),
            "server-fit-seconds": seconds,
        }
        if not math.isnan(objective):
            metrics["server-fit-objective"] = objective
        return Update(mean.numpy(), state, metrics)

    def _memory(self, payload: Payload[pb.FedLapFuncReply], known: Memory | None, server_round: int) -> Memory:
        predictions = self._predictions(payload)
        if payload.message.sends_inputs:
            inputs = torch.from_numpy(payload.tensors["memory_inputs"]["inputs"].copy())
            represented = torch.tensor(list(payload.message.represented_examples), dtype=torch.float64)
            return Memory(inputs, represented, predictions, server_round)
        assert known is not None, "check_reply refuses predictions without memory inputs"
        return replace(known, predictions=predictions, round=server_round)

    @staticmethod
    def _predictions(payload: Payload[pb.FedLapFuncReply]) -> torch.Tensor:
        return torch.from_numpy(payload.tensors["memory_predictions"]["predictions"].copy())

    def _fit(self, anchor: torch.Tensor | None, memories: Mapping[str, Memory]) -> tuple[torch.Tensor, float]:
        """w_g from w_lap = `anchor` and every client's memory points, in client-id order (fit_global); as sent."""
        assert anchor is not None, "w_lap is set with q_g in round 1's instruction"
        if not memories:
            return anchor, math.nan
        clients = sorted(memories)
        device = resolve_device(self.settings.device)
        inputs = torch.cat([memories[c].inputs for c in clients]).to(device)
        predictions = torch.cat([memories[c].predictions for c in clients]).to(device)
        represented = torch.cat([memories[c].represented for c in clients])
        taus = point_weights(represented, self.hyperparameters.function_weight)
        fitted, objective = fit_global(
            self.model,
            anchor,
            inputs,
            predictions,
            taus.to(device),
            self.hyperparameters.prior_precision,
            self.hyperparameters.server_fit_steps,
            self.hyperparameters.server_fit_lr,
        )
        return as_sent(fitted), objective

    # ---- forgetting, the screen, the posterior -----------------------------------------------------------------------
    def forget(self, client: str) -> Forgotten[FedLapFuncState]:
        """FedLap's forget of client k's site (w_lap without it), its memory inputs and predictions dropped, and w_g
        fitted
        again to the remaining clients' memory points.

        Args:
            client: the client id to forget.

        Returns:
            The new w_g and state, not exact, KL(q_before ‖ q_after) between the Gaussians N(w_g, I/δ), and a note on
            what was done.

        Raises:
            ForgetRefused: the client is unknown or the last one, or w_lap or the fitted w_g would be non-finite.
        """
        fedlap = self._weight_space()
        weight_space = fedlap.forget(client)
        assert isinstance(weight_space, Forgotten)  # FedLap forgets on the server alone
        memories = {other: memory for other, memory in self.state.memories.items() if other != client}
        mean, _ = self._fit(weight_space.state.global_mean, memories)
        if not torch.isfinite(mean).all():
            raise ForgetRefused(f"without client {client!r} the server's fit of w_g would be non-finite")
        precision = fedlap.global_precision
        kl = kl_divergence(Gaussian(fedlap.global_mean, precision), Gaussian(mean, precision))
        note = (
            f"w_lap from the prior and the {len(weight_space.state.sites)} remaining sites (a gradient step of size "
            f"1/δ on the remaining MAP), then the server's fit to the {len(memories)} remaining clients' memory "
            f"predictions; client {client!r}'s memory inputs and predictions are gone from the state; refinement "
            "rounds move it to the fixed point without it"
        )
        state = FedLapFuncState(replace(weight_space.state, global_mean=mean), memories)
        return Forgotten(mean.numpy(), state, exact=False, kl_before_after=kl, note=note)

    def update_of(self, payload: Payload[pb.FedLapFuncReply]) -> np.ndarray:
        """FedLap's: what the client's new site alone changes in the weight space.

        Args:
            payload: an accepted reply.

        Returns:
            w_g' − w_g followed by log S_g' − log S_g for that site alone, float64 (2P,).
        """
        return self._weight_space().update_of(payload)

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`.

        Returns:
            ‖(w_g, log S_g)‖, w_g the server's fit (FedLap.state_norm on the state's sites).
        """
        return self._weight_space().state_norm()

    def update_scale(self, payload: Payload[pb.FedLapFuncReply]) -> float:
        """FedLap's: ρ_k N_k, what the client's site step moves its site by.

        Args:
            payload: an accepted reply.

        Returns:
            ρ_k N_k, > 0.
        """
        return self._weight_space().update_scale(payload)

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the global posterior (`fedbayes export`).

        Returns:
            N(w_g, I/δ), w_g the server's fit, as a Gaussian over the flat parameters; before round 1, a point estimate.
        """
        posterior = self._weight_space().global_posterior()
        if posterior.gaussian is None:
            return posterior
        return replace(posterior, note="q_g = N(w_g, I/δ): w_g the server's fit to the sites and memory predictions")

    # ---- the checkpoint ----------------------------------------------------------------------------------------------
    def save_state(self, state: FedLapFuncState) -> ServerState:
        """`state` as a checkpoint holds it.

        Args:
            state: a FedLap-Func state.

        Returns:
            FedLap's part (FedLap.save_state) and every client's memory points with their round ("memory").
        """
        saved = self.fedlap.save_state(state.sites)
        saved.add_per_client("memory", state.memories)
        return saved

    def load_state(self, saved: ServerState) -> FedLapFuncState:
        """The state `save_state` saved.

        Args:
            saved: a checkpoint's strategy state.

        Returns:
            The sites' state and every client's memory points.
        """
        return FedLapFuncState(self.fedlap.load_state(saved), saved.per_client("memory", Memory))
