"""`make test`'s groups hold (tests/conftest.py): each module's tests run on one pytest-xdist worker. They silently
did not: our hook added the groups after xdist had read them, and pytest 9.2 ignores the test id xdist rewrites
(pytest-dev/pytest-xdist#1386, hence pyproject's pytest < 9.2); two system tests then filled the image's wheelhouse
at the same moment and one failed."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.integration
MODULES = ("tests/unit/test_pki.py", "tests/unit/test_tasks_partitions.py")  # neither imports torch


def test_each_module_runs_on_one_worker():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider", *MODULES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    workers = defaultdict(set)
    for worker, module in re.findall(r"^\[(gw\d+)\] .*? PASSED (tests/\S+?\.py)::", result.stdout, re.MULTILINE):
        workers[module].add(worker)
    assert set(workers) == set(MODULES), result.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
