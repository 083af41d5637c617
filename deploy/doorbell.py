"""A doorbell from a SuperNode to its warm executor, so that the executor need not poll for work.

Flower's SuperExec asks its SuperNode for a ClientApp task every FLWR_SUPEREXEC_TASK_POLL_INTERVAL seconds (we
set 0.2): each ask is an HTTP call that both processes pay for, about 0.1 CPU-s per client and round of
BayesADMM-10 on two cores, and it is all the latency between a message reaching the SuperNode and its ClientApp
starting. With the doorbell, `fedbayes supernode` rings once it has taken a message for its ClientApp, and
`fedbayes superexec`, waiting between asks, asks at once.

The bell is a datagram on a Linux abstract-namespace Unix socket named after the SuperNode's Runtime API port:
no file, nothing left behind, reachable only within the network namespace (machine or container) both run in.
Ringing with no one listening does nothing (Flower's own `flower-superexec`, an executor elsewhere). An executor
that has never heard its bell (a SuperNode in another container, or Flower's `flower-supernode`) keeps polling
as Flower does; once it has, it waits for the bell, and asks at least every `HEARD_POLL` seconds in case a
ring was lost. Any process in the namespace can ring: a ring only makes the executor ask, which it may always do.
"""

from __future__ import annotations

import socket

HEARD_POLL = 2.0


def bell_address(runtime_port: int) -> bytes:
    return f"\0fedbayes-doorbell-{runtime_port}".encode()


def ring(runtime_port: int) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as bell:
        bell.setblocking(False)
        try:
            bell.sendto(b"!", bell_address(runtime_port))
        except OSError:  # no executor of ours listens, or its queue is full: it asks soon anyway
            pass


class Doorbell:
    """The executor's side: its `socket` becomes readable when the bell rings; `answer()` then empties it, and from
    then on the executor waits for the bell between asks (asking at least every HEARD_POLL seconds)."""

    def __init__(self, runtime_port: int) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(bell_address(runtime_port))  # OSError if another process already listens for this port
        self.socket.setblocking(False)
        self.heard = False

    def answer(self) -> bool:
        """Take every ring so far (one ask answers them all); whether there was one."""
        rang = False
        while True:
            try:
                self.socket.recv(16)
            except BlockingIOError:
                break
            rang = True
        self.heard |= rang
        return rang
