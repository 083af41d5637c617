"""Shared math, written once and tested against closed forms: Gaussian parameters, IVON with a prior and duals,
curvature, kernels, robust means and the evaluation metrics. Pure: imports torch and numpy, nothing of fedbayes."""

if __name__ != "fedbayes.bayes":  # fedbayes/bayes is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.bayes, not {__name__}")
