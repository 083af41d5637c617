"""The Flower app fedbayes runs, written from the installed package: `fedbayes app DIR` writes DIR/pyproject.toml,
which `flwr run DIR` (or `fedbayes run DIR`) submits; `fedbayes local` writes one into its workdir. The FAB
carries the run config only; the ServerApp and ClientApps are the `fedbayes` package installed on each machine.
The run config lists every declared key (fedbayes.strategies.declared_keys) with its default, so `-c key=value`
accepts exactly the keys `fedbayes strategies` lists. A source checkout's pyproject.toml lists the same keys and
defaults (tests/unit/test_config.py checks it)."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fedbayes.strategies import declared_keys
from fedbayes.tasks.storage import OUTPUT_MODE, write_atomically

APP_FILE = "pyproject.toml"  # the whole app: its FAB includes nothing else
COMPONENTS = {"serverapp": "fedbayes.server.app:app", "clientapp": "fedbayes.client.app:app"}


def toml_value(value: Any) -> str:
    """A run-config value as a TOML value.

    Args:
        value: a bool, int, float or anything else (written as its str).

    Returns:
        true/false, the number's repr, or a JSON (TOML basic) string.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def app_pyproject(strategy: str = "") -> str:
    """pyproject.toml of the Flower app: every run-config key (and `strategy`'s own, for one from elsewhere).

    Args:
        strategy: a strategy's name or `module:attribute`; "": the core keys and the built-in strategies' keys.

    Returns:
        The file's text, each key with its default and a comment saying what it is.
    """
    try:
        package_version = version("fedbayes")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        package_version = "0.0.0"
    lines = [
        "# Written by `fedbayes app`: the Flower app of the installed fedbayes package.",
        "[project]",
        'name = "fedbayes-app"',
        f"version = {toml_value(package_version)}",
        'description = "fedbayes federation (the code is the fedbayes package installed on every machine)"',
        'license = "GPL-3.0-or-later"',
        "dependencies = []",
        "",
        "[tool.flwr.app]",
        'publisher = "fedbayes"',
        f"fab-include = [{toml_value(APP_FILE)}]",
        "",
        "[tool.flwr.app.components]",
        *(f"{name} = {toml_value(ref)}" for name, ref in COMPONENTS.items()),
        "",
        "[tool.flwr.app.config]",
    ]
    for name, key in declared_keys(strategy).items():
        lines.append(f"{name} = {toml_value(key.default)}  # {key.doc}")
    return "\n".join(lines) + "\n"


def write_app(directory: Path, strategy: str = "") -> Path:
    """`directory`/pyproject.toml, replaced atomically if there; the directory.

    Args:
        directory: the app's folder; made if missing.
        strategy: as for `app_pyproject`.

    Returns:
        `directory`.
    """
    write_atomically(directory / APP_FILE, app_pyproject(strategy).encode(), OUTPUT_MODE)
    return directory


def describe_strategies(names: list[str]) -> str:
    """`fedbayes strategies`: each strategy with the hyperparameters it reads besides the core keys.

    Args:
        names: the strategies to describe; empty: every one, and then the core keys too.

    Returns:
        The lines, newline-separated.

    Raises:
        ConfigError: an unknown strategy (`get_algorithm`).
    """
    from fedbayes.strategies import algorithm_names, get_algorithm
    from fedbayes.tasks.config import CORE_KEYS

    lines = []
    for name in names or algorithm_names():
        algorithm = get_algorithm(name)
        lines.append(f"{name}")
        lines += [f"  {key.name} = {toml_value(key.default)}: {key.doc}" for key in algorithm.hyperparameters]
        if not algorithm.hyperparameters:
            lines.append("  (no keys of its own)")
    if not names:
        lines += ["", "every strategy also reads the core keys:"]
        lines += [f"  {key.name} = {toml_value(key.default)}: {key.doc}" for key in CORE_KEYS]
    return "\n".join(lines)
