"""FedPA's client half: FedAvg's training in burn-in rounds, IASG sampling and the App. C delta after."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from fedbayes.bayes.params import set_parameters, unflatten
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_group, model_layouts
from fedbayes.client.training import Loss, make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.strategies.fedavg.client import train_locally
from fedbayes.strategies.fedpa.math import SampleSink, ShrinkageDelta
from fedbayes.tasks.datasets import Dataset


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
        parameters: list[torch.Tensor] = list(self.model.parameters())
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
            torch._foreach_add_(window, parameters)  # one kernel on a GPU; on the CPU the numbers of an add per tensor
            if (step - discarded) % steps_per_epoch == 0:
                emit(torch.cat([total.flatten() for total in window]).div_(steps_per_epoch))
                torch._foreach_zero_(window)

        return train_epochs(
            self.model,
            self.data,
            self.optimizer,
            self.burnin_epochs + self.samples,
            self.batch_size,
            self.device,
            seed=self.seed,
            loss_fn=self.loss_fn,
            after_step=average_iterates,
        )


def local_update(local: LocalRound) -> LocalResult:
    """FedAvg's local training in burn-in rounds; IASG + the App. C delta in sampling rounds.

    Args:
        local: the round's instruction (sampling or burn-in, local training, burn-in epochs, samples, shrinkage),
            its "weights" tensors (the global model x_0) and this client's runtime.

    Returns:
        The reply (the samples taken and the norm of the delta's correction over the iterate average; 0 and 0.0 in
        a burn-in round) with the delta as "delta" (the shrinkage estimate Δ̂ of the samples in a sampling round,
        x_0 minus the trained weights in a burn-in round), the last epoch's mean loss and the compute seconds.

    Raises:
        FloatingPointError: the delta is not finite.
        ValueError: a sampling round took no sample.
    """
    instruction, runtime, server_round = local.instruction, local.runtime, local.server_round
    set_parameters(runtime.model, local.tensors["weights"])
    x0 = parameters_to_vector(runtime.model.parameters()).detach().clone()
    samples, correction_norm = 0, 0.0
    if instruction.sampling:
        model = runtime.model.to(runtime.device)
        estimate = ShrinkageDelta(x0.to(runtime.device), instruction.shrinkage, capacity=instruction.samples)
        iasg = IASG(
            model,
            runtime.data,
            make_optimizer(model, instruction.training),
            instruction.training.batch_size,
            runtime.device,
            runtime.local_seed(instruction.training.seed, server_round),
            instruction.local_burnin_epochs,
            instruction.samples,
        )
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
    reply = pb.FedPAReply(samples=samples, correction_norm=correction_norm)
    return LocalResult(reply, {"delta": unflatten(delta.numpy(), runtime.layout)}, train_loss, compute_seconds)


client_update = ClientHalf(
    pb.FedPAInstruction, local_update, model_layouts("weights"), global_model=model_group("weights")
)
