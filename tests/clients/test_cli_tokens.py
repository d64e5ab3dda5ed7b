"""Both CLIs reach a sidecar that asks for a bearer token: the token file named by
SEEDSTORE_TOKEN_FILE / NEGOTIATOR_TOKEN_FILE, as real processes on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import start_process, stop_process

BIN = Path(sys.executable).parent


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A seedstore and a negotiator with --token-file; their addresses and the token file."""
    sockets = Path(tempfile.mkdtemp(prefix="tok-", dir="/tmp"))
    token_file = tmp_path / "token"
    token_file.write_text("cli-s3cret\n")
    home = tmp_path / "home"
    home.mkdir()
    seed, neg = f"unix:{sockets / 's.sock'}", f"unix:{sockets / 'n.sock'}"
    env = {"SKILLSPEC_HOME": str(home)}
    common = ["--token-file", str(token_file)]
    seedstore, _ = start_process([str(BIN / "seedstore"), "serve", "--listen", seed, *common], env=env)
    negotiator, _ = start_process(
        [str(BIN / "negotiator"), "serve", "--listen", neg, "--state-dir", str(tmp_path / "state"), *common]
    )
    yield seed, neg, token_file
    stop_process(negotiator)
    stop_process(seedstore)


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.endswith(("_SERVER", "_TOKEN_FILE"))}
    return subprocess.run(argv, capture_output=True, text=True, env={**clean, **(env or {})}, timeout=60)


@pytest.mark.slow
def test_the_token_file_env_lets_both_clis_through(guarded: tuple[str, str, Path]) -> None:
    seed, neg, token_file = guarded
    seedstore, negotiator = str(BIN / "seedstore"), str(BIN / "negotiator")

    refused = cli(seedstore, "--server", seed, "list")
    assert refused.returncode == 1
    assert json.loads(refused.stderr.splitlines()[-1])["error"]["reason"] == "TOKEN_MISSING"
    refused = cli(negotiator, "--server", neg, "adapters")
    assert refused.returncode == 1
    assert json.loads(refused.stderr.splitlines()[-1])["error"]["reason"] == "TOKEN_MISSING"

    listed = cli(seedstore, "--server", seed, "list", env={"SEEDSTORE_TOKEN_FILE": str(token_file)})
    assert listed.returncode == 0, listed.stderr
    adapters = cli(negotiator, "--server", neg, "adapters", env={"NEGOTIATOR_TOKEN_FILE": str(token_file)})
    assert adapters.returncode == 0, adapters.stderr
    assert "shell-echo" in adapters.stdout


@pytest.mark.slow
def test_an_unreadable_token_file_is_a_usage_error_not_a_traceback(guarded: tuple[str, str, Path]) -> None:
    seed, neg, token_file = guarded
    missing = str(token_file.with_name("nope"))
    for argv, name in (
        ((str(BIN / "seedstore"), "--server", seed, "list"), "SEEDSTORE_TOKEN_FILE"),
        ((str(BIN / "negotiator"), "--server", neg, "adapters"), "NEGOTIATOR_TOKEN_FILE"),
    ):
        done = cli(*argv, env={name: missing})
        assert done.returncode == 2, done.stderr
        assert f"{name}: cannot read" in done.stderr
        assert "Traceback" not in done.stderr
