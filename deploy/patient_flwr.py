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

The patches are fedbayes.flowerseam.flwr_cli's, gated on the Flower they were read in (pinned in pyproject.toml).
"""

from __future__ import annotations

from fedbayes.deploy.processes import exit_without_teardown
from fedbayes.flowerseam.flwr_cli import be_patient, bundle_quickly, flwr_app


def main() -> None:
    """`flwr` with sys.argv's arguments, patched to be patient and to bundle quickly; the process ends with it
    (`exit_without_teardown`).

    Raises:
        SystemExit: a Flower other than the one the patches were read in.
    """
    be_patient()
    bundle_quickly()
    exit_without_teardown(flwr_app())


if __name__ == "__main__":
    main()
