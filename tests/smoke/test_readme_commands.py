"""Every shell block of the README after the quick start, run as written against a running pair.

The commands run in a directory laid out like the repository after the run command: `.venv` and
`examples` are the repository's, `run/` is where the pair (started as the README's run command
starts it, minus its TCP listeners) keeps its sockets and its project-local store. A command is
expected to exit 0 unless the README says otherwise on the next line (`# -> exit N`). Running
the whole list twice shows the demo is re-runnable.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import stop_process

REPO = Path(__file__).resolve().parents[2]
PAIR = Path(sys.executable).parent / "agentsidecar-pair"
_EXPECTED_EXIT = re.compile(r"#\s*->\s*exit\s+(\d+)")


def readme_commands() -> list[tuple[str, int]]:
    """(command, expected exit code) for each command of the README's sh blocks after the quick start."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after_quick_start = text.split("## From the two commands to a working agent", 1)[1]
    commands: list[tuple[str, int]] = []
    for block in re.findall(r"```sh\n(.*?)```", after_quick_start, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            stripped = line.strip()
            expected = _EXPECTED_EXIT.match(stripped)
            if expected and commands:
                commands[-1] = (commands[-1][0], int(expected.group(1)))
            if not stripped or stripped.startswith("#"):
                continue
            commands.append((stripped, 0))
    return commands


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A directory like the repository after `bash scripts/run-pair.sh`, with the pair running."""
    for name in (".venv", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {k: v for k, v in os.environ.items() if k != "SKILLSPEC_HOME"}
    env["HOME"] = str(tmp_path / "home")
    process = subprocess.Popen(
        [str(PAIR), "--run-dir", "run", "--seedstore-tcp", "", "--negotiator-tcp", ""],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    if not lines[2].startswith("pair ready"):
        process.kill()
        raise AssertionError(f"the pair did not start: {lines} {process.communicate(timeout=10)}")
    yield tmp_path
    stop_process(process)


def test_the_readme_has_commands_to_run() -> None:
    commands = readme_commands()
    assert len(commands) >= 8
    assert not [command for command, _ in commands if command.startswith("#")]
    assert any(expected == 3 for _, expected in commands)


def test_every_readme_command_runs_as_written_twice(project: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SKILLSPEC_HOME"}
    env["HOME"] = str(project / "home")
    for round_ in (1, 2):
        for command, expected in readme_commands():
            done = subprocess.run(
                ["bash", "-c", command], cwd=project, capture_output=True, text=True, env=env, timeout=60
            )
            assert done.returncode == expected, (
                f"round {round_}: `{command}` exited {done.returncode}, not {expected}:\n"
                f"{done.stdout}\n{done.stderr}"
            )
            assert "Traceback" not in done.stderr
