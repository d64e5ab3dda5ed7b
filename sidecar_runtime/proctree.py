"""Process-tree containment for every command a sidecar runs (evidence checks, harness CLIs, bootstrap).

A process group is not a container: a child that calls setsid() leaves it, keeps the output pipe
open and outlives every killpg. And a sidecar killed with SIGKILL cannot clean up at all. So each
command runs under its own small supervisor (`tree_supervisor.py`, stdlib only, started as
`python -I -S`), which is a child subreaper (every orphaned descendant is re-parented to it, so
none can escape), dies with the sidecar (PR_SET_PDEATHSIG plus a getppid() check), and kills
every descendant before it exits with the command's own status. That needs no privileges and no
cgroup delegation, which the sidecars cannot count on in a container.

    run = await start(program, argv, env=..., cwd=..., stdout=PIPE, ...)
    ...read run.process.stdout, wait for run.exited...
    await run.finish()  # always, also on timeout and cancellation

`run.process.returncode` is the command's: its exit code, or minus the signal that killed it.
When the supervisor has exited, the whole tree is gone, so the output pipes reach EOF at once;
`finish` still bounds every wait, with killpg SIGKILL of the supervisor's session as a backstop.
The supervisor arms its parent-death signal against the thread that started it, so runs are
started from the event loop's thread, which lives as long as the sidecar serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

SUPERVISOR = Path(__file__).with_name("tree_supervisor.py")
STOP_GRACE_SECONDS = 2.0  # the supervisor kills the tree within its own bound; this bounds waiting for it
REAP_SECONDS = 2.0
# What the supervisor itself needs from the sidecar's environment to start Python at all.
_SUPERVISOR_ENV = ("LD_LIBRARY_PATH",)
_STREAM_LIMIT = 64 * 1024

Stdio = int | IO[Any] | None


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Says when the supervisor has exited, without waiting for the pipes to close as well."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_STREAM_LIMIT, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


@dataclass(slots=True)
class Run:
    """One command under its supervisor; `process.pid` is the supervisor's."""

    process: asyncio.subprocess.Process
    exited: asyncio.Event

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def stop(self) -> None:
        """Ask the supervisor to kill the whole tree and exit (timeout, cancellation, output cap)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def kill_group(self) -> None:
        """The backstop: SIGKILL the supervisor's session, whatever is still in it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    async def finish(self) -> None:
        """Stop the tree, bounded, and reap the supervisor; safe to call more than once.

        Uses `asyncio.wait`, not a timeout context, so it works the same while a cancellation
        is being delivered.
        """
        self.stop()
        if not await _within(self.exited.wait(), STOP_GRACE_SECONDS):
            self.kill_group()
        await _within(self.process.wait(), REAP_SECONDS)


async def to_the_end(work: Awaitable[object]) -> None:
    """Await `work` to completion (its exception, if any, is raised); a cancellation that arrives
    meanwhile is raised once it is done. For clean-ups and writes a cancellation must not cut short."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


async def _within(waiting: Any, seconds: float) -> bool:
    task = asyncio.ensure_future(waiting)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
    return bool(done)


def _environment_blob(env: Mapping[str, str]) -> bytes:
    entries = []
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"environment variable {name!r} cannot be passed to a process")
        entries.append(os.fsencode(f"{name}={value}"))
    return b"\0".join(entries)


async def start(
    program: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None = None,
    stdin: Stdio = asyncio.subprocess.DEVNULL,
    stdout: Stdio = asyncio.subprocess.PIPE,
    stderr: Stdio = asyncio.subprocess.PIPE,
) -> Run:
    """Run `argv` as the absolute `program` with exactly `env` in `cwd`, contained; see the module docs.

    Raises OSError when the program cannot be executed (exec's own errno, FileNotFoundError for
    ENOENT, PermissionError for EACCES, ...) or `cwd` does not exist, and ValueError for an
    argument or variable no process can carry (a NUL byte). Cancelled while starting, it still
    stops whatever it started before the cancellation propagates.
    """
    if not os.path.isabs(program):
        raise ValueError(f"program must be an absolute path, not {program!r}")
    if not argv:
        raise ValueError("argv must not be empty")
    blob = _environment_blob(env)
    starting = asyncio.ensure_future(_start(program, argv, blob, cwd, stdin, stdout, stderr))
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        # The supervisor may already run (and the command with it): finish starting, then stop it.
        with contextlib.suppress(Exception):
            run = await starting
            await run.finish()
        raise


async def _start(
    program: str,
    argv: Sequence[str],
    blob: bytes,
    cwd: str | os.PathLike[str] | None,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
) -> Run:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    with ours:
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(loop),
                sys.executable,
                "-I",
                "-S",
                str(SUPERVISOR),
                str(os.getpid()),
                str(theirs.fileno()),
                program,
                *argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                cwd=cwd,
                env={name: os.environ[name] for name in _SUPERVISOR_ENV if name in os.environ},
                # Its own session: the backstop killpg reaches the supervisor and whatever stayed in it.
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        run = Run(asyncio.subprocess.Process(transport, protocol, loop), protocol.exited)
        try:
            ours.setblocking(False)
            await loop.sock_sendall(ours, blob)
            ours.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := await loop.sock_recv(ours, 64):
                answer += chunk
        except BaseException:
            await run.finish()
            raise
    if answer == b"ok":
        return run
    await run.finish()
    errno_text = answer.removeprefix(b"err ").decode(errors="replace")
    if answer.startswith(b"err ") and errno_text.isdigit():
        errno = int(errno_text)
        raise OSError(errno, os.strerror(errno), program)
    raise OSError(f"the process supervisor did not start the command (status {run.returncode})")
