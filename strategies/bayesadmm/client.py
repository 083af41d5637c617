"""BayesADMM's client half: Alg. 1 lines 4-6 (IVON, Newton or Adam/SGD by family), duals and IVON's state kept in
the durable store."""

from __future__ import annotations

import math
import time
from logging import INFO
from typing import Any

import torch
from flwr.common import log

from fedbayes.bayes.curvature import diag_ggn
from fedbayes.bayes.gaussian import Gaussian
from fedbayes.bayes.ivon import (
    MAX_INITIAL_WIDTH,
    IVONWithPrior,
    hessian_init,
    hessian_init_within_weights,
    hessian_momentum,
)
from fedbayes.bayes.params import TensorLayout, TensorList, flatten, unflatten
from fedbayes.client.core import ClientHalf, LocalResult, LocalRound, model_group
from fedbayes.client.state import ClientState
from fedbayes.client.training import GradientTerm, add_flat_gradient, make_optimizer, train_epochs
from fedbayes.protos import payloads_pb2 as pb
from fedbayes.protos.codec import PayloadError
from fedbayes.strategies.bayesadmm.math import (
    FAMILIES,
    Duals,
    delta_objective,
    dual_step,
    newton_client_step,
    precision_from_wire,
    precision_layout,
    precision_to_wire,
    unit_precision,
)

MIN_NEWTON_STEP = 1e-6
IVON_PREFIX = "ivon_"  # IVON's carried state in the durable store: ivon_momentum, ivon_hess, ivon_step
DERIVED_HESS_INIT = "derived_hess_init"  # hess-init = 0: the h0 this client derived from its data, in its store
HESS_INIT_EXAMPLES = 128  # the examples h0 is derived from: within 5% of 1,000 on FMNIST; the GGN costs 2C passes


def instruction_layouts(instruction: pb.BayesADMMInstruction, layout: TensorLayout) -> dict[str, TensorLayout]:
    """The layouts of an instruction's tensor groups, checked before they are decoded.

    Args:
        instruction: the round's instruction; its `family` sets the precision's layout.
        layout: the model's parameters.

    Returns:
        "global_mean": `layout`; "global_precision": the family's precision layout (precision_layout).

    Raises:
        PayloadError: `family` is not one of FAMILIES.
    """
    if instruction.family not in FAMILIES:
        raise PayloadError(f"field 'family': {instruction.family[:32]!r} is not one of {', '.join(FAMILIES)}")
    return {"global_mean": layout, "global_precision": precision_layout(instruction.family, layout)}


def local_update(local: LocalRound) -> LocalResult:
    """Alg. 1 lines 4-6 on this client: fit the local posterior against q̄ (IVON, Newton or SGD by family), take the
    dual step; duals and IVON state persist in the durable store.

    Args:
        local: the round's instruction (family, ρ, γ, temperature, IVON's settings, local training), q̄'s tensors,
            this client's runtime, and its stored duals and IVON state (None: new, or lost: zero duals).

    Returns:
        The reply with the local posterior's and the new duals' means and precisions (as the family's precisions
        travel), the last epoch's mean loss, the compute seconds, and the duals and optimizer state to store.

    Raises:
        ValueError: the stored duals do not have q̄'s shapes.
    """
    instruction, runtime, stored = local.instruction, local.runtime, local.stored
    family = instruction.family
    global_ = Gaussian(
        torch.from_numpy(flatten(local.tensors["global_mean"], runtime.layout)),
        precision_from_wire(local.tensors["global_precision"], family, runtime.layout),
    )
    duals = _stored_duals(stored, global_)
    torch.manual_seed(training_seed(local))
    train = {"isotropic": _train_isotropic, "full": _train_full, "diagonal": _train_ivon}[family]
    posterior, (train_loss, compute_seconds), optimizer_state = train(local, global_, duals)
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
    return LocalResult(pb.BayesADMMReply(), tensors, train_loss, compute_seconds, state)


client_update = ClientHalf(
    pb.BayesADMMInstruction,
    local_update,
    instruction_layouts,
    stateful=True,
    global_model=model_group("global_mean"),
    # q_k at its mean (the isotropic family's fixed covariance adds nothing to a point's predictions)
    local_posterior=lambda local, result: [dict(result.tensors["local_mean"])],
)


def training_seed(local: LocalRound) -> int:
    """The seed of this round's random numbers: IVON's weight noise (torch's global generator) and the minibatch
    order. Run config `noise`: shared = the server's noise seed (the run seed), the same for every client in every
    round, and one stream for both, as in the reference code: it calls torch.manual_seed(seed) at the start of each
    local training and draws each epoch's permutation, then the steps' noise, from torch's global generator
    (`_train_ivon`); independent = a seed of this client's own for this round.

    Args:
        local: the round: its instruction's noise settings, the client's runtime and the round.

    Returns:
        The seed.
    """
    instruction = local.instruction
    if instruction.shared_noise:
        return instruction.noise_seed
    return local.runtime.local_seed(instruction.training.seed, local.server_round)


