"""The one seam between fedbayes and Flower's private code: every patch of Flower 1.39's internals and every name
fedbayes uses that is not Flower's public API (flwr.app, flwr.clientapp, flwr.serverapp, flwr.common's exported
names, flwr.simulation) lives here, and nothing else in fedbayes imports a private Flower module (the import-linter
contract in pyproject.toml, fedbayes.flowerseam.boundary).

Each patch is a named function, gated by `version.require_patched_flower` or `version.flower_is_patched`; the
Flower code each one rests on is listed with its source digest in `patches.PATCHES`, and
docs/reference/flower-patches.md says what Flower does, why we change it and what upstream would fix it.
Importing this package is cheap: its modules import Flower only where the original code did, mostly in functions.
"""

if __name__ != "fedbayes.flowerseam":  # fedbayes/flowerseam is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.flowerseam, not {__name__}")
