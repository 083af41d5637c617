"""A pseudo-terminal and what a terminal would show of the bytes written to it: what the progress-line tests
(tests/unit/test_progress.py, tests/integration/test_progress.py) read their output with."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import termios

ROW = {
    "round": 1,
    "accuracy": 0.6356,
    "nll": 1.7689,
    "ece": 0.2187,
    "clients": 2,
    "clients_sent": 3,
    "round_seconds": 2.7,
    "wall_seconds": 2.7,
}


def rendered(output: str) -> list[str]:
    """The lines a terminal shows for `output`: a carriage return goes back to the line's start, ESC[K erases the rest
    of the line, a newline starts the next one (a pty turns "\\n" into "\\r\\n")."""
    lines, line, column = [], "", 0
    position = 0
    while position < len(output):
        if output.startswith("\x1b[K", position):
            line, position = line[:column], position + 3
            continue
        char = output[position]
        position += 1
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append(line)
            line, column = "", 0
        else:
            line = line[:column] + char + line[column + 1 :]
            column += 1
    return lines + ([line] if line else [])


def open_terminal(columns: int = 120) -> tuple[int, int]:
    """A pty (master, slave) whose terminal is `columns` wide."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    return master, slave


def read_all(master: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks).decode()