def _stored_duals(stored: ClientState | None, global_: Gaussian) -> Duals:
    """This client's duals from its store (zeros in its first round), shaped like q̄ as received: U_k is
    (P,) for the diagonal family, (P, P) for the full one and a zero scalar for the isotropic one."""
    shapes = {"dual_mean": global_.mean.shape, "dual_precision": global_.precision.shape}
    if stored is None:
        return Duals(
            torch.zeros(shapes["dual_mean"], dtype=torch.float64),
            torch.zeros(shapes["dual_precision"], dtype=torch.float64),
            0,
        )
    for name, shape in shapes.items():
        if stored.tensors[name].shape != shape:
            raise ValueError(
                f"stored {name} has shape {tuple(stored.tensors[name].shape)}, this run needs {tuple(shape)}"
            )
    return Duals(stored.tensors["dual_mean"].double(), stored.tensors["dual_precision"].double(), stored.round)


def _train_ivon(local: LocalRound, global_: Gaussian, duals: Duals):
    """Line 4 with IVON: ess = N_k/(ρτ), prior q̄, Lagrange terms τ v_k / N_k and τ u_k / N_k (Eq. 41)."""
    runtime, instruction, stored = local.runtime, local.instruction, local.stored
    num_examples = len(runtime.data.labels)
    ess = num_examples / (instruction.rho * instruction.temperature)
    model = runtime.model.to(runtime.device)
    hess_init = instruction.hess_init or _derived_hess_init(local, global_.mean, ess)
    optimizer = IVONWithPrior(
        model.parameters(),
        lr=instruction.training.learning_rate,
        ess=ess,
        hess_init=hess_init,
        beta1=instruction.beta1,
        beta2=instruction.beta2 or hessian_momentum(_steps_per_round(local)),
        mc_samples=instruction.mc_samples,
        rescale_lr=instruction.rescale_lr,
    )
    device_dtype: dict[str, Any] = dict(device=runtime.device, dtype=torch.float32)
    optimizer.set_prior(global_.mean.to(**device_dtype), global_.precision.to(**device_dtype))
    scale = instruction.temperature / num_examples
    optimizer.set_lagrange((scale * duals.mean).to(**device_dtype), (scale * duals.precision).to(**device_dtype))
    if stored is not None and f"{IVON_PREFIX}hess" in stored.tensors:  # IVON's state carries over between rounds
        optimizer.carry_on(
            {
                name.removeprefix(IVON_PREFIX): value
                for name, value in stored.tensors.items()
                if name.startswith(IVON_PREFIX)
            }
        )
    if instruction.reset_posterior and stored is not None:  # start at q̄, as the reference code does
        optimizer.set_posterior(global_.mean.to(**device_dtype), global_.precision.to(**device_dtype))
    else:  # start at m̄ with IVON's own Hessian estimate (h0 in a client's first round)
        optimizer.set_posterior(global_.mean.to(**device_dtype), optimizer.posterior()[1])
    loss_and_seconds = train_epochs(
        model,
        runtime.data,
        optimizer,
        instruction.training.epochs,
        instruction.training.batch_size,
        runtime.device,
        seed=training_seed(local),
        sampled_weights=lambda: optimizer.sampled_params(train=True),
        mc_samples=instruction.mc_samples,
        # shared: the permutation from the generator the noise comes from, as the reference code draws it. Drawn
        # first, it also keeps the noise off the draws that made the initial weights (the same seed): from a
        # generator of its own, every round's first noise replayed them, correlated -0.35 with the initial weights.
        generator=torch.default_generator if instruction.shared_noise else None,
    )
    mean, precision = optimizer.posterior()
    state = {f"{IVON_PREFIX}{name}": value for name, value in optimizer.carried_state().items()}
    if not instruction.hess_init:
        state[DERIVED_HESS_INIT] = torch.tensor([hess_init], dtype=torch.float64)
    model.cpu()
    fitted = Gaussian(mean.detach().cpu().double(), precision.detach().cpu().double())
    return fitted, loss_and_seconds, state


def _steps_per_round(local: LocalRound) -> int:
    training = local.instruction.training
    return training.epochs * math.ceil(len(local.runtime.data.labels) / training.batch_size)


