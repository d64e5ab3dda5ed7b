"""`negotiator serve` imports only what its config uses: each adapter implementation's module, the
MCP SDK and the seedstore client are imported at their first use, not at start-up.

The server runs as a real process to READY and is stopped with SIGTERM; the modules it had
imported by then are written out at exit.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from tests.procs import start_process

# Runs the negotiator's CLI; at exit, writes every module imported (argv[1]) one a line.
SERVE_AND_LIST_MODULES = (
    "import atexit, sys\n"
    "from agentsidecar.negotiator_service.cli import main\n"
    "out = sys.argv[1]\n"
    "def dump():\n"
    "    with open(out, 'w') as f:\n"
    "        f.write('\\n'.join(sorted(sys.modules)))\n"
    "atexit.register(dump)\n"
    "sys.exit(main(sys.argv[2:]))\n"
)
ADAPTERS = "agentsidecar.negotiator_service.adapters"
# Without an acp adapter, a runtime registration, a call naming MCP servers or --seedstore: the
# SDKs, the remote adapter's module and the clients package (the seedstore client); jsonschema
# checks tool results and probe replies only.
UNUSED = ("mcp", "acp", f"{ADAPTERS}.acp", f"{ADAPTERS}.remote", "agentsidecar.clients", "jsonschema")


def modules_at_ready(tmp_path: Path, *serve_args: str, env: dict[str, str] | None = None) -> set[str]:
    """Start `negotiator serve` to READY, stop it with SIGTERM, return the modules it imported."""
    out = tmp_path / "modules.txt"
    sock = tmp_path / "n.sock"
    argv = [sys.executable, "-c", SERVE_AND_LIST_MODULES, str(out), "serve", "--listen", f"unix:{sock}"]
    process, _ = start_process([*argv, "--state-dir", str(tmp_path / "state"), *serve_args], env)
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, err
    return set(out.read_text().splitlines())


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The names (packages with their submodules) among `modules`."""
    return sorted(m for m in modules if any(m == name or m.startswith(f"{name}.") for name in names))


def test_the_embedded_default_config_starts_without_the_sdks_or_the_unused_adapters(tmp_path: Path) -> None:
    modules = modules_at_ready(tmp_path)
    assert {f"{ADAPTERS}.scripted", f"{ADAPTERS}.command"} <= modules  # the default config's two
    assert loaded(modules, (*UNUSED, f"{ADAPTERS}.openai", "aiohttp", "httpx", "anyio")) == []


def test_an_openai_adapter_brings_its_module_but_not_the_mcp_sdk(tmp_path: Path) -> None:
    config = tmp_path / "negotiator.yaml"
    adapter = {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "STARTUP_TEST_KEY", "model": "m"}
    config.write_text(
        json.dumps({"adapters": [{"shortname": "o", "implementation": "openai", "options": adapter}]})
    )
    modules = modules_at_ready(tmp_path, "--config", str(config), env={"STARTUP_TEST_KEY": "not-a-secret"})
    assert {f"{ADAPTERS}.openai", "aiohttp"} <= modules
    # Its HTTP client is aiohttp; httpx (and the anyio under it) come only with the MCP SDK.
    assert loaded(modules, (*UNUSED, f"{ADAPTERS}.scripted", "httpx", "anyio")) == []


def test_a_seedstore_brings_the_clients_package(tmp_path: Path) -> None:
    modules = modules_at_ready(tmp_path, "--seedstore", f"unix:{tmp_path / 'seedstore.sock'}")
    assert "agentsidecar.clients.aio" in modules
    assert loaded(modules, ("mcp", "acp", f"{ADAPTERS}.openai")) == []
