"""Flower's `flwr` command, patient with a busy machine: `python -m fedbayes.deploy.patient_flwr ARGS` is `flwr ARGS`.

For a simulation connection (address ":local:") `flwr` starts a SuperLink of its own, kills it and fails
if it does not answer within 15 s, and takes it for absent if a later probe gets no answer within 0.4 s.
On a machine busy with other federations a SuperLink takes longer than that to start (seen: 2-core
machine, load 20-30). `fedbayes run` calls `flwr` through this module, which raises both bounds. It
patches Flower 1.39's names (pinned in pyproject.toml); a name Flower no longer has is an error, not a
silent no-op.
"""

from __future__ import annotations

import flwr.cli.local_superlink as local_superlink

PATIENCE = {"LOCAL_SUPERLINK_STARTUP_TIMEOUT": 300.0, "CONTROL_API_PROBE_TIMEOUT": 5.0}  # Flower: 15 s, 0.4 s


def be_patient() -> None:
    """Raise Flower's bounds in this process (`fedbayes run` asks the run's status in its own)."""
    for name, seconds in PATIENCE.items():
        if not hasattr(local_superlink, name):
            raise SystemExit(f"flwr.cli.local_superlink has no {name}: deploy/patient_flwr.py is for Flower 1.39")
        setattr(local_superlink, name, seconds)


def main() -> None:
    be_patient()
    from flwr.cli.app import app

    app(prog_name="flwr")


if __name__ == "__main__":
    main()
