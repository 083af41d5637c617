"""Compute resources of one process: thread count and device.

On 2-core machines several federated processes share the cores; more than one compute thread per
process oversubscribes them and runs 10-100x slower (docs/results/performance.md).
"""

from __future__ import annotations

import os

import torch

THREADS_ENV = "FEDBAYES_THREADS"
DEVICES = ("auto", "cpu", "cuda")


def configure_threads() -> int:
    """One torch/OpenMP thread per process unless FEDBAYES_THREADS says otherwise (torch.set_num_threads).

    Returns:
        The thread count set, >= 1.

    Raises:
        ValueError: FEDBAYES_THREADS is no integer or is below 1.
    """
    threads = int(os.environ.get(THREADS_ENV, "1"))
    if threads < 1:
        raise ValueError(f"{THREADS_ENV} must be >= 1, got {threads}")
    torch.set_num_threads(threads)
    return threads


def resolve_device(name: str) -> torch.device:
    """The torch device a device option names; asking for `cuda` without a GPU is an error, not a fallback.

    Args:
        name: one of DEVICES: "auto" (CUDA when torch sees a GPU, else the CPU), "cpu" or "cuda".

    Returns:
        The device.

    Raises:
        ValueError: `name` is not one of DEVICES.
        RuntimeError: "cuda" without a CUDA GPU available to torch.
    """
    if name not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was requested but no CUDA GPU is available to torch")
    return torch.device(name)
