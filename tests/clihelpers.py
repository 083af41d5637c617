"""Running the `fedbayes` command as a user would, for the tests of the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def last_error_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def cli_env(**extra: str) -> dict[str, str]:
    """Our environment with the `fedbayes`/`flwr` console scripts of this interpreter first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, **extra}


def fedbayes(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> Finished:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "fedbayes.deploy.cli", *args], cwd=ROOT, env=env or cli_env(),
                            capture_output=True, text=True, timeout=timeout)
    return Finished(result.returncode, result.stdout, result.stderr, time.monotonic() - started)


def start_fedbayes(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """`fedbayes ARGS` in the background, its stdout (stderr folded in) readable line by line."""
    return subprocess.Popen([sys.executable, "-m", "fedbayes.deploy.cli", *args], cwd=ROOT, env=env or cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(process: subprocess.Popen, wanted: Callable[[str], bool]) -> list[str]:
    """Lines of `process`'s output up to and including the first one that is `wanted`; fails if the
    process ends first (pytest's timeout bounds the wait)."""
    lines: list[str] = []
    for line in process.stdout:
        lines.append(line)
        if wanted(line):
            return lines
    process.wait()
    raise AssertionError(f"`fedbayes` ended with code {process.returncode} before the line wanted:\n{''.join(lines)}")


def is_table_row(number: int) -> Callable[[str], bool]:
    """Whether a line is round `number`'s row of the table `fedbayes local` prints."""
    return lambda line: line.split()[:1] == [str(number)]
