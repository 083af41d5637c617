"""Where fedbayes touches private Flower: the import-linter contract that only fedbayes.flowerseam does, and the
count of such references (`python -m fedbayes.flowerseam.boundary [ROOT]`, ROOT the checkout: default the one this
module is in).

Private Flower is anything but Flower's public API: the modules PUBLIC_MODULES, and of those only the names their
`__all__` exports. A reference is an import of a private module or name, a private module's name in a string (what
`importlib.import_module` and the preload lists take), or a look at `flwr.__version__` (the version gate's)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from importlinter import Contract, ContractCheck, fields, output

PUBLIC_MODULES = ("flwr.app", "flwr.clientapp", "flwr.serverapp", "flwr.common", "flwr.simulation")
SEAM = "fedbayes.flowerseam"
PARTS = ("bayes", "protos", "tasks", "strategies", "client", "server", "posterior", "deploy")  # outside the seam


@cache
def public_names(module: str) -> frozenset[str]:
    """What public Flower module `module` exports (its `__all__`).

    Args:
        module: one of PUBLIC_MODULES; it is imported. Cached per module.

    Returns:
        The names; empty for a module without `__all__`.
    """
    return frozenset(getattr(importlib.import_module(module), "__all__", ()))


def _is_flower(module: str) -> bool:
    return module == "flwr" or module.startswith("flwr.")


def private_references(source: str) -> Iterator[tuple[int, str]]:
    """The references to private Flower in Python `source`.

    Args:
        source: a module's text.

    Yields:
        (line, what) for each reference, in the order `ast.walk` meets them.

    Raises:
        SyntaxError: `source` is not Python.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and _is_flower(node.module):
            names = {alias.name for alias in node.names}
            if node.module not in PUBLIC_MODULES or not names <= public_names(node.module):
                yield node.lineno, f"from {node.module} import {', '.join(sorted(names))}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_flower(alias.name) and alias.name not in ("flwr", *PUBLIC_MODULES):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value
            if name.startswith("flwr.") and name.replace(".", "").replace("_", "").isalnum():
                if name not in PUBLIC_MODULES:
                    yield node.lineno, f"module name {name!r}"
        elif isinstance(node, ast.Attribute) and node.attr == "__version__":
            if isinstance(node.value, ast.Name) and node.value.id == "flwr":
                yield node.lineno, "flwr.__version__"


def references_outside_seam(root: Path) -> list[str]:
    """Every reference to private Flower in the parts of the checkout at `root` but the seam.

    Args:
        root: the repository root (its parts are top-level folders).

    Returns:
        "path:line: what" for each.
    """
    found = []
    for part in PARTS:
        for path in sorted((root / part).rglob("*.py")):
            for line, what in private_references(path.read_text()):
                found.append(f"{path.relative_to(root)}:{line}: {what}")
    return found


class PrivateFlowerContract(Contract):
    """import-linter contract: no module of `root_package` outside `seam` references private Flower."""

    seam = fields.StringField()

    def check(self, graph, verbose: bool) -> ContractCheck:
        """import-linter's hook: look in every fedbayes module of the graph outside the seam for private Flower.

        Args:
            graph: import-linter's import graph; only its module names are used (each module's source is read).
            verbose: import-linter passes it; unused.

        Returns:
            Kept when there is no reference; its metadata's "broken" lists each as "module:line: what".
        """
        seam = str(self.seam)
        broken = []
        for module in sorted(graph.modules):
            if not module.startswith("fedbayes.") or module == seam or module.startswith(f"{seam}."):
                continue
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
                continue
            for line, what in private_references(Path(spec.origin).read_text()):
                broken.append(f"{module}:{line}: {what}")
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        """import-linter's hook: print the references that broke the contract.

        Args:
            check: what `check` returned.
        """
        output.print_error(f"Private Flower outside {self.seam} (move it into the seam):")
        for reference in check.metadata["broken"]:
            output.print_error(f"  {reference}", bold=False)


def main(argv: list[str]) -> int:
    """Print the references outside the seam and their count.

    Args:
        argv: the arguments after the module: the checkout's root, or none (the one this module is in).

    Returns:
        The exit status: 1 if there are any, else 0.
    """
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    found = references_outside_seam(root)
    print("\n".join([*found, f"{len(found)} reference(s) to private Flower outside the seam"]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