def _derived_hess_init(local: LocalRound, global_mean: torch.Tensor, ess: float) -> float:
    """Run config hess-init = 0: IVON's h0 from this client's data (bayes/ivon.py hessian_init), the diagonal GGN of
    its first HESS_INIT_EXAMPLES examples at q̄'s mean in the round it first trains, bounded by the weights' scale
    (hessian_init_within_weights); kept in its store after that."""
    stored = local.stored
    if stored is not None and DERIVED_HESS_INIT in stored.tensors:
        return float(stored.tensors[DERIVED_HESS_INIT].item())
    runtime = local.runtime
    model = runtime.model.to(runtime.device)
    torch.nn.utils.vector_to_parameters(global_mean.to(runtime.device, torch.float32), model.parameters())
    images = runtime.data.images[:HESS_INIT_EXAMPLES].to(runtime.device)
    curvature_h0 = hessian_init(diag_ggn(model, images), len(images))
    hess_init = hessian_init_within_weights(curvature_h0, global_mean, ess)
    if hess_init != curvature_h0:  # say so: the user sees which rule set this client's h0
        log(
            INFO,
            "%s: IVON's h0 from the curvature, %.3g, would make its first posterior over %g times as wide as the "
            "weights; h0 = %.3g, as wide as them",
            runtime.node.client_id,
            curvature_h0,
            MAX_INITIAL_WIDTH,
            hess_init,
        )
    return hess_init


def _train_full(local: LocalRound, global_: Gaussian, duals: Duals):
    """Line 4 for the full family (App. C.4): `epochs` VON/Newton steps from q̄ on Eq. 34, whose loss is
    the client's summed cross-entropy tempered by τ (the same units as the diagonal family's
    ess = N_k/(ρτ)). Each step starts at size `learning_rate` and halves until Eq. 34 decreases:
    undamped Newton can diverge on a logistic loss far from its minimum. Full-batch, CPU, float64."""
    runtime, instruction = local.runtime, local.instruction
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
    fitted, value = global_, objective(global_.mean)
    for _ in range(instruction.training.epochs):
        step_size = instruction.training.learning_rate
        while True:
            candidate = newton_client_step(tempered_loss_sum, global_, duals, instruction.rho, fitted, step_size)
            candidate_value = objective(candidate.mean)
            if candidate_value <= value or step_size < MIN_NEWTON_STEP:  # the latter: converged to round-off
                break
            step_size /= 2
        fitted, value = candidate, candidate_value
    fitted = Gaussian(fitted.mean, 0.5 * (fitted.precision + fitted.precision.T))  # exact symmetry for the wire
    seconds = time.perf_counter() - started
    train_loss = tempered_loss_sum(fitted.mean).item() * instruction.temperature / max(len(labels), 1)
    return fitted, (train_loss, seconds), {}


def _train_isotropic(local: LocalRound, global_: Gaussian, duals: Duals):
    """Federated ADMM's client step (Eq. 21) on the mean loss: loss + (v·θ + ρ/2 ‖θ - m̄‖²)/N_k."""
    runtime, instruction = local.runtime, local.instruction
    num_examples = len(runtime.data.labels)
    model = runtime.model.to(runtime.device)
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(global_.mean[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
    terms = admm_terms(
        duals.mean.to(runtime.device, torch.float32),
        global_.mean.to(runtime.device, torch.float32),
        instruction.rho,
        num_examples,
    )
    loss_and_seconds = train_epochs(
        model,
        runtime.data,
        make_optimizer(model, instruction.training),
        instruction.training.epochs,
        instruction.training.batch_size,
        runtime.device,
        seed=training_seed(local),
        extra_term=terms,
    )
    mean = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu().double()
    model.cpu()
    return Gaussian(mean, unit_precision()), loss_and_seconds, {}


def admm_terms(dual: torch.Tensor, anchor: torch.Tensor, rho: float, num_examples: int) -> GradientTerm:
    """Federated ADMM's (v·θ + ρ/2 ‖θ − m̄‖²)/N_k (Eq. 21) over the flattened parameters θ, gradient
    (v + ρ (θ − m̄))/N_k, added into the gradients.

    Args:
        dual: v, the client's dual mean, (P,) on the model's device.
        anchor: m̄, q̄'s mean, (P,) on the model's device.
        rho: ρ, the penalty, > 0.
        num_examples: N_k, the client's examples, > 0.

    Returns:
        The term: called with the parameters, it adds its gradient to theirs and returns its value.
    """
    # 1/N_k as a float32 tensor, and the gradient in the chain rule's order: the numbers autograd gave on the value
    inverse = torch.ones((), dtype=anchor.dtype, device=anchor.device) / num_examples

    def terms(parameters: TensorList) -> torch.Tensor:
        theta = torch.cat([p.detach().flatten() for p in parameters])
        diff = theta - anchor
        add_flat_gradient(parameters, dual * inverse + diff * (inverse * rho))
        return (dual @ theta + 0.5 * rho * diff.square().sum()) / num_examples

    return terms
