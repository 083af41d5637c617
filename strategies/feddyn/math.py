"""FedDyn's math, shared by both halves: α_k, the λ step, the server step, and the λ sketch both sides compute."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedbayes.tasks.config import round_seed


def client_alpha(alpha: float, num_examples: int, known_clients: int, known_examples: int) -> float:
    """α_k = α·N/(K·N_k) ("alpha_coef_adpt" = α / (K·N_k/N)); α while no sizes are known (round 1).

    Args:
        alpha: FedDyn's α, the regularisation coefficient.
        num_examples: N_k, client k's training examples.
        known_clients: K, the clients the server knows.
        known_examples: N, the training examples of those K clients; 0 while none are known.

    Returns:
        α_k.
    """
    if known_examples == 0:
        return alpha
    return alpha * known_examples / (known_clients * num_examples)


def lambda_step(lam: torch.Tensor, local: torch.Tensor, global_: torch.Tensor) -> torch.Tensor:
    """λ_k ← λ_k + (w_k − w_g).

    Args:
        lam: λ_k, client k's flat dual, shape (P,).
        local: w_k, the client's flat weights after its local solve, shape (P,).
        global_: w_g, the flat global weights the round began from, shape (P,).

    Returns:
        The new λ_k, shape (P,).
    """
    return lam + (local - global_)


def server_step(local_weights: list[torch.Tensor], lambda_sum: torch.Tensor, known_clients: int) -> torch.Tensor:
    """w_g ← mean of this round's w_k + Λ/K.

    Args:
        local_weights: this round's flat w_k, each of shape (P,); not empty.
        lambda_sum: Λ = Σ_k λ_k over every known client, shape (P,).
        known_clients: K, the clients the server knows.

    Returns:
        The new w_g, shape (P,).
    """
    return torch.stack(local_weights).mean(0) + lambda_sum / known_clients


def server_step_without(global_: torch.Tensor, remaining_lambdas: list[torch.Tensor]) -> torch.Tensor:
    """forget.md: the first server step without client k, each remaining client's reply taken to be w_g (its reply at
    the fixed point): w_g' = w_g + Σ_{j≠k} λ_j/(K−1), which is w_g − λ_k/(K−1) there (module docstring).

    Args:
        global_: w_g, the flat global weights, shape (P,).
        remaining_lambdas: λ_j of the K−1 clients that stay, each of shape (P,); not empty.

    Returns:
        w_g', shape (P,).
    """
    return server_step([global_], torch.stack(remaining_lambdas).sum(0), len(remaining_lambdas))


SKETCH_ROWS = 8


SKETCH_RTOL = 1e-9  # both sides compute λ_k from the same float32 w_k and w_g in float64: only summation order differs


def lambda_sketch(lam: torch.Tensor, seed: int, server_round: int) -> torch.Tensor:
    """R·λ_k, R a SKETCH_ROWS x P matrix of ±1 drawn from (seed, round): the same on the client and the server.
    Any change of λ_k moves it except one orthogonal to all rows (probability 0 for a change not made to fool it;
    a client set on fooling it can just as well send a bad w_k, which the screen and robust aggregation bound).

    Args:
        lam: λ_k, shape (P,).
        seed: the run's seed.
        server_round: the round whose signs to draw.

    Returns:
        The float64 sketch, shape (SKETCH_ROWS,).
    """
    generator = torch.Generator().manual_seed(round_seed(seed, server_round))
    signs = torch.randint(0, 2, (SKETCH_ROWS, lam.numel()), generator=generator, dtype=torch.int8)
    return (2 * signs.double() - 1) @ lam.double()


def sketch_mismatch(reported: torch.Tensor, lam: torch.Tensor, seed: int, server_round: int) -> float:
    """The largest difference between a reported sketch and the sketch of `lam`, relative to Σ|λ_k| (which bounds
    every entry of a ±1 sketch).

    Args:
        reported: the sketch the client sent, shape (SKETCH_ROWS,).
        lam: the server's replay of λ_k, shape (P,).
        seed: the run's seed.
        server_round: the round the sketch was drawn for.

    Returns:
        max |reported − R·λ_k| / Σ|λ_k| (the denominator floored at 1e-300).
    """
    expected = lambda_sketch(lam, seed, server_round)
    return (reported - expected).abs().max().item() / max(lam.abs().sum().item(), 1e-300)


def as_sent(flat: torch.Tensor) -> torch.Tensor:
    """`flat` rounded to float32, as the clients receive it: the server replays λ_k += w_k − w_g with the same
    w_g the client subtracted, so the replay matches the client bit for bit.

    Args:
        flat: a flat tensor of any float dtype.

    Returns:
        `flat` rounded to float32, in float64.
    """
    return flat.to(torch.float32).double()


@dataclass
class ClientLambda:
    value: torch.Tensor  # λ_k (float64)
    round: int  # the round it was last updated in


def total_lambda(lambdas: dict[str, ClientLambda]) -> torch.Tensor:
    """Λ = Σ_k λ_k over every known client.

    Args:
        lambdas: each known client's λ_k, by node id; not empty.

    Returns:
        Λ, shape (P,).
    """
    return torch.stack([entry.value for entry in lambdas.values()]).sum(0)
