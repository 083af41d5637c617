"""Classification metrics of a predictive distribution: accuracy, NLL, expected calibration error."""

from __future__ import annotations

import torch

ECE_BINS = 15


def classification_metrics(probs: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> dict[str, float]:
    """Metrics of predictive class probabilities `probs` (N, C) against integer `labels` (N,).

    NLL is the mean of -log p(y|x) (clamped at 1e-12 so one confident mistake cannot make it
    infinite); ECE is the top-label calibration error over `bins` equal-width confidence bins,
    weighted by the fraction of examples in each bin (Guo et al., 2017).
    """
    if probs.ndim != 2 or labels.shape != probs.shape[:1]:
        raise ValueError(f"probs must be (N, C) and labels (N,), got {tuple(probs.shape)} and {tuple(labels.shape)}")
    probs = probs.double()
    confidence, predicted = probs.max(dim=1)
    correct = (predicted == labels).double()
    true_class_prob = probs.gather(1, labels.view(-1, 1)).squeeze(1)
    return {
        "accuracy": correct.mean().item(),
        "nll": -true_class_prob.clamp_min(1e-12).log().mean().item(),
        "ece": expected_calibration_error(confidence, correct, bins),
    }


def expected_calibration_error(confidence: torch.Tensor, correct: torch.Tensor, bins: int = ECE_BINS) -> float:
    # Bin b holds confidences in (b/bins, (b+1)/bins]; confidence 0 goes to the first bin.
    bin_index = (confidence * bins).ceil().long().clamp(1, bins) - 1
    confidence_sum = torch.bincount(bin_index, weights=confidence.double(), minlength=bins)
    correct_sum = torch.bincount(bin_index, weights=correct.double(), minlength=bins)
    return ((confidence_sum - correct_sum).abs().sum() / confidence.numel()).item()


@torch.no_grad()
def predict_probs(model: torch.nn.Module, images: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Softmax class probabilities of `model` on `images`, batched, on the CPU."""
    model.eval()
    chunks = [
        torch.softmax(model(images[i : i + batch_size].to(device)), dim=1).cpu()
        for i in range(0, len(images), batch_size)
    ]
    return torch.cat(chunks)
