"""Reading a module's imports from its source (ast): every import statement, nested and
TYPE_CHECKING ones included, so a rule about what may import what is checked without importing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "agentsidecar"
# The subpackages of `agentsidecar` a checkout holds as top-level folders (hatch_build.py).
CHECKOUT_MEMBERS = frozenset(
    {"clients", "negotiator_service", "seedstore_service", "sidecar_runtime", "pair"}
)


def member(module: str) -> str | None:
    """The checkout member a module belongs to (`agentsidecar.clients.aio` -> `clients`), or None."""
    parts = module.split(".")
    if len(parts) > 1 and parts[0] == PACKAGE and parts[1] in CHECKOUT_MEMBERS:
        return parts[1]
    return None


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module `path` imports, absolute, with `from m import n` also counted as `m.n`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def module_file(module: str) -> Path | None:
    """The repository file of `module`, or None (a library, or a name imported from a module)."""
    parts = module.split(".")
    if member(module) == "pair":
        return ROOT / "agentsidecar_pair.py" if len(parts) == 2 else None
    if member(module) is not None:
        parts = parts[1:]
    for candidate in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None
