"""What a strategy's server half is and what its hooks take and give: the abstract base class `ServerStrategy`.

The server's round core (server/round_core.py) runs every round and owns everything strategies share: who may
reply and what a reply must be (the trust boundary), node sampling, headers, encoding, the round's metrics, the
model's buffers and the checkpoint. A strategy is its algorithm alone: the hooks below, its typed hyperparameters and
its declared state. It never sees the core: the core calls its hooks and, once a round (or a forget) is committed,
its `commit`.

    class MyStrategy(ServerStrategy[MyState]):
        reply_type = pb.MyReply                   # what its clients send (its run-config keys: its Algorithm's)

        def initial_state(self) -> MyState: ...                        # the state before round 1
        def instruction(self, server_round, arrays, nodes): ...         # (message, tensor groups) for the round
        def reply_layouts(self): ...                                     # each reply tensor group's layout
        def absorb(self, payloads, server_round) -> Update[MyState]: ... # the new state, from the accepted replies
        def save_state(self, state) -> ServerState: ...                  # for the checkpoint ...
        def load_state(self, saved) -> MyState: ...                      # ... and back

A hook left out fails when the class is instantiated, naming it. `StatelessStrategy` is the base of a strategy that
keeps nothing but the global model. Optional hooks: `select_nodes`, `reply_layouts_for`, `check_reply`, `update_of`,
`state_norm` and `update_scale` (what the screen measures), `forget`, `posterior_samples`, `global_posterior`.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
import torch
from flwr.app import ArrayRecord
from google.protobuf.message import Message as ProtoMessage

from fedbayes.bayes.gaussian import Gaussian
from fedbayes.bayes.params import TensorLayout
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import Payload, register_message_types
from fedbayes.strategies import get_algorithm
from fedbayes.tasks.config import ConfigError, RunSettings, TrainingSettings, round_seed

S = TypeVar("S")  # a strategy's state
TensorGroups = Mapping[str, Mapping[str, np.ndarray]]  # tensor group -> tensor name -> array


@dataclass
class ServerState:
    """What a server must carry across a restart besides the global arrays, as a checkpoint holds it: tensors
    (float32/float64 numpy) and string metadata (e.g. JSON). Randomness is derived from (seed, round), so no RNG
    state is needed."""

    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def add_per_client(self, name: str, records: Mapping[str, Any]) -> None:
        """Per-client records (dataclasses of torch tensors and the `round` they were last updated in, e.g.
        BayesADMM's duals): tensors under '<name>/<client>/<field>', rounds as JSON under '<name>'.

        Args:
            name: the records' name in the checkpoint.
            records: client id -> its record, a dataclass of torch tensors and `round`.
        """
        for client, record in records.items():
            for item in fields(record):
                if item.name != "round":
                    self.tensors[f"{name}/{client}/{item.name}"] = getattr(record, item.name).numpy()
        self.metadata[name] = json.dumps({client: record.round for client, record in records.items()})

    def per_client(self, name: str, record_type: type) -> dict[str, Any]:
        """The records `add_per_client(name, ...)` saved, as `record_type`s (float64 torch tensors as saved).

        Args:
            name: the records' name in the checkpoint.
            record_type: the dataclass they were saved from.

        Returns:
            Client id -> its record.
        """
        tensor_fields = [item.name for item in fields(record_type) if item.name != "round"]
        return {
            client: record_type(
                **{f: torch.from_numpy(self.tensors[f"{name}/{client}/{f}"].copy()) for f in tensor_fields},
                round=last_round,
            )
            for client, last_round in json.loads(self.metadata[name]).items()
        }


@dataclass
class GlobalPosterior:
    """The global posterior as the server holds it, for `fedbayes export` (posterior/): a Gaussian over the flat
    parameters (layout order) whose mean is the global model, N particles (N, P) of the flat parameters, or neither:
    a point estimate, the global model itself. `note` says in one line what it is (the export's header carries it)."""

    note: str
    gaussian: Gaussian | None = None
    particles: np.ndarray | None = None


class RoundRejected(Exception):
    """`absorb` found that the replies together make an unusable state (non-finite, not positive definite): the round
    core then looks for the replies to leave out; none of them changes the state."""


@dataclass
class Update(Generic[S]):
    """What `absorb` computes from a round's accepted replies, without changing the strategy: the new global model
    (flat, in layout order; what the server evaluates and hands to the next round), the strategy's state as it
    becomes once the round is committed, the round's own metrics, and what the operator should know about the
    global model that the metrics alone would not say (logged as a warning; the run goes on)."""

    weights: np.ndarray
    state: S = None  # type: ignore[assignment]  # a stateless strategy's state is None
    metrics: dict[str, float] = field(default_factory=dict)
    warning: str = ""


class ForgetRefused(ValueError):
    """`forget` cannot take this client out of the server's state; the message says why and what to do instead."""


@dataclass
class Forgotten(Generic[S]):
    """What `forget(client)` computes, without changing the strategy: the global model without the client (flat, in
    layout order; what the server then evaluates and sends), the strategy's state once the caller commits it,
    whether the result is the exact posterior of the remaining clients' data at the algorithm's fixed point for the
    loss the clients train (False: an estimate that refinement rounds among the remaining clients improve),
    KL(q_before ‖ q_after) where the global posterior is a Gaussian (else None), and one line on what was done."""

    weights: np.ndarray
    state: S
    exact: bool
    kl_before_after: float | None
    note: str


@dataclass(frozen=True)
class ClientForget(Generic[S]):
    """What `forget(client)` returns where the client's factor lives only on the client's machine (DSVGD, U-DSVGD):
    the server cannot compute the state without it, so the client computes its part. The forget machinery
    (server/forget/) sends `instruction` with `tensors` to the client's node between rounds; the reply must be a
    `reply_type` of `reply_layouts`, and once the round core has checked it as it checks any reply, `finish(payload)`
    computes the Forgotten state from it (ForgetRefused where the reply is unusable), without changing the strategy.
    `factor`: what of the client's the factor is, for messages ("its local particles")."""

    instruction: ProtoMessage
    tensors: TensorGroups
    reply_type: type[ProtoMessage]
    reply_layouts: Mapping[str, TensorLayout]
    finish: Callable[[Payload[Any]], Forgotten[S]]
    factor: str


@dataclass(frozen=True)
class NodePool:
    """What the round core knows of the nodes as a round is configured, for `select_nodes`: the nodes that may take
    part (connected, not quarantined), the seeded `fraction-train` sample of them (what most strategies send work
    to), each known node's client id, the last round the server accepted from each client, and a node's label for
    logs ("client 'client-3' (node 42)")."""

    eligible: Sequence[int]
    sample: Sequence[int]
    client_of: Callable[[int], str | None]
    accepted_rounds: Mapping[str, int]
    label: Callable[[int], str]


def local_training(
    training: TrainingSettings, server_round: int, weight_decay: float = 0.0, epochs: int | None = None
) -> pb.LocalTraining:
    """The local-training part of most instructions: the run's epochs (unless the strategy asks for others), batch
    size, optimizer and seed, and this round's learning rate (constant or cosine). Weight decay only where the
    strategy's objective has it; Bayesian ones regularise with their prior.

    Args:
        training: the run's local-training group (`RunSettings.training`), what is sent.
        server_round: the round the instruction is for, which sets its learning rate.
        weight_decay: the weight decay to send (the strategy's objective's, else 0).
        epochs: the epochs to send instead of the run's local-epochs, or None for the run's.

    Returns:
        The instruction's local training.
    """
    return pb.LocalTraining(
        epochs=training.local_epochs if epochs is None else epochs,
        batch_size=training.batch_size,
        learning_rate=training.round_lr(server_round),
        optimizer=training.optimizer,
        weight_decay=weight_decay,
        seed=training.seed,
    )


def steps_per_epoch(payload: Payload[Any], training: TrainingSettings) -> float:
    """The minibatch steps an epoch of the reply's client takes, ⌈num_examples / batch-size⌉: how an update that is
    a sum of SGD steps grows with the client's data (`ServerStrategy.update_scale`; every client runs the same
    epochs).

    Args:
        payload: the reply, whose num_examples is its client's claim.
        training: the run's local-training group (`RunSettings.training`): its batch size.

    Returns:
        The steps, as a float.
    """
    return float(math.ceil(payload.reply.num_examples / training.batch_size))


class ServerStrategy(ABC, Generic[S]):
    """A strategy's server half (module docstring). `settings` are the run's core settings, `hyperparameters` the
    strategy's own (an instance of its `Algorithm`'s settings), `layout` the model's parameters (what the algorithm's
    math works on), `buffer_layout` the rest of the model's state (BatchNorm statistics, which the core averages),
    `state` what the strategy carries from round to round (the type it declares as S; replaced by `commit`, or by the
    strategy itself where its first `instruction` builds it from the initial model; never edited in place: a state
    handed to a checkpoint stays as it was).

    `reply_type`: the protobuf message its clients reply with (the body of their Reply envelopes; registered with the
    codec when the class is defined). `robust_rules`: the run-config `robust-aggregation` rules it implements (others
    are refused when it is built). `fresh_start`: for a strategy whose clients keep state between rounds (and report
    the round they resumed from), what a client that lost its state means for the algorithm (logged when one replies
    afresh); None: its clients keep none."""

    reply_type: ClassVar[type[ProtoMessage]]
    robust_rules: ClassVar[tuple[str, ...]] = ("none",)
    fresh_start: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reply_type" in vars(cls):
            register_message_types(cls.reply_type)

    def __init__(self, settings: RunSettings, layout: TensorLayout, buffer_layout: TensorLayout | None = None) -> None:
        if settings.robust_aggregation not in self.robust_rules:
            raise ConfigError(
                f"run config 'robust-aggregation' = {settings.robust_aggregation!r}: strategy "
                f"{settings.strategy!r} implements {', '.join(self.robust_rules)}"
            )
        self.settings = settings
        # a strategy's keys are declared once, by its Algorithm: the registry reads them without a server half
        self.hyperparameters: Any = settings.hyperparameters(get_algorithm(settings.strategy).settings)
        self.layout = layout
        self.buffer_layout: TensorLayout = dict(buffer_layout or {})
        self.state: S = self.initial_state()

    # ---- the hooks every strategy has ------------------------------------------------------------------------------
    @abstractmethod
    def initial_state(self) -> S:
        """The state before round 1 (and before a checkpoint is loaded).

        Returns:
            The strategy's state before any round.
        """

    @abstractmethod
    def instruction(
        self, server_round: int, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[ProtoMessage, TensorGroups]:
        """This round's instruction to `nodes` (its header is the core's) and its tensor groups.

        Args:
            server_round: the round, from 1.
            arrays: the global model the round starts from, parameters and buffers by name.
            nodes: the nodes the round is sent to (`select_nodes`).

        Returns:
            (the strategy's instruction message, its tensor groups).
        """

    @abstractmethod
    def reply_layouts(self) -> Mapping[str, TensorLayout]:
        """The layout of every tensor group of `reply_type` (the model's buffers are the core's).

        Returns:
            Tensor group -> its layout.
        """

    @abstractmethod
    def absorb(self, payloads: list[Payload[Any]], server_round: int) -> Update[S]:
        """The new global model and state from the round's accepted replies (in client-id order), without changing
        the strategy: the core may call it on several subsets of a round's replies, and commits one result at most.

        Args:
            payloads: the round's accepted replies, decoded and checked, in client-id order.
            server_round: the round, from 1.

        Returns:
            The new global model, state and round metrics.

        Raises:
            RoundRejected: these replies together make an unusable state.
        """

    @abstractmethod
    def save_state(self, state: S) -> ServerState:
        """`state` as a checkpoint holds it (the core adds its own part).

        Args:
            state: a state of the strategy's.

        Returns:
            Its tensors and metadata.
        """

    @abstractmethod
    def load_state(self, saved: ServerState) -> S:
        """The state `save_state` saved, read back by a restarted server.

        Args:
            saved: what `save_state` returned, as the checkpoint gives it back.

        Returns:
            The state.
        """

    # ---- hooks with a default --------------------------------------------------------------------------------------
    def select_nodes(self, pool: NodePool, server_round: int) -> list[int]:
        """The nodes this round is sent to: by default the seeded `fraction-train` sample.

        Args:
            pool: the nodes that may take part, and what the core knows of them.
            server_round: the round, from 1.

        Returns:
            The node ids.
        """
        return list(pool.sample)

    def reply_layouts_for(self, message: ProtoMessage) -> Mapping[str, TensorLayout]:
        """The layouts of one reply's tensor groups, for a strategy whose shapes a field of the reply's own message
        decides (FedLap-Func: how many memory points it carries); by default `reply_layouts()`, the same for every
        reply. Raise to reject that reply alone.

        Args:
            message: the reply's own message, decoded.

        Returns:
            Tensor group -> its layout.
        """
        return self.reply_layouts()

    def check_reply(self, payload: Payload[Any]) -> None:
        """The algorithm's checks of one reply against its state; raise to reject that reply alone. The core has
        checked the wire schema, header, identity, num_examples and (for stateful clients) resumed_from_round
        already.

        Args:
            payload: the reply, decoded.
        """

    def update_of(self, payload: Payload[Any]) -> np.ndarray | None:
        """The reply's update: its change to the state, flat float64, in parameters where honest updates are of
        comparable size (weights, a Gaussian's mean and log precision, particles). What the screen and the search
        for a culprit measure; None: not screened.

        Args:
            payload: the reply, decoded and checked.

        Returns:
            The flat update, or None.
        """
        return None

    def state_norm(self) -> float:
        """The norm of the state in the parameters of `update_of`: the screen never refuses a shorter update.

        Returns:
            The norm; 0 by default.
        """
        return 0.0

    def update_scale(self, payload: Payload[Any]) -> float:
        """How long this reply's honest update is expected to be, relative to other clients' (> 0): how the norm of
        `update_of` grows with the client's examples (its own claim, `num_examples`), e.g. the local steps its
        training takes. The screen judges each update per unit of it, so that a client is not refused for holding
        more data (bayes/robust.py screen_bounds bounds what a claim can widen). By default 1: an update whose size
        does not depend on the client's.

        Args:
            payload: the reply, decoded and checked.

        Returns:
            The scale, > 0.
        """
        return 1.0

    def forget(self, client: str) -> Forgotten[S] | ClientForget[S]:
        """The state without `client`'s contribution, computed without changing the strategy: by the server alone
        (Forgotten), or, where the client's factor lives only on its machine, with the client's part (ClientForget:
        what to ask it, and how its reply becomes the Forgotten state). ForgetRefused, naming why, where neither
        can; here: the algorithm keeps no per-client factor (FedAvg, FedProx, FedPA).

        Args:
            client: the client's id.

        Returns:
            The Forgotten state, or the ClientForget that computes it with the client.

        Raises:
            ForgetRefused: naming why the client cannot be forgotten.
        """
        raise ForgetRefused(
            f"{self.settings.strategy}: the server keeps no per-client factor to remove, only a global model that "
            f"every accepted round of client {client[:64]!r} went into; retrain from the last checkpoint that predates "
            "the client's first accepted round, or from scratch"
        )

    def posterior_samples(self, count: int, generator: torch.Generator) -> list[dict[str, np.ndarray]]:
        """Weight samples of the global posterior for a predictive ensemble; none for point estimates.

        Args:
            count: the samples to draw (run config ensemble-samples, resolved).
            generator: the round's generator (round_seed), so a resumed run draws the same.

        Returns:
            The samples, the model's parameters by name each; [] for a point estimate.
        """
        return []

    def global_posterior(self) -> GlobalPosterior:
        """What the server holds of the global posterior (`fedbayes export`); here a point estimate.

        Returns:
            The global posterior.
        """
        return GlobalPosterior(f"a point estimate: {self.settings.strategy} holds no posterior beyond its global model")

    # ---- for the core and the hooks ------------------------------------------------------------------------------
    def commit(self, state: S) -> None:
        """Take `state` (an Update's or a Forgotten's) as the strategy's own: the core calls this once it has
        committed the round or the forget.

        Args:
            state: the committed state.
        """
        self.state = state

    def check_forgettable(self, client: str, holders: Collection[str]) -> None:
        """Refuse (ForgetRefused) a client the state holds nothing of, and the last one it holds (without it only the
        prior would be left: a new federation, not a forgotten client).

        Args:
            client: the client's id.
            holders: the clients the state holds something of.

        Raises:
            ForgetRefused: `client` is not among `holders`, or is the last of them.
        """
        if client not in holders:
            raise ForgetRefused(
                f"client {client[:64]!r} is unknown: the server holds no state of it ({len(holders)} known clients)"
            )
        if len(holders) == 1:
            raise ForgetRefused(
                f"client {client!r} is the last remaining client: forgetting it leaves only the prior; "
                "start a new federation instead"
            )

    def round_seed(self, server_round: int) -> int:
        """The seed of everything random the server draws for a round, so a resumed run draws the same.

        Args:
            server_round: the round, from 1.

        Returns:
            round_seed of the run's seed and the round.
        """
        return round_seed(self.settings.seed, server_round)


class StatelessStrategy(ServerStrategy[None]):
    """The base of a server half that keeps nothing between rounds but the global model the core hands it."""

    def initial_state(self) -> None:
        return None

    def save_state(self, state: None) -> ServerState:
        """Nothing to save.

        Args:
            state: None.

        Returns:
            An empty ServerState.
        """
        return ServerState()

    def load_state(self, saved: ServerState) -> None:
        """Nothing to load.

        Args:
            saved: the empty ServerState `save_state` returned.
        """
        return None
