"""Process liveness for tests that check a killed process is really gone."""

from __future__ import annotations

from pathlib import Path


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
