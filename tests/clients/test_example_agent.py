"""examples/agent.py end to end: both sidecars as processes, the agent as `python -m examples.agent`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.sidecars import REPO
from tests.procs import stop_process


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Both sidecars (the negotiator on its embedded demo config) as `serve` processes; their targets."""
    sockets = Path(tempfile.mkdtemp(prefix="cl-pair-", dir="/tmp"))
    home = tmp_path_factory.mktemp("home")
    seedstore_target = f"unix://{sockets / 'seedstore.sock'}"
    negotiator_target = f"unix://{sockets / 'negotiator.sock'}"
    commands = [
        (
            [
                sys.executable,
                "-m",
                "agentsidecar.seedstore_service.cli",
                "serve",
                "--listen",
                seedstore_target,
            ],
            {"SKILLSPEC_HOME": str(home)},
        ),
        (
            [
                sys.executable,
                "-m",
                "agentsidecar.negotiator_service.cli",
                "serve",
                "--listen",
                negotiator_target,
            ],
            {},
        ),
    ]
    # Started together: each pays its interpreter start-up in parallel.
    processes = [
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env(env)
        )
        for argv, env in commands
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.startswith("READY"), f"{process.args!r} did not start: {line!r}"
        yield seedstore_target, negotiator_target
    finally:
        for process in processes:
            stop_process(process)
        shutil.rmtree(sockets, ignore_errors=True)


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}


def run_agent(pair: tuple[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    seedstore, negotiator = pair
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.agent",
            "--seedstore",
            seedstore,
            "--negotiator",
            negotiator,
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_the_agent_runs_every_step_and_handles_the_refusal(pair: tuple[str, str]) -> None:
    result = run_agent(pair)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "added it:" in out or "already there:" in out  # the module shares one pair
    assert "#1 voice/say-hello  score" in out
    assert "<- selected" in out
    assert "direct provides match: text_to_speech" in out
    assert "ok   evidence_command:true" in out
    assert "verdict: verified" in out
    assert "accepted by demo" in out
    assert 'output: {"summary": "scripted reply", "ok": true}' in out
    assert "refused before dispatch by shell-echo" in out
    assert "gap: structured_output is unsupported (needed by output_schema)" in out
    assert "gap: model_override is unsupported (needed by options.model)" in out
    assert "gap: accepted_settings:temperature is unsupported (needed by options.settings.temperature)" in out
    assert out.rstrip().endswith("done.")


@pytest.mark.slow
def test_a_second_run_reuses_the_seed_and_speaks_json(pair: tuple[str, str]) -> None:
    run_agent(pair)  # whichever test runs first adds the seed
    result = run_agent(pair, "--json")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert any(r.get("seed") == "say-hello" and r.get("added") is False for r in records)
    refusal = next(r for r in records if r.get("refused"))
    assert [g["capability"] for g in refusal["gaps"]] == ["structured_output", "model_override", "settings"]
    assert refusal["gaps"][2] == {
        "capability": "settings",
        "set": "accepted_settings",
        "member": "temperature",
        "request_field": "options.settings.temperature",
        "state": "unsupported",
    }
    assert records[-1] == {"done": True, "ok": True}


@pytest.mark.slow
def test_an_unreachable_sidecar_is_reported_not_raised(tmp_path: Path) -> None:
    result = run_agent((f"unix:{tmp_path / 'none.sock'}", f"unix:{tmp_path / 'none2.sock'}"))
    assert result.returncode == 1
    assert "a sidecar is unavailable" in result.stderr
    assert "Traceback" not in result.stderr
