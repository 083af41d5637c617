"""FedAvg's and FedProx's client half: local epochs from the global model (FedProx: plus the proximal term)."""

from __future__ import annotations

import torch

from fedbayes.bayes.params import TensorList, get_parameters, set_parameters, uses_multi_tensor
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_group, model_layouts
from fedbayes.client.runtime import ClientRuntime
from fedbayes.client.training import GradientTerm, anchored_penalty, gradients, make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb


def local_update(local: LocalRound) -> LocalResult:
    """Load the global model, train locally (FedProx: with the proximal term), send the new weights back.

    Args:
        local: the round's instruction (local training, proximal μ), its "weights" tensors and this client's runtime.

    Returns:
        The reply: an empty FedAvgReply with the trained parameters as "weights", the last epoch's mean loss and the
        compute seconds.
    """
    instruction = local.instruction
    set_parameters(local.runtime.model, local.tensors["weights"])
    train_loss, compute_seconds = train_locally(
        local.runtime, instruction.training, local.server_round, instruction.proximal_mu
    )
    return LocalResult(
        pb.FedAvgReply(),
        {"weights": get_parameters(local.runtime.model, local.runtime.layout)},
        train_loss,
        compute_seconds,
    )


client_update = ClientHalf(
    pb.FedAvgInstruction, local_update, model_layouts("weights"), global_model=model_group("weights")
)


def train_locally(
    runtime: ClientRuntime, training: pb.LocalTraining, server_round: int, proximal_mu: float = 0.0
) -> tuple[float, float]:
    """FedAvg's local training of `runtime.model` from its current weights (FedPA's burn-in rounds run exactly this),
    on the runtime's device; the model is back on the CPU after it.

    Args:
        runtime: this client's data, model, device and seed.
        training: the instruction's local training: epochs, batch size, learning rate, optimizer, seed.
        server_round: the round, mixed into the minibatch seed with the client's id.
        proximal_mu: μ of FedProx's proximal term ½ μ ‖θ − θ_start‖², anchored at the weights it starts from; 0: none
            (FedAvg).

    Returns:
        The last epoch's mean training loss and the seconds spent training.
    """
    extra_term = None
    if proximal_mu > 0.0:
        anchor = [p.detach().clone().to(runtime.device) for p in runtime.model.parameters()]
        extra_term = proximal_term(proximal_mu, anchor)
    model = runtime.model.to(runtime.device)
    losses = train_epochs(
        model,
        runtime.data,
        make_optimizer(model, training),
        training.epochs,
        training.batch_size,
        runtime.device,
        seed=runtime.local_seed(training.seed, server_round),
        extra_term=extra_term,
    )
    model.cpu()
    return losses


def proximal_term(mu: float, anchor: list[torch.Tensor], foreach: bool | None = None) -> GradientTerm:
    """FedProx's ½ μ Σ ‖θ_i − anchor_i‖² over the parameter tensors θ_i, gradient μ (θ_i − anchor_i), added into the
    gradients in place.

    Args:
        mu: μ, >= 0.
        anchor: the tensors the parameters are pulled to (the global model), one per parameter in the model's order,
            on the training device.
        foreach: the multi-tensor path (one flat vector, one multi-tensor add into the gradients), the single-tensor
            one (per tensor), or None: multi-tensor on CUDA (`fedbayes.bayes.params.uses_multi_tensor`).

    Returns:
        The term: called with the parameters, it adds its gradient to theirs (not to a frozen parameter's) and
        returns its value.
    """
    if uses_multi_tensor(foreach, anchor[0].device):
        return anchored_penalty(torch.cat([a.reshape(-1) for a in anchor]), mu)

    def proximal(parameters: TensorList) -> torch.Tensor:
        squared = torch.zeros((), dtype=anchor[0].dtype, device=anchor[0].device)
        for p, a in zip(parameters, anchor):
            diff = p.detach() - a
            squared = squared + diff.pow(2).sum()
            if p.requires_grad:  # as autograd: a frozen parameter gets no gradient
                gradients([p])[0].add_(diff * mu)
        return 0.5 * mu * squared

    return proximal
