"""The clients import no server code: only clients/, the generated code, client-safe runtime modules
and libraries. Read from the source (ast), every import statement counted, nested and
TYPE_CHECKING ones included, and followed through the runtime modules they reach."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.import_walk import ROOT, imported_modules, member, module_file

SERVER_PACKAGES = frozenset({"negotiator_service", "seedstore_service", "pair"})
# The runtime modules a client may reach; anything else under agentsidecar.sidecar_runtime serves a server.
CLIENT_SAFE_RUNTIME = frozenset(
    {
        "agentsidecar.sidecar_runtime.addresses",
        "agentsidecar.sidecar_runtime.statusdecode",
        "agentsidecar.sidecar_runtime.violations",  # a value class, which statusdecode hands back
        "agentsidecar.sidecar_runtime.wire_names",
    }
)


def client_import_problems() -> list[str]:
    problems: list[str] = []
    queue = [(path, "agentsidecar.clients") for path in sorted((ROOT / "clients").glob("*.py"))]
    seen: set[Path] = set()
    while queue:
        path, package = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        where = path.relative_to(ROOT)
        for module in sorted(imported_modules(path, package)):
            root = member(module)
            if root in SERVER_PACKAGES:
                problems.append(f"{where} imports {module}")
            elif root == "sidecar_runtime" and module != "agentsidecar.sidecar_runtime":
                target = module_file(module)
                if (
                    target is None
                ):  # `from agentsidecar.sidecar_runtime.m import name`: the name, not a module
                    continue
                if module not in CLIENT_SAFE_RUNTIME:
                    problems.append(f"{where} imports {module}, which is not a client-safe runtime module")
                queue.append((target, "agentsidecar.sidecar_runtime"))
    return problems


def test_clients_import_no_server_code() -> None:
    assert client_import_problems() == []


def test_the_walk_sees_a_server_import(tmp_path: Path) -> None:
    """The walk itself: a nested, a relative-free and a TYPE_CHECKING import are all found."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agentsidecar.negotiator_service.model import Capability\n"
        "def f():\n    import agentsidecar.seedstore_service.ranking\n"
    )
    found = imported_modules(source, "clients")
    assert "agentsidecar.negotiator_service.model" in found
    assert "agentsidecar.seedstore_service.ranking" in found


def test_the_package_imports_a_names_module_on_first_use() -> None:
    """`from agentsidecar.clients import SeedStoreClient` imports the blocking client, not the asyncio
    one nor the negotiator's; every exported name is its module's own object."""
    probe = (
        "import sys\n"
        "from agentsidecar.clients import SeedStoreClient, SidecarError\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('agentsidecar.'))))\n"
        "import importlib\n"
        "import agentsidecar.clients as clients\n"
        "for name in clients.__all__:\n"
        "    where = clients._MODULE_OF.get(name, 'errors')\n"
        "    module = importlib.import_module(f'agentsidecar.clients.{where}')\n"
        "    assert getattr(clients, name) is getattr(module, name), name\n"
        "print(set(clients._MODULE_OF) <= set(clients.__all__))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stderr
    first, last = completed.stdout.splitlines()
    loaded = set(first.split())
    assert {"agentsidecar.clients.seedstore", "agentsidecar.clients.errors"} <= loaded
    assert loaded.isdisjoint(
        {"agentsidecar.clients.aio", "agentsidecar.clients.negotiator", "agentsidecar.negotiator.v1"}
    )
    assert last == "True"
