"""`seedstore --server ADDR list` imports what one call from the blocking client needs, and prints what
the local `seedstore list` prints.

A real `seedstore serve` process on a Unix socket, stopped with SIGTERM; the CLI runs as the
`seedstore` command does (quickread's main, which hands `--server` reads to remote_read.py), in a
process that writes out every module it had imported at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentsidecar.seedstore_service.patch import AddSpec
from agentsidecar.seedstore_service.store import SeedStore
from tests.procs import start_process, stop_process

# Runs the `seedstore` command with argv[2:]; at exit, writes every module imported (argv[1]) one a line.
RUN_AND_LIST_MODULES = (
    "import atexit, sys\n"
    "from agentsidecar.seedstore_service.quickread import main\n"
    "out = sys.argv[1]\n"
    "def dump():\n"
    "    with open(out, 'w') as f:\n"
    "        f.write('\\n'.join(sorted(sys.modules)))\n"
    "atexit.register(dump)\n"
    "sys.argv = ['seedstore', *sys.argv[2:]]\n"
    "sys.exit(main())\n"
)
# What grpc and the generated seedstore code import by themselves (grpc's cygrpc imports asyncio).
GRPC_ITSELF = "import grpc\nfrom agentsidecar.seedstore.v1 import seedstore_pb2_grpc\n"
SEEDSTORE = "agentsidecar.seedstore_service"
# The service's modules, the asyncio and negotiator clients, the service's half of `convert`
# with what it brings (the YAML parser, the index, the runner), the sending half of the status
# code, and the decoding of an error (only a failed call needs it); cli.py with the local
# store's modules and the core value types a reply is not turned into on this path.
UNUSED = (
    "yaml",
    f"{SEEDSTORE}.cli",
    f"{SEEDSTORE}.operations",
    f"{SEEDSTORE}.store",
    f"{SEEDSTORE}.model",
    f"{SEEDSTORE}.remote_frontend",
    f"{SEEDSTORE}.remote_convert",
    f"{SEEDSTORE}.server",
    f"{SEEDSTORE}.servicer",
    f"{SEEDSTORE}.index",
    f"{SEEDSTORE}.convert",
    f"{SEEDSTORE}.broadening",
    f"{SEEDSTORE}.runner",
    f"{SEEDSTORE}.verification",
    "agentsidecar.clients.aio",
    "agentsidecar.clients.negotiator",
    "agentsidecar.negotiator",
    "agentsidecar.sidecar_runtime.richstatus",
    "grpc_status",
    "google.rpc",
)


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The names (packages with their submodules) among `modules`."""
    return sorted(m for m in modules if any(m == name or m.startswith(f"{name}.") for name in names))


def run_listing_modules(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[str, set[str]]:
    """Run `seedstore ARGS`; return its stdout and the modules it imported."""
    out = tmp_path / "modules.txt"
    completed = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES, str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == ""
    return completed.stdout, set(out.read_text().splitlines())


def grpc_own_modules(env: dict[str, str]) -> set[str]:
    listing = "import sys\n" + GRPC_ITSELF + "print('\\n'.join(sys.modules))\n"
    completed = subprocess.run(
        [sys.executable, "-c", listing], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return set(completed.stdout.splitlines())


@pytest.mark.slow
def test_server_list_imports_only_the_blocking_call_and_prints_the_local_listing(
    home: Path, socket_dir: Path, tmp_path: Path
) -> None:
    store = SeedStore(home / "capabilities")
    for index, domain in enumerate(("voice", "voice", "image")):
        store.add(
            AddSpec(
                id=f"seed-{index}",
                domain=domain,
                kind="cli",
                command=f"tool-{index}",
                provides=("text_to_speech",) if domain == "voice" else ("image_generation",),
                evidence_commands=(f"tool-{index} --help",),
            )
        )
    env = {key: value for key, value in os.environ.items() if not key.startswith("SEEDSTORE_")}
    env["SKILLSPEC_HOME"] = str(home)
    target = f"unix:{socket_dir / 'seedstore.sock'}"
    serve = [sys.executable, "-m", f"{SEEDSTORE}.cli", "serve", "--listen", target]
    server, _ = start_process(serve, env)
    try:
        remote, modules = run_listing_modules(tmp_path, env, "--server", target, "list")
    finally:
        stop_process(server)
    local, _ = run_listing_modules(tmp_path, env, "list")

    assert remote == local
    assert '"id": "seed-2"' in remote
    assert {f"{SEEDSTORE}.remote_read", "agentsidecar.clients.seedstore", "grpc"} <= modules
    assert loaded(modules, UNUSED) == []
    # asyncio only as grpc itself imports it.
    assert loaded(modules, ("asyncio",)) == loaded(grpc_own_modules(env), ("asyncio",))
