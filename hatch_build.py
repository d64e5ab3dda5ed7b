"""Build hook: compile protos/**/*.proto into Python modules at install time, and lay out
the `agentsidecar` package of a checkout.

Everything installs under one package, `agentsidecar`: the generated code from
`protos/agentsidecar/` and the repository's top-level folders as its
subpackages (`negotiator_service/` is `agentsidecar.negotiator_service`, and so
on; `agentsidecar_pair.py` is `agentsidecar.pair`). The generated `*_pb2.py`,
`*_pb2.pyi` and `*_pb2_grpc.py` land beside each `.proto` and are never
committed. A wheel maps each folder into the package (`sources` in
pyproject.toml). An editable install puts only `protos/` on the path, and this
hook links each folder into `protos/agentsidecar/`, so a checkout imports
exactly the names a wheel installs, and type checkers see the same tree
(`mypy_path = protos`). The links are ignored by git and by the wheel.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO_ROOT = "protos"
# Subpackage (or module) of `agentsidecar` -> its place in the repository.
CHECKOUT_MEMBERS = {
    "clients": "clients",
    "negotiator_service": "negotiator_service",
    "seedstore_service": "seedstore_service",
    "sidecar_runtime": "sidecar_runtime",
    "pair.py": "agentsidecar_pair.py",
}


def compile_protos(root: Path) -> list[Path]:
    """Compile every .proto under protos/agentsidecar; return generated files."""
    import grpc_tools
    from grpc_tools import protoc

    proto_dir = root / PROTO_ROOT
    sources = sorted(str(p.relative_to(proto_dir)) for p in (proto_dir / "agentsidecar").rglob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    # pip's isolated build environment puts its scripts on PATH, not beside
    # sys.executable, so look on PATH first.
    plugin_dir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{well_known}",
        f"--python_out={proto_dir}",
        f"--grpc_python_out={proto_dir}",
    ]
    mypy_plugin = Path(shutil.which("protoc-gen-mypy") or plugin_dir / "protoc-gen-mypy")
    mypy_grpc_plugin = Path(shutil.which("protoc-gen-mypy_grpc") or plugin_dir / "protoc-gen-mypy_grpc")
    if mypy_plugin.exists() and mypy_grpc_plugin.exists():
        # mypy-protobuf gives typed messages and typed (sync and aio) stubs.
        args += [
            f"--plugin=protoc-gen-mypy={mypy_plugin}",
            f"--plugin=protoc-gen-mypy_grpc={mypy_grpc_plugin}",
            f"--mypy_out={proto_dir}",
            f"--mypy_grpc_out={proto_dir}",
        ]
    else:
        args.append(f"--pyi_out={proto_dir}")
    if protoc.main([*args, *sources]) != 0:
        raise RuntimeError("protoc failed on " + " ".join(sources))
    generated: list[Path] = []
    for package_dir in sorted({(proto_dir / s).parent for s in sources} | {proto_dir / "agentsidecar"}):
        # Every directory from agentsidecar/ down becomes a regular package.
        for directory in [package_dir, *package_dir.parents]:
            if directory == proto_dir:
                break
            init = directory / "__init__.py"
            if not init.exists():
                init.write_text("")
            generated.append(init)
    (proto_dir / "agentsidecar" / "py.typed").write_text("")
    generated.append(proto_dir / "agentsidecar" / "py.typed")
    for pattern in ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", "*_pb2_grpc.pyi"):
        generated.extend((proto_dir / "agentsidecar").rglob(pattern))
    return sorted(set(generated))


def link_checkout(root: Path) -> None:
    """Link the repository's folders into protos/agentsidecar/ (editable installs only)."""
    package = root / PROTO_ROOT / "agentsidecar"
    for name, source in CHECKOUT_MEMBERS.items():
        link = package / name
        target = Path("..", "..", source)
        if link.is_symlink() and Path(link.readlink()) == target:
            continue
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            raise RuntimeError(f"{link} exists and is not the link to {source}: remove it")
        link.symlink_to(target, target_is_directory=not name.endswith(".py"))


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Generates the gRPC modules before the wheel (or editable) is built."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        generated = compile_protos(root)
        if version == "editable":
            link_checkout(root)
        build_data["artifacts"].extend(str(p.relative_to(root)) for p in generated)
        cache = root / PROTO_ROOT / "agentsidecar" / "__pycache__"
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    here = Path(__file__).parent
    for path in compile_protos(here):
        print(path)
    link_checkout(here)
