"""FedDyn's client half: the anchored local solve from w_g, λ_k kept in the durable store."""

from __future__ import annotations

import torch

from fedbayes.bayes.params import flatten, unflatten
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_group, model_layouts
from fedbayes.client.training import train_anchored
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies.feddyn.math import client_alpha, lambda_sketch, lambda_step
from fedbayes.strategies.membership import client_population

LAMBDA_KEY = "feddyn_lambda"


def local_update(local: LocalRound) -> LocalResult:
    """Train on the FedDyn objective from w_g, update λ_k (kept in the durable store), send w_k back.

    Args:
        local: the round's instruction (α, K, N, local training), its "global_weights" tensors, this client's
            runtime, and its stored λ_k (None: new, or lost: λ_k = 0).

    Returns:
        The reply (the sketch of the new λ_k) with w_k as "weights", the last epoch's mean loss, the compute seconds,
        and the new λ_k to store.

    Raises:
        ValueError: the stored λ_k has another size than this run's model.
    """
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
        runtime,
        instruction.training,
        start=global_,
        anchor=global_ - lam,
        weight=alpha_k,
        server_round=local.server_round,
        max_grad_norm=instruction.max_grad_norm,
    )
    lam = lambda_step(lam, weights, global_)
    sketch = lambda_sketch(lam, instruction.training.seed, local.server_round)
    return LocalResult(
        pb.FedDynReply(lambda_sketch=sketch.tolist()),
        {"weights": unflatten(weights.numpy(), runtime.layout)},
        train_loss,
        seconds,
        {LAMBDA_KEY: lam},
    )


client_update = ClientHalf(
    pb.FedDynInstruction,
    local_update,
    model_layouts("global_weights"),
    stateful=True,
    global_model=model_group("global_weights"),
)
