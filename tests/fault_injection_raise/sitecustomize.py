"""Test-only: makes every FedAvg ClientApp of the processes that have this folder on PYTHONPATH raise.

Like tests/fault_injection: it acts only in ClientApp processes (fresh `flwr-clientapp` ones, or the warm
`fedbayes superexec` whose forks run them); the ServerApp and the daemons run unchanged.
"""

import sys

if sys.argv and (sys.argv[0].endswith("flwr-clientapp") or sys.argv[1:2] == ["superexec"]):
    import fedbayes.strategies.fedavg as fedavg

    def failing_client_update(content, runtime):
        raise RuntimeError("injected fault: this client cannot train")

    fedavg.client_update = failing_client_update
