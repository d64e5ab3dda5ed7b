"""`command.collect` ends the process tree however the collecting task ends, also when cancelled twice."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest

from agentsidecar.negotiator_service.adapters.command import (
    RunSettings,
    collect,
    minimal_env,
    start_process,
)
from tests.procs import process_alive


async def _gone(pid: int, within: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if not process_alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.parametrize("cancels", [1, 2])
async def test_a_cancelled_collect_kills_the_tree_and_reaps_its_supervisor(
    tmp_path: Path, cancels: int
) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 30 &\necho $! > {shlex.quote(str(pidfile))}\nwait\n"
    settings = RunSettings(cwd=None, env=minimal_env(), timeout_seconds=30, timeout_source="the test")
    run = await start_process("/bin/sh", ["/bin/sh", "-c", script], False, settings)
    task = asyncio.create_task(collect(run, None, timeout_seconds=30, output_cap_bytes=1024))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert loop.time() < deadline, "the command never started its child"
        await asyncio.sleep(0.02)
    child = int(pidfile.read_text())
    await asyncio.sleep(0.2)  # the collect has started and waits for the exit
    assert not task.done()
    # A second cancellation lands while the first one's clean-up awaits the readers: as when
    # the caller's deadline meets the run's own timeout.
    task.cancel()
    for _ in range(cancels - 1):
        await asyncio.sleep(0)
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert run.returncode is not None, "the supervisor was not reaped"
    assert await _gone(child), "the command's child outlived the cancelled collect"
