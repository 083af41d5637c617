"""The public API's docstrings state their contract: an `Args:` section naming every parameter, and `Returns:` (or
`Yields:` for a generator) where the function returns a value. Parsed with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Modules whose public functions, classes and methods form the library's API; extend this list as modules are
# brought up to the standard.
PUBLIC_MODULES = (
    "bayes/curvature.py",
    "bayes/gaussian.py",
    "bayes/ivon.py",
    "bayes/kernels.py",
    "bayes/metrics.py",
    "bayes/params.py",
    "bayes/robust.py",
    "client/__init__.py",
    "client/app.py",
    "client/core.py",
    "client/evaluation.py",
    "client/runtime.py",
    "client/state.py",
    "client/training.py",
    "deploy/__init__.py",
    "deploy/cli.py",
    "deploy/client.py",
    "deploy/compare.py",
    "deploy/control.py",
    "deploy/doorbell.py",
    "deploy/fleet_probe.py",
    "deploy/flower_app.py",
    "deploy/flwr_run.py",
    "deploy/forkserver.py",
    "deploy/inprocess.py",
    "deploy/inspection.py",
    "deploy/launcher.py",
    "deploy/patient_flwr.py",
    "deploy/pki.py",
    "deploy/presets.py",
    "deploy/processes.py",
    "deploy/progress.py",
    "deploy/runfile.py",
    "deploy/server.py",
    "deploy/superlink.py",
    "deploy/supernode.py",
    "deploy/warm_executor.py",
    "flowerseam/__init__.py",
    "flowerseam/boundary.py",
    "flowerseam/constants.py",
    "flowerseam/control.py",
    "flowerseam/executor.py",
    "flowerseam/fleet.py",
    "flowerseam/flwr_cli.py",
    "flowerseam/messages.py",
    "flowerseam/object_pulls.py",
    "flowerseam/patches.py",
    "flowerseam/simulation_polls.py",
    "flowerseam/superlink.py",
    "flowerseam/supernode.py",
    "flowerseam/version.py",
    "posterior/__init__.py",
    "posterior/cli.py",
    "posterior/export.py",
    "posterior/file.py",
    "posterior/predictive.py",
    "posterior/uncertainty.py",
    "protos/codec.py",
    "server/__init__.py",
    "server/app.py",
    "server/assembly.py",
    "server/checkpoint.py",
    "server/client_metrics.py",
    "server/evaluation.py",
    "server/forget/__init__.py",
    "server/forget/audit.py",
    "server/forget/client_part.py",
    "server/forget/command.py",
    "server/forget/interface.py",
    "server/forget/lock.py",
    "server/forget/requests.py",
    "server/forget/settling.py",
    "server/forget/stopped.py",
    "server/identity.py",
    "server/isolation.py",
    "server/loop.py",
    "server/preflight.py",
    "server/round_core.py",
    "server/tracking.py",
    "strategies/__init__.py",
    "strategies/base.py",
    "strategies/bayesadmm/__init__.py",
    "strategies/bayesadmm/client.py",
    "strategies/bayesadmm/math.py",
    "strategies/bayesadmm/server.py",
    "strategies/bayesadmm/settings.py",
    "strategies/dsvgd/__init__.py",
    "strategies/dsvgd/client.py",
    "strategies/dsvgd/math.py",
    "strategies/dsvgd/server.py",
    "strategies/dsvgd/settings.py",
    "strategies/fedavg/__init__.py",
    "strategies/fedavg/client.py",
    "strategies/fedavg/server.py",
    "strategies/fedavg/settings.py",
    "strategies/feddyn/__init__.py",
    "strategies/feddyn/client.py",
    "strategies/feddyn/math.py",
    "strategies/feddyn/server.py",
    "strategies/feddyn/settings.py",
    "strategies/fedlap/__init__.py",
    "strategies/fedlap/client.py",
    "strategies/fedlap/math.py",
    "strategies/fedlap/server.py",
    "strategies/fedlap/settings.py",
    "strategies/fedlap_func/__init__.py",
    "strategies/fedlap_func/client.py",
    "strategies/fedlap_func/math.py",
    "strategies/fedlap_func/server.py",
    "strategies/fedlap_func/settings.py",
    "strategies/fedpa/__init__.py",
    "strategies/fedpa/client.py",
    "strategies/fedpa/math.py",
    "strategies/fedpa/server.py",
    "strategies/fedpa/settings.py",
    "strategies/membership.py",
    "tasks/compute.py",
    "tasks/config.py",
    "tasks/datasets.py",
    "tasks/events.py",
    "tasks/message_limits.py",
    "tasks/models.py",
    "tasks/npzdata.py",
    "tasks/ood.py",
    "tasks/partitions.py",
    "tasks/preflight.py",
    "tasks/report.py",
    "tasks/runfiles.py",
    "tasks/runlog.py",
    "tasks/slots.py",
    "tasks/storage.py",
    "tasks/validation.py",
)

SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Yields|Raises|Attributes|Examples?|Notes?):\s*$")
ARG_LINE = re.compile(r"^\s*\**(\w+)\s*(\([^)]*\))?\s*:")
NO_VALUE = {"None", "NoReturn", "Never"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


def public_functions(tree: ast.Module) -> Iterator[tuple[str, Function]]:
    """Module-level public functions and the public methods of module-level public classes."""
    for node in tree.body:
        if isinstance(node, Function) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, Function) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def parameters(function: Function) -> list[str]:
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in names if name not in ("self", "cls")]


def section(docstring: str, title: str) -> list[str] | None:
    """The lines of the docstring's `title:` section, or None without one."""
    lines = docstring.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == f"{title}:"), None)
    if start is None:
        return None
    body = []
    for line in lines[start + 1 :]:
        if SECTION.match(line):
            break
        body.append(line)
    return body


def documented_args(docstring: str) -> set[str]:
    body = section(docstring, "Args") or []
    indents = [len(line) - len(line.lstrip()) for line in body if line.strip()]
    if not indents:
        return set()
    entries = (ARG_LINE.match(line) for line in body if len(line) - len(line.lstrip()) == min(indents))
    return {match.group(1) for match in entries if match}


def returns_value(function: Function) -> bool:
    if function.returns is None or any(_is_property(d) for d in function.decorator_list):
        return False
    return ast.unparse(function.returns).strip("'\"") not in NO_VALUE


def _is_property(decorator: ast.expr) -> bool:
    return isinstance(decorator, ast.Name) and decorator.id in ("property", "cached_property")


def _is_generator(function: Function) -> bool:
    own = [n for n in ast.walk(function) if isinstance(n, ast.Yield | ast.YieldFrom)]
    return bool(own)


def contract_problems(path: Path) -> list[str]:
    """One line per public function of `path` whose docstring misses its Args or Returns."""
    problems = []
    for name, function in public_functions(ast.parse(path.read_text(encoding="utf-8"))):
        docstring = ast.get_docstring(function) or ""
        where = f"{path.relative_to(ROOT)}:{function.lineno} {name}"
        missing = [p for p in parameters(function) if p not in documented_args(docstring)]
        if missing:
            problems.append(f"{where}: Args: does not list {', '.join(missing)}")
        if returns_value(function):
            title = "Yields" if _is_generator(function) else "Returns"
            if section(docstring, title) is None:
                problems.append(f"{where}: no {title}: section")
    return problems


def test_the_module_list_names_existing_files():
    assert [m for m in PUBLIC_MODULES if not (ROOT / m).is_file()] == []


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_docstrings_state_args_and_returns(module):
    problems = contract_problems(ROOT / module)
    assert problems == [], "\n".join(problems)
