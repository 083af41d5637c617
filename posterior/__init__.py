"""The global posterior of a finished round, for use outside the federation.

`fedbayes export RUN --out FILE` writes it as an open file (posterior/file.py: safetensors tensors + a JSON header);
`fedbayes.posterior.load(FILE)` reads it back as a `Posterior` whose `predict(x, samples=S)` gives the posterior
predictive and its uncertainty per example (`Prediction`: entropy, expected entropy, mutual information), computed
as the server computes its own evaluation (posterior/predictive.py); `fedbayes predict FILE DATA.npz` does it on a file.
"""

if __name__ != "fedbayes.posterior":  # fedbayes/posterior is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.posterior, not {__name__}")

import importlib
from typing import TYPE_CHECKING, Any

from fedbayes.posterior.file import PosteriorFileError, PosteriorLimits

if TYPE_CHECKING:
    from fedbayes.posterior.predictive import Posterior, load
    from fedbayes.posterior.uncertainty import Prediction

__all__ = ["Posterior", "PosteriorFileError", "PosteriorLimits", "Prediction", "load"]
# Imported when first asked for (PEP 562): they need torch, which `fedbayes`'s argument parser, reading
# posterior/cli.py, should not load into every command (`fedbayes client` supervises its SuperNode for hours).
_WITH_TORCH = {
    "Posterior": "fedbayes.posterior.predictive",
    "load": "fedbayes.posterior.predictive",
    "Prediction": "fedbayes.posterior.uncertainty",
}


def __getattr__(name: str) -> Any:
    if name not in _WITH_TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WITH_TORCH[name]), name)
