"""The public API's docstrings state their contract: an `Args:` section naming every parameter, and `Returns:` (or
`Yields:` for a generator) where the function returns a value. Parsed with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The library's packages: every public function, class and method of each of their modules (generated protobuf
# code and the Docker build's helper aside) states its contract.
PACKAGES = ("bayes", "client", "deploy", "flowerseam", "posterior", "protos", "server", "strategies", "tasks")
NOT_LIBRARY = ("deploy/docker/",)


def library_modules() -> list[str]:
    """Every module of PACKAGES, as a path from the repository's root."""
    paths = (path.relative_to(ROOT).as_posix() for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    return sorted(p for p in paths if not p.endswith("_pb2.py") and not p.startswith(NOT_LIBRARY))


PUBLIC_MODULES = library_modules()

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


def test_every_package_is_read():
    assert {module.split("/")[0] for module in PUBLIC_MODULES} == set(PACKAGES)
    assert "server/round_core.py" in PUBLIC_MODULES and "protos/payloads_pb2.py" not in PUBLIC_MODULES


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_docstrings_state_args_and_returns(module):
    problems = contract_problems(ROOT / module)
    assert problems == [], "\n".join(problems)
