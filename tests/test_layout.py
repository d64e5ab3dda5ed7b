"""The README's Layout table classifies every module, and its pure core modules are pure.

Read from the source (ast), never by importing: a pure core module imports no
grpc, no generated code, no I/O module and no project module outside the pure
core, and binds no mutable value at module level.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from tests.import_walk import PACKAGE, ROOT, imported_modules, member, module_file

# The checkout's folders the table classifies; each is the subpackage of the same name.
PACKAGES = ("negotiator_service", "seedstore_service", "sidecar_runtime", "clients")
PURE = "pure core"
IO_MODULES = frozenset(
    {
        "asyncio", "concurrent", "fcntl", "filelock", "glob", "http", "httpx", "io", "logging", "mmap",
        "multiprocessing", "os", "pathlib", "prometheus_client", "select", "selectors", "shutil", "signal",
        "socket", "sqlite3", "ssl", "subprocess", "tempfile", "threading", "time",
    }
)  # fmt: skip
# pathlib's pure classes compute paths and never touch the file system; importing only them is pure.
PURE_NAMES = frozenset({"pathlib.PurePath", "pathlib.PurePosixPath"})
NOT_PURE_ROOTS = frozenset(
    {"grpc", "grpc_status", "grpc_health", "grpc_reflection", "google", "agentsidecar"}
)
MUTABLE_CALLS = frozenset(
    {"dict", "list", "set", "bytearray", "defaultdict", "deque", "OrderedDict", "Counter", "IdentityCache"}
)
CACHE_DECORATORS = frozenset({"lru_cache", "cache", "cached_property"})
ROW = re.compile(r"^\| `(?P<package>\w+)/` \| (?P<what>.*) \|$")
ROLE = re.compile(r"(?P<role>pure core|shell|gRPC edge|CLI) \((?P<modules>`[^)]*`)\)")


def layout_table() -> dict[str, dict[str, list[str]]]:
    """package -> role -> the modules the README's Layout table lists in it, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    table: dict[str, dict[str, list[str]]] = {}
    for line in section.splitlines():
        row = ROW.match(line)
        if row is None or row["package"] not in PACKAGES:
            continue
        roles = table.setdefault(row["package"], {})
        for found in ROLE.finditer(row["what"]):
            role = found["role"]
            roles.setdefault(role, []).extend(re.findall(r"`([^`]+)`", found["modules"]))
    return table


def _has_code(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def package_modules(package: str) -> set[str]:
    """The package's modules as the table names them (`adapters/_calls`); an empty `__init__` is none."""
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        relative = path.relative_to(ROOT / package)
        if "node" in relative.parts or (relative.name == "__init__.py" and not _has_code(path)):
            continue
        found.add(relative.with_suffix("").as_posix())
    return found


def dotted(package: str, module: str) -> str:
    return ".".join([PACKAGE, package, *module.split("/")])


def pure_core_modules() -> set[str]:
    return {dotted(package, m) for package, roles in layout_table().items() for m in roles.get(PURE, ())}


def import_problems(module: str, core: set[str]) -> list[str]:
    path = module_file(module)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    problems = []
    pathlib_pure = _only_pure_pathlib(path)
    for imported in sorted(imported_modules(path, package)):
        root = imported.split(".")[0]
        if (root in NOT_PURE_ROOTS and member(imported) is None) or "_pb2" in imported:
            problems.append(f"{module} imports {imported} (grpc or generated code)")
        elif root in IO_MODULES and not (root == "pathlib" and pathlib_pure):
            problems.append(f"{module} imports {imported} (I/O)")
        elif member(imported) in PACKAGES and module_file(imported) is not None and imported not in core:
            problems.append(f"{module} imports {imported} (not pure core)")
    return problems


def _only_pure_pathlib(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return all(
        isinstance(node, ast.ImportFrom) and all(f"pathlib.{a.name}" in PURE_NAMES for a in node.names)
        for node in ast.walk(tree)
        if (isinstance(node, ast.ImportFrom) and node.module == "pathlib")
        or (isinstance(node, ast.Import) and any(a.name == "pathlib" for a in node.names))
    )


def _called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def state_problems(module: str) -> list[str]:
    """Module-level bindings of mutable values, and cache decorators anywhere in the module."""
    path = module_file(module)
    assert path is not None, module
    tree = ast.parse(path.read_text())
    problems = []
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if value is None or names == ["__all__"]:
            continue
        mutable = isinstance(
            value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp
        ) or (isinstance(value, ast.Call) and _called_name(value) in MUTABLE_CALLS)
        if mutable:
            problems.append(
                f"{module}:{node.lineno} binds {', '.join(names) or 'a value'} to a mutable value"
            )
    for walked in ast.walk(tree):
        if isinstance(walked, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for decorator in walked.decorator_list:
                if _called_name(decorator) in CACHE_DECORATORS:
                    name = _called_name(decorator)
                    problems.append(f"{module}:{walked.lineno} caches {walked.name} (@{name})")
    return problems


def test_every_module_is_listed_exactly_once() -> None:
    table = layout_table()
    assert set(table) == set(PACKAGES)
    for package in PACKAGES:
        listed = Counter(module for modules in table[package].values() for module in modules)
        assert sorted(m for m, n in listed.items() if n > 1) == [], f"{package}: listed twice"
        assert sorted(package_modules(package) - set(listed)) == [], f"{package}: not in the Layout table"
        assert sorted(set(listed) - package_modules(package)) == [], f"{package}: no such module"


def test_pure_core_modules_import_nothing_impure() -> None:
    core = pure_core_modules()
    assert "agentsidecar.negotiator_service.negotiation" in core
    assert "agentsidecar.seedstore_service.ranking" in core
    assert {module: import_problems(module, core) for module in sorted(core)} == {m: [] for m in sorted(core)}


def test_pure_core_modules_hold_no_module_level_mutable_state() -> None:
    core = pure_core_modules()
    assert {module: state_problems(module) for module in sorted(core)} == {m: [] for m in sorted(core)}


def test_nothing_imports_a_folder_by_its_bare_name() -> None:
    """`clients` and `agentsidecar.clients` would be two copies of every module (and of every class)."""
    bare = {*PACKAGES, "agentsidecar_pair"}
    found = []
    for directory in (*PACKAGES, "tests", "bench", "examples"):
        for path in sorted((ROOT / directory).rglob("*.py")):
            if "node_modules" in path.parts:
                continue
            for imported in imported_modules(path, ""):
                if imported.split(".")[0] in bare:
                    found.append(f"{path.relative_to(ROOT)} imports {imported}")
    assert found == []
