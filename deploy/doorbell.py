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
ring was lost.

Any process in the namespace can send to the bell, so the executor guards it two ways. Every ring carries its
sender's pid (SO_PASSCRED: the kernel fills it in, the process's pid for any of its threads, and only a
privileged sender can claim another): a Doorbell that knows its SuperNode's process (the executor's
`--parent-pid`) answers only that process's rings and drops the others, reporting the first stranger once.
And once answered, and again once the ask it caused has returned, the bell goes unheard for `RING_INTERVAL` (rings
meanwhile wait in the socket): a process ringing in a loop, a stranger or the SuperNode itself, makes the executor
wake, and ask, at most about as often as Flower's own polling (FLWR_SUPEREXEC_TASK_POLL_INTERVAL, which we set to
0.2 s), not in a spin.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

# Seconds between asks once the bell has been heard. Only a lost ring needs them (a SuperNode takes one message at a
# time and rings for each; rings in the quiet spell wait in the socket), and each ask is an HTTP request that the
# executor and the SuperNode both pay for: ten SuperNodes asked every 2 s cost ~0.5 CPU-s a BayesADMM-10 round.
HEARD_POLL = 10.0
RING_INTERVAL = 0.2  # seconds the bell goes unheard after it was answered
# Rings one answer takes at most: more than the socket queues (net.unix.max_dgram_qlen, 10 by default), and a bound,
# so that a process ringing as fast as they are taken cannot keep the answer from ending.
RINGS_PER_ANSWER = 64
UCRED = struct.Struct("iII")  # Linux's struct ucred: pid, uid, gid


def bell_address(runtime_port: int) -> bytes:
    """The abstract-namespace address of the doorbell of the SuperNode whose Runtime API is on `runtime_port`.

    Args:
        runtime_port: the SuperNode's Runtime API port.

    Returns:
        The address, starting with a NUL byte.
    """
    return f"\0fedbayes-doorbell-{runtime_port}".encode()


def ring(runtime_port: int) -> None:
    """Ring the doorbell once, without blocking; nothing happens where no one listens or its queue is full.

    Args:
        runtime_port: the SuperNode's Runtime API port.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as bell:
        bell.setblocking(False)
        try:
            bell.sendto(b"!", bell_address(runtime_port))
        except OSError:  # no executor of ours listens, or its queue is full: it asks soon anyway
            pass


class Doorbell:
    """The executor's side: its `socket` becomes readable when the bell rings; `answer()` then empties it, and from
    then on the executor waits for the bell between asks (asking at least every HEARD_POLL seconds). With
    `ringer_pid`, only that process's rings count (None: anyone's); `on_stranger(pid)` hears of the first other
    process that rang."""

    def __init__(self, runtime_port: int, ringer_pid: int | None, on_stranger: Callable[[int | None], None]) -> None:
        """Listen for the bell of the SuperNode on `runtime_port`.

        Args:
            runtime_port: the SuperNode's Runtime API port.
            ringer_pid: the SuperNode's process; None: anyone's rings count.
            on_stranger: called once, with its pid (None where the kernel gave none), for the first other process that
                rang.

        Raises:
            OSError: another process already listens for this port.
        """
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # before any ring: each carries its pid
        self.socket.bind(bell_address(runtime_port))  # OSError if another process already listens for this port
        self.socket.setblocking(False)
        self.ringer_pid, self.on_stranger = ringer_pid, on_stranger
        self.heard = False
        self.stranger_rang = False
        self.quiet_until = 0.0  # time.monotonic() until which the bell goes unheard

    def listening(self) -> bool:
        """Whether the bell is heard now (its quiet spell after an answer is over).

        Returns:
            True once time.monotonic() reaches `quiet_until`.
        """
        return time.monotonic() >= self.quiet_until

    def answer(self) -> bool:
        """Take the rings so far (one ask answers them all); whether the SuperNode rang (anyone, without a
        ringer_pid). The bell then goes unheard for RING_INTERVAL.

        Returns:
            True if the SuperNode (or, without a ringer_pid, anyone) rang.
        """
        rang = False
        for _ in range(RINGS_PER_ANSWER):
            try:
                _, ancillary, _, _ = self.socket.recvmsg(16, socket.CMSG_SPACE(UCRED.size))
            except BlockingIOError:
                break
            pid = _sender_pid(ancillary)
            if self.ringer_pid is None or pid == self.ringer_pid:
                rang = True
            elif not self.stranger_rang:
                self.stranger_rang = True
                self.on_stranger(pid)
        self.heard |= rang
        self.hush()
        return rang

    def hush(self) -> None:
        """Leave the bell unheard for RING_INTERVAL from now. The executor hushes it again once an ask has returned,
        so that asks, not only answers, are RING_INTERVAL apart however long an ask took."""
        self.quiet_until = time.monotonic() + RING_INTERVAL


def _sender_pid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The ringing process's pid, from the credentials the kernel attached (None if none were: a ring then counts
    only for a Doorbell that answers anyone)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            return UCRED.unpack_from(data)[0]
    return None
