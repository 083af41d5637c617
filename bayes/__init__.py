"""Shared math, tested once: metrics now; Gaussian parameters, IVON with prior/duals, kernels later."""
