"""Processes in tests: starting a `serve`-style process that prints a READY line, stopping it, and
checking that a killed process is really gone."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def start_process(argv: list[str], env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start a process (in the repository, with this environment plus `env`) that prints a READY line
    first; return it and that line.

    Unless `env` says otherwise, the process gets a fresh XDG_STATE_HOME of its own, so what a
    negotiator keeps in its default state directory (conversations, runtime registrations) never
    reaches the user's, nor another test's.
    """
    state_home = tempfile.mkdtemp(prefix="agentsidecar-state-")
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "XDG_STATE_HOME": state_home, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("READY"):
        process.kill()
        _, err = process.communicate(timeout=5)
        raise AssertionError(f"{argv} did not start: {line!r} {err}")
    return process, line.strip()


def stop_process(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 5 s; reaps the process and drains its pipes."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    process.communicate()


def process_alive(pid: int) -> bool:
    """True while `pid` runs.

    A zombie counts as gone: PID 1 in some sandboxes never reaps orphans, so a
    killed grandchild can linger as a zombie that still answers kill(pid, 0).
    A process can also vanish between listing and reading /proc (ESRCH).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The command name sits in parentheses and may hold spaces; the state follows it.
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
