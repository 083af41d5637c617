"""Flower's `flwr` command, patient with a busy machine and quick to bundle a project:
`python -m fedbayes.deploy.patient_flwr ARGS` is `flwr ARGS`.

For a simulation connection (address ":local:") `flwr` starts a SuperLink of its own, kills it and fails
if it does not answer within 15 s, and takes it for absent if a later probe gets no answer within 0.4 s.
On a machine busy with other federations a SuperLink takes longer than that to start. `fedbayes run` calls
`flwr` through this module, which raises both bounds.

`flwr run DIR` bundles DIR into a FAB: Flower 1.39 lists and resolves every file below DIR before it filters
them, the project's virtualenv included, which every FAB leaves out. In a checkout with its `.venv` (72,000
files) that cost seconds of CPU before anything started. Here the listing does not enter the directories every
FAB leaves out (`collect_app_files`); the FAB is the same, byte for byte.

`flwr run --stream` ends when the run has; `fedbayes run` waits for this process's exit before it asks for the
run's status, so the process ends without the interpreter's teardown of Flower's modules (0.11-0.16 s of every
run's exit), as the SuperNodes do (`exit_without_teardown`).

It patches Flower 1.39's names (pinned in pyproject.toml); a name Flower no longer has is an error, not a
silent no-op.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import flwr.cli.build as build
import flwr.cli.local_superlink as local_superlink
import flwr.cli.utils as cli_utils

from fedbayes.deploy.processes import exit_without_teardown

PATIENCE = {"LOCAL_SUPERLINK_STARTUP_TIMEOUT": 300.0, "CONTROL_API_PROBE_TIMEOUT": 5.0}  # Flower: 15 s, 0.4 s


def be_patient() -> None:
    """Raise Flower's bounds in this process (`fedbayes run` asks the run's status in its own)."""
    for name, seconds in PATIENCE.items():
        _require(local_superlink, name)
        setattr(local_superlink, name, seconds)


def bundle_quickly() -> None:
    """`flwr run` and `flwr build` list a project's files with `collect_app_files`."""
    for name in ("APP_PUBLISH_EXCLUDE_PATTERNS", "build_pathspec"):
        _require(cli_utils, name)
    _require(build, "collect_files")
    if not all(pattern.endswith("/**") for pattern in cli_utils.APP_PUBLISH_EXCLUDE_PATTERNS):
        raise SystemExit("Flower's publish excludes are not all DIR/**: deploy/patient_flwr.py is for Flower 1.39")
    build.collect_files = collect_app_files


def collect_app_files(root: Path) -> dict[str, Path]:
    """Flower's `collect_files(root)` (relative POSIX path -> path; symlinks and what resolves outside `root` left
    out) without entering the directories whose every file Flower's first filter drops (its publish excludes,
    `.venv/**`, `.flwr/**`, `**/__pycache__/**`: a pattern `DIR/**` matches every path below DIR)."""
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


def _require(module: object, name: str) -> None:
    if not hasattr(module, name):
        module_name = getattr(module, "__name__", module)
        raise SystemExit(f"{module_name} has no {name}: deploy/patient_flwr.py is for Flower 1.39")


def main() -> None:
    be_patient()
    bundle_quickly()
    from flwr.cli.app import app

    exit_without_teardown(functools.partial(app, prog_name="flwr"))


if __name__ == "__main__":
    main()
