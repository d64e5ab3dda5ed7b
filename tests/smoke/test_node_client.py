"""The Node client's own test suite (clients/node), run against the real sidecars.

`node --test` starts both sidecars with this interpreter (PYTHON=sys.executable)
and exercises them over TCP and the Unix socket: ranked search, a streamed
VerifySeeds, a refused Produce with its ErrorInfo and PreconditionFailure
decoded from the trailer, and health checks. `npm ci` installs the exact
versions recorded in clients/node/package-lock.json when node_modules is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NODE_CLIENT = Path(__file__).resolve().parents[2] / "clients" / "node"
NODE_MAJOR = 20
NPM_CI_TIMEOUT_SECONDS = 300
NODE_TEST_TIMEOUT_SECONDS = 300


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=NODE_CLIENT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(
            f"`{tool}` is not on PATH: the Node client tests need Node.js {NODE_MAJOR} with npm "
            "(CI machines have it; install it, e.g. Debian's nodejs and npm packages)"
        )
    return path


def test_node_client_suite_passes_against_real_sidecars() -> None:
    node = _require("node")
    version = _run([node, "--version"], timeout=30).stdout.strip()
    major = int(version.removeprefix("v").split(".")[0])
    assert major >= NODE_MAJOR, f"the Node client needs Node.js >= {NODE_MAJOR}, found {version!r}"
    if not (NODE_CLIENT / "node_modules").is_dir():
        npm = _require("npm")
        install = _run([npm, "ci", "--no-audit", "--no-fund"], timeout=NPM_CI_TIMEOUT_SECONDS)
        assert install.returncode == 0, f"npm ci failed:\n{install.stdout}\n{install.stderr}"

    result = _run([node, "--test", "--test-reporter=tap", "test/"], timeout=NODE_TEST_TIMEOUT_SECONDS)

    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"node --test failed (exit {result.returncode}):\n{output}"
    # A run that found no test files also exits 0; make sure the suites really ran.
    assert "# fail 0" in result.stdout, output
    passed = [line for line in result.stdout.splitlines() if line.startswith("# pass ")]
    assert passed, output
    assert int(passed[-1].removeprefix("# pass ")) > 0, output
