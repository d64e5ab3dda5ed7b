"""Build hook: compile protos/**/*.proto into Python modules at install time.

The generated `*_pb2.py`, `*_pb2.pyi` and `*_pb2_grpc.py` land beside each
`.proto` under `protos/agentsidecar/` and are never committed. The wheel
ships them as the `agentsidecar` package; an editable install puts `protos/`
on the path (see `[tool.hatch.build.targets.wheel]` in pyproject.toml).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO_ROOT = "protos"


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


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Generates the gRPC modules before the wheel (or editable) is built."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        generated = compile_protos(root)
        build_data["artifacts"].extend(str(p.relative_to(root)) for p in generated)
        cache = root / PROTO_ROOT / "agentsidecar" / "__pycache__"
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    for path in compile_protos(Path(__file__).parent):
        print(path)
