"""Lifecycle lines are JSON on stderr, like the call log, so no line ever merges into another.

Real `serve` processes with the call log on stderr: every stderr line is one
JSON object (serving, metrics, draining, stopped, the calls, logging's
warnings), and READY stays the one plain line on stdout.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentsidecar.seedstore.v1 import seedstore_pb2 as spb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from tests.procs import REPO

CALLS = 50


def records(stderr: str) -> list[dict[str, Any]]:
    lines = stderr.splitlines()
    assert lines
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a stderr line that is not one JSON object: {line!r}\n{stderr}")
    return parsed


@pytest.mark.slow
@pytest.mark.parametrize("sidecar", ["seedstore", "negotiator"])
async def test_every_stderr_line_is_one_json_object(sidecar: str, socket_dir: Path, tmp_path: Path) -> None:
    target = f"unix:{socket_dir / f'{sidecar}.sock'}"
    token_file = tmp_path / "tokens"
    token_file.write_text("secret\n")
    argv = [
        *(sys.executable, "-m", f"{sidecar}_service.cli", "serve", "--listen", target),
        *("--metrics-listen", "127.0.0.1:0", "--grace-seconds", "1"),
        *("--token-file", str(token_file), "--open-reads"),
    ]
    if sidecar == "negotiator":
        argv += ["--state-dir", str(tmp_path / "state")]
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "SKILLSPEC_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        ready = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert ready.split()[:3] == ["READY", sidecar, target], ready
        # An unreadable token file on reload is a logging warning (the previous tokens are kept).
        token_file.write_text("")
        async with grpc.aio.insecure_channel(target) as channel:
            health = channel.unary_unary("/grpc.health.v1.Health/Check", None, None)
            for _ in range(CALLS):
                await health(b"", timeout=5)
            if sidecar == "seedstore":
                stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
                await stub.GetStore(spb.GetStoreRequest(), timeout=5)
                await asyncio.sleep(1.1)  # the token file is looked at again once a second
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.AddSeed(spb.AddSeedRequest(id="x"), timeout=5)  # a write: the token is checked
                assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        process.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()
    stdout, stderr = out.decode(), err.decode()
    assert process.returncode == 0, stderr
    assert stdout == ""  # READY was the only stdout line
    lines = records(stderr)
    events = [record.get("event") for record in lines if "event" in record]
    lifecycle = [
        event
        for event in events
        if event in {"sidecar.serving", "sidecar.metrics", "sidecar.draining", "sidecar.stopped"}
    ]
    assert lifecycle == ["sidecar.serving", "sidecar.metrics", "sidecar.draining", "sidecar.stopped"]
    (serving,) = [r for r in lines if r.get("event") == "sidecar.serving"]
    assert serving["sidecar"] == sidecar
    assert serving["addresses"] == [target]
    (draining,) = [r for r in lines if r.get("event") == "sidecar.draining"]
    assert draining["grace_seconds"] == 1
    (metrics,) = [r for r in lines if r.get("event") == "sidecar.metrics"]
    assert metrics["url"].startswith("http://127.0.0.1:")
    calls = [r for r in lines if "method" in r and "status" in r]
    assert len([c for c in calls if c["method"] == "Check"]) == CALLS
    warnings = [r for r in lines if r.get("event") == "sidecar.log" and r["level"] == "WARNING"]
    if sidecar == "seedstore":
        assert any("keeping the previous tokens" in w["message"] for w in warnings), stderr
        assert {w["sidecar"] for w in warnings} == {"seedstore"}
