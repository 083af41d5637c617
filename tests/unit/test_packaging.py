"""One module identity: every part of fedbayes is imported as fedbayes.<part>, in the checkout as installed.

The parts are top-level folders of the repository and fedbayes/<part> links to each, so with the repository root on
sys.path (pytest, a script in the checkout) the bare name would otherwise load a second copy of every module, with its
own classes and registries."""

import subprocess
import sys

import pytest

from tests.support import ROOT

PARTS = ("bayes", "client", "deploy", "posterior", "protos", "server", "strategies", "tasks")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("part", PARTS)
def test_a_bare_part_name_does_not_import(part):
    result = _python(f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {part}")
    assert result.returncode != 0
    assert f"ImportError: import fedbayes.{part}, not {part}" in result.stderr


def test_every_module_loads_once_under_fedbayes():
    """Import every module of the package from the checkout (repository root first on sys.path): each is in
    sys.modules once, under fedbayes., and its file lies in the part's folder."""
    code = f"""
import importlib, pkgutil, sys
sys.path.insert(0, {str(ROOT)!r})
import fedbayes
names = [m.name for m in pkgutil.walk_packages(fedbayes.__path__, "fedbayes.")]
for name in names:
    importlib.import_module(name)
bare = sorted(n for n in sys.modules if n.split(".")[0] in {PARTS!r})
print(len(names), bare)
import fedbayes.strategies.base as base
print(base.__file__)
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr
    count, bare = result.stdout.splitlines()[0].split(" ", 1)
    assert int(count) > 60 and bare == "[]"
    assert result.stdout.splitlines()[1] == str(ROOT / "fedbayes" / "strategies" / "base.py")
