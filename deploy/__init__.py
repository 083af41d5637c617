"""Operator tooling: the `fedbayes` command, the local launcher, certificates and node keys."""

if __name__ != "fedbayes.deploy":  # fedbayes/deploy is a link to this folder: one import name, one module
    raise ImportError(f"import fedbayes.deploy, not {__name__}")
