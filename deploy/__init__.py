"""Operator tooling: the `fedbayes` command, the local launcher, certificates and node keys."""
