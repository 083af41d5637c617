"""Patches of Flower's `flwr` CLI, for `python -m fedbayes.deploy.patient_flwr` (which says why): its simulation
SuperLink's start-up and probe timeouts raised (`be_patient`), and a project listed for its FAB without entering the
directories no FAB holds (`bundle_quickly`). docs/reference/flower-patches.md has each one's upstream counterpart."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path

import flwr.cli.build as build
import flwr.cli.local_superlink as local_superlink
import flwr.cli.utils as cli_utils

from fedbayes.flowerseam.version import require_patched_flower

PATIENCE = {"LOCAL_SUPERLINK_STARTUP_TIMEOUT": 300.0, "CONTROL_API_PROBE_TIMEOUT": 5.0}  # Flower: 15 s, 0.4 s
WHO, INSTEAD = "fedbayes run", "flwr"  # for the version gate's message


def be_patient() -> None:
    """Raise Flower's bounds in this process (`fedbayes run` asks the run's status in its own).

    Raises:
        SystemExit: the installed Flower is not the one this was read in.
    """
    require_patched_flower(WHO, "local SuperLink timeouts", INSTEAD)
    for name, seconds in PATIENCE.items():
        setattr(local_superlink, name, seconds)


def bundle_quickly() -> None:
    """`flwr run` and `flwr build` list a project's files with `collect_app_files`.

    Raises:
        SystemExit: the installed Flower is not the one this was read in, or its publish excludes are not all
            `DIR/**` (what `collect_app_files` relies on).
    """
    require_patched_flower(WHO, "FAB listing", INSTEAD)
    if not all(pattern.endswith("/**") for pattern in cli_utils.APP_PUBLISH_EXCLUDE_PATTERNS):
        raise SystemExit("Flower's publish excludes are not all DIR/**: fedbayes.flowerseam.flwr_cli cannot skip them")
    build.collect_files = collect_app_files


def collect_app_files(root: Path) -> dict[str, Path]:
    """Flower's `collect_files(root)` (relative POSIX path -> path; symlinks and what resolves outside `root` left
    out) without entering the directories whose every file Flower's first filter drops (its publish excludes,
    `.venv/**`, `.flwr/**`, `**/__pycache__/**`: a pattern `DIR/**` matches every path below DIR).

    Args:
        root: the app's directory.

    Returns:
        Relative POSIX path -> path, for every regular file below `root` but those left out.
    """
    excluded = cli_utils.build_pathspec(cli_utils.APP_PUBLISH_EXCLUDE_PATTERNS)
    resolved_root = root.resolve()
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath).relative_to(root)
        dirnames[:] = [name for name in dirnames if not excluded.match_file(f"{(here / name).as_posix()}/")]
        for filename in filenames:
            path = Path(dirpath) / filename
            if not path.is_symlink() and path.resolve().is_relative_to(resolved_root):
                files[path.relative_to(root).as_posix()] = path
    return files


def flwr_app() -> Callable[[], None]:
    """Flower's `flwr` command, as its console script runs it (arguments from sys.argv).

    Returns:
        The function that runs it (the caller decides how the process ends).
    """
    from flwr.cli.app import app

    return functools.partial(app, prog_name="flwr")
