"""The bootstrap plan is pure: neither it nor anything of the project it reaches imports grpc,
generated code or an I/O module, read from the source (ast)."""

from __future__ import annotations

from tests.import_walk import imported_modules, module_file

PURE = ("negotiator_service.bootstrap_plan", "sidecar_runtime.wire_names")
NOT_PURE = frozenset(
    {"grpc", "agentsidecar", "google", "os", "io", "socket", "subprocess", "asyncio", "shutil", "tempfile"}
)


def purity_problems(module: str) -> list[str]:
    problems: list[str] = []
    queue, seen = [module], set()
    while queue:
        name = queue.pop()
        path = module_file(name)
        if path is None or name in seen:
            continue
        seen.add(name)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in sorted(imported_modules(path, package)):
            if imported.split(".")[0] in NOT_PURE:
                problems.append(f"{name} imports {imported}")
            elif module_file(imported) is not None:
                queue.append(imported)
    return problems


def test_the_bootstrap_plan_and_the_wire_names_are_pure() -> None:
    assert {module: purity_problems(module) for module in PURE} == {module: [] for module in PURE}
