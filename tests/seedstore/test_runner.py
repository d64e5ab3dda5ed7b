"""The verification runner against real executables and real processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from agentsidecar.seedstore_service.model import Evidence, Outcome, Seed, VerificationStatus
from agentsidecar.seedstore_service.runner import (
    CheckFinished,
    CheckStarted,
    RunnerSettings,
    SeedChecked,
    VerifyEvent,
    check_seed,
    check_seeds,
    run_command,
)
from agentsidecar.seedstore_service.verification import Exited, SpawnFailed
from tests.procs import process_alive

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def make_seed(command: str | None = None, *evidence: str, seed_id: str = "tool") -> Seed:
    return Seed(
        id=seed_id,
        domain="dev",
        kind="cli",
        command=command,
        evidence=tuple(Evidence(source="test", command=c) for c in evidence),
    )


def write_script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(mode)
    return path


async def collect(events: AsyncIterator[VerifyEvent]) -> list[VerifyEvent]:
    return [event async for event in events]


async def finished_events(seed: Seed, settings: RunnerSettings) -> list[CheckFinished]:
    return [
        e
        for e in await collect(check_seed(seed, "/seeds/dev/tool.yml", settings))
        if isinstance(e, CheckFinished)
    ]


async def one_check(seed: Seed, settings: RunnerSettings) -> CheckFinished:
    (finished,) = await finished_events(seed, settings)
    return finished


def gone(pid: int) -> Callable[[], bool]:
    return lambda: not process_alive(pid)


def freeze_loop(seconds: float) -> None:
    """Block the event loop on purpose: a child makes progress while asyncio cannot."""
    time.sleep(seconds)


def exists(path: str | Path) -> bool:
    return Path(path).exists()


def directory_listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def eventually(condition: Callable[[], bool], within_s: float = 2.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.02)
    return condition()


def pids_running(argv: list[str]) -> list[int]:
    """Live processes whose argv is exactly `argv` (found through /proc)."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == wanted and process_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.fixture
def settings() -> RunnerSettings:
    return RunnerSettings(check_timeout=5.0, output_cap_bytes=65536, path=SYSTEM_PATH)


# --- settings ----------------------------------------------------------------


def test_settings_defaults_and_validation() -> None:
    defaults = RunnerSettings()
    assert (defaults.check_timeout, defaults.output_cap_bytes) == (10.0, 65536)
    assert defaults.path == "/usr/local/bin:/usr/bin:/bin"
    with pytest.raises(ValueError, match="check_timeout"):
        RunnerSettings(check_timeout=0)
    with pytest.raises(ValueError, match="output_cap_bytes"):
        RunnerSettings(output_cap_bytes=-1)


# --- PATH lookup -------------------------------------------------------------


async def test_path_lookup_finds_an_executable(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "mytool", "exit 0")
    settings = RunnerSettings(path=f"{tmp_path / 'empty'}:{tmp_path / 'bin'}")
    finished = await one_check(make_seed("mytool --flag"), settings)
    assert (finished.check, finished.ok, finished.message) == (
        "path_lookup:mytool",
        True,
        "mytool found on PATH",
    )
    assert finished.exit_code is None


async def test_path_lookup_rejects_a_file_without_exec_bit(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "mytool", "exit 0", mode=0o644)
    finished = await one_check(make_seed("mytool"), RunnerSettings(path=str(tmp_path / "bin")))
    assert (finished.ok, finished.message) == (False, "mytool found on PATH but is not executable")


async def test_path_lookup_ignores_directories_and_missing_names(tmp_path: Path) -> None:
    (tmp_path / "bin" / "mytool").mkdir(parents=True)
    finished = await one_check(make_seed("mytool"), RunnerSettings(path=str(tmp_path / "bin")))
    assert (finished.ok, finished.message) == (False, "mytool not found on PATH")


async def test_path_lookup_uses_the_settings_path_not_the_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_script(tmp_path / "bin" / "mytool", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ.get('PATH', '')}")
    finished = await one_check(make_seed("mytool"), RunnerSettings(path=SYSTEM_PATH))
    assert (finished.ok, finished.message) == (False, "mytool not found on PATH")


async def test_relative_command_is_looked_up_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_script(tmp_path / "mytool", "exit 0")
    monkeypatch.chdir(tmp_path)
    settings = RunnerSettings(path="")
    assert (await one_check(make_seed("./mytool run"), settings)).message == "./mytool found on PATH"
    script.chmod(0o644)
    not_executable = await one_check(make_seed("./mytool"), settings)
    assert (not_executable.ok, not_executable.message) == (
        False,
        "./mytool found on PATH but is not executable",
    )
    assert (await one_check(make_seed("./other"), settings)).message == "./other not found on PATH"


# --- no shell ------------------------------------------------------------------


@pytest.mark.slow
async def test_shell_metacharacters_stay_inert(tmp_path: Path, settings: RunnerSettings) -> None:
    seed = make_seed(
        None,
        f"echo hi; touch {tmp_path}/pwned",
        f"echo $(touch {tmp_path}/pwned2)",
        f"echo `touch {tmp_path}/pwned3` && touch {tmp_path}/pwned4",
    )
    finished = await finished_events(seed, settings)
    assert [(f.ok, f.exit_code) for f in finished] == [(True, 0)] * 3
    assert directory_listing(tmp_path) == []


async def test_echo_prints_metacharacters_as_text(tmp_path: Path, settings: RunnerSettings) -> None:
    result = await run_command(["echo", "hi;", "touch", f"{tmp_path}/x"], settings, tmp_path)
    assert result.output == f"hi; touch {tmp_path}/x\n".encode()
    assert not (tmp_path / "x").exists()


async def test_quoted_words_reach_the_program_as_one_argument(settings: RunnerSettings) -> None:
    result = await run_command(["printf", "%s|", "a b", "c"], settings, Path.cwd())
    assert result.output == b"a b|c|"
    finished = await one_check(make_seed(None, "printf '%s' 'a b'"), settings)
    assert (finished.check, finished.ok) == ("evidence_command:printf '%s' 'a b'", True)


# --- exits and spawn errors ----------------------------------------------------


async def test_missing_program_is_a_spawn_error(settings: RunnerSettings) -> None:
    finished = await one_check(make_seed(None, "no-such-program-7f3e --version"), settings)
    assert (finished.ok, finished.exit_code, finished.message) == (
        False,
        None,
        "No such file or directory (os error 2)",
    )


async def test_programs_resolve_only_on_the_minimal_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_script(tmp_path / "bin" / "mytool", "exit 0")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ.get('PATH', '')}")
    result = await run_command(["mytool"], RunnerSettings(path=SYSTEM_PATH), tmp_path)
    assert result.end == SpawnFailed(2, "No such file or directory")
    found = await run_command(["mytool"], RunnerSettings(path=str(tmp_path / "bin")), tmp_path)
    assert found.end == Exited(0)


async def test_non_executable_program_is_permission_denied(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "mytool", "exit 0", mode=0o644)
    finished = await one_check(make_seed(None, "mytool"), RunnerSettings(path=str(tmp_path / "bin")))
    assert (finished.ok, finished.message) == (False, "Permission denied (os error 13)")


async def test_non_zero_exit(settings: RunnerSettings) -> None:
    finished = await one_check(make_seed(None, "sh -c 'exit 3'"), settings)
    assert (finished.ok, finished.exit_code, finished.message) == (
        False,
        3,
        "evidence command exited with 3",
    )


async def test_killed_by_a_signal_is_minus_one(settings: RunnerSettings) -> None:
    finished = await one_check(make_seed(None, "sh -c 'kill -TERM $$'"), settings)
    assert (finished.ok, finished.exit_code, finished.message) == (
        False,
        -1,
        "evidence command exited with -1",
    )
    assert not finished.timed_out


async def test_argv0_is_the_name_as_written(tmp_path: Path) -> None:
    write_script(tmp_path / "bin" / "mytool", 'printf "%s" "$0"')
    result = await run_command(["mytool"], RunnerSettings(path=str(tmp_path / "bin")), tmp_path)
    # A shell script sees the path it was exec'd through; the kernel passes that as $0.
    assert result.output.decode().endswith("mytool")


# --- timeout --------------------------------------------------------------------


@pytest.mark.slow
async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = write_script(tmp_path / "slow", f"sleep 30 &\necho $! > {pid_file}\nsleep 30")
    settings = RunnerSettings(check_timeout=0.5, path=SYSTEM_PATH)
    finished = await one_check(make_seed(None, str(script)), settings)
    assert finished.timed_out
    assert (finished.ok, finished.exit_code, finished.message) == (
        False,
        None,
        "evidence command timed out after 0.5s",
    )
    assert 0.5 <= finished.duration_s < 3.0
    child = int(pid_file.read_text())
    assert await eventually(gone(child)), f"background child {child} survived"


async def test_background_children_do_not_outlive_a_finished_command(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = write_script(tmp_path / "leaky", f"sleep 30 &\necho $! > {pid_file}\nexit 0")
    started = time.monotonic()
    finished = await one_check(
        make_seed(None, str(script)), RunnerSettings(check_timeout=5, path=SYSTEM_PATH)
    )
    assert (finished.ok, finished.timed_out) == (True, False)
    assert time.monotonic() - started < 2.0  # the child's open pipe did not keep us waiting
    child = int(pid_file.read_text())
    assert await eventually(gone(child))


# A grandchild that leaves the check's session and keeps the output pipe open, writing its own
# pid first (`exec` keeps the pid, so it is the long-running process's whether or not setsid forks).
def escaping_grandchild(pid_file: Path, *, daemon: bool = False) -> str:
    inner = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60'"
    if daemon:  # the classic double fork, with stdio closed: nothing holds our pipe
        return f"( {inner} </dev/null >/dev/null 2>&1 & ) ; "
    return f"{inner} & "


def pid_in(pid_file: Path) -> int | None:
    text = pid_file.read_text().strip() if pid_file.exists() else ""
    return int(text) if text else None


async def read_pid_file(pid_file: Path) -> int:
    assert await eventually(lambda: pid_in(pid_file) is not None)
    pid = pid_in(pid_file)
    assert pid is not None
    return pid


async def test_a_setsid_grandchild_neither_holds_the_check_nor_outlives_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = write_script(tmp_path / "escaper", escaping_grandchild(pid_file) + "\nsleep 0.2\necho done")
    settings = RunnerSettings(check_timeout=10, path=SYSTEM_PATH)
    started = time.monotonic()
    finished = await one_check(make_seed(None, str(script)), settings)
    assert time.monotonic() - started < 3.0  # well under the 10 s timeout
    assert (finished.ok, finished.exit_code, finished.timed_out) == (True, 0, False)
    grandchild = await read_pid_file(pid_file)
    assert await eventually(gone(grandchild)), f"setsid grandchild {grandchild} survived"


async def test_a_double_forked_daemon_does_not_outlive_the_check(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    script = write_script(
        tmp_path / "daemonizer",
        escaping_grandchild(pid_file, daemon=True) + f"\nwhile [ ! -s {pid_file} ]; do sleep 0.01; done",
    )
    finished = await one_check(
        make_seed(None, str(script)), RunnerSettings(check_timeout=10, path=SYSTEM_PATH)
    )
    assert (finished.ok, finished.timed_out) == (True, False)
    daemon = await read_pid_file(pid_file)
    assert await eventually(gone(daemon)), f"daemon {daemon} survived"


@pytest.mark.slow
async def test_a_timeout_kills_a_setsid_grandchild_too(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    script = write_script(tmp_path / "hanger", escaping_grandchild(pid_file) + "\nsleep 60")
    started = time.monotonic()
    finished = await one_check(
        make_seed(None, str(script)), RunnerSettings(check_timeout=0.5, path=SYSTEM_PATH)
    )
    assert finished.timed_out
    assert time.monotonic() - started < 3.0
    grandchild = await read_pid_file(pid_file)
    assert await eventually(gone(grandchild)), f"setsid grandchild {grandchild} survived the timeout"


# --- output ------------------------------------------------------------------------


async def test_large_output_is_capped_and_drained() -> None:
    settings = RunnerSettings(check_timeout=5, output_cap_bytes=1000, path=SYSTEM_PATH)
    finished = await one_check(make_seed(None, "head -c 5000000 /dev/zero"), settings)
    assert (finished.ok, finished.output_truncated, finished.timed_out) == (True, True, False)
    assert finished.duration_s < 3.0
    result = await run_command(["head", "-c", "5000000", "/dev/zero"], settings, Path.cwd())
    assert (len(result.output), result.output_truncated) == (1000, True)


async def test_output_within_the_cap_is_kept_whole_with_stderr() -> None:
    settings = RunnerSettings(output_cap_bytes=6, path=SYSTEM_PATH)
    result = await run_command(["sh", "-c", "printf abc; printf def >&2"], settings, Path.cwd())
    assert (result.output, result.output_truncated) == (b"abcdef", False)


# --- environment and working directory ---------------------------------------------


async def test_environment_is_minimal(monkeypatch: pytest.MonkeyPatch, settings: RunnerSettings) -> None:
    monkeypatch.setenv("SEEDSTORE_TEST_CANARY", "secret-value")
    result = await run_command(["env"], settings, Path.cwd())
    env = dict(line.split("=", 1) for line in result.output.decode().splitlines())
    assert "SEEDSTORE_TEST_CANARY" not in env
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG"}
    assert env["PATH"] == settings.path
    assert env["HOME"] == env["TMPDIR"]
    assert env["LANG"] == "C.UTF-8"
    assert not exists(env["HOME"])


async def test_each_command_runs_in_a_fresh_scratch_directory_that_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: RunnerSettings
) -> None:
    monkeypatch.chdir(tmp_path)
    first = await run_command(["sh", "-c", "pwd; touch left-behind"], settings, tmp_path)
    second = await run_command(["pwd"], settings, tmp_path)
    first_dir, second_dir = first.output.decode().split()[0], second.output.decode().strip()
    assert first.end == Exited(0)
    assert first_dir not in (str(tmp_path), os.getcwd())
    assert first_dir != second_dir
    assert not exists(first_dir)
    assert not exists(second_dir)
    assert not exists(tmp_path / "left-behind")


# Takes every permission the service needs to remove its scratch directory away: a mode-0
# directory with files, a read-only file, a read-only directory, the scratch directory itself.
HOSTILE_TO_REMOVAL = (
    "pwd; mkdir -p a/b/c d; touch a/b/c/f a/b/f a/f; chmod 444 a/f; ln -s /etc d/etc;"
    " chmod 0 a/b/c; chmod 0 a/b; chmod 500 a; chmod 0 d; chmod 500 ."
)
REMOVE_AS_OWNER = """
import asyncio, sys
from pathlib import Path
from agentsidecar.seedstore_service.runner import RunnerSettings, run_command
result = asyncio.run(run_command(["sh", "-c", sys.argv[1]], RunnerSettings(path=sys.argv[2]), Path.cwd()))
sys.stdout.write(result.output.decode())
"""


def without_privileges(argv: list[str]) -> list[str]:
    """`argv` as a process that respects permission bits: root's DAC override capabilities dropped."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits cannot be made to matter")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--", *argv]


@pytest.mark.slow
def test_the_scratch_directory_is_removed_even_when_the_command_took_its_permissions_away() -> None:
    # In a process of its own, so running as root (whose capabilities ignore permission bits)
    # can be made to count.
    argv = without_privileges([sys.executable, "-c", REMOVE_AS_OWNER, HOSTILE_TO_REMOVAL, SYSTEM_PATH])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    scratch = Path(done.stdout.split()[0])
    try:
        assert scratch.name.startswith("seedstore-verify-")
        left_behind = scratch.exists()
        assert not left_behind, f"{scratch} was left behind"
        assert Path("/etc/passwd").exists()  # the symlink was removed, never followed
    finally:
        if scratch.exists():
            subprocess.run(["chmod", "-R", "u+rwx", str(scratch)], check=False)
            shutil.rmtree(scratch, ignore_errors=True)


# --- events ----------------------------------------------------------------------------


async def test_events_for_one_seed(settings: RunnerSettings) -> None:
    seed = make_seed("sh -c true", "true", "false", "echo 'oops")
    events = await collect(check_seed(seed, "/seeds/dev/tool.yml", settings))
    assert [type(e).__name__ for e in events] == ["CheckStarted", "CheckFinished"] * 4 + ["SeedChecked"]
    names = [
        "path_lookup:sh",
        "evidence_command:true",
        "evidence_command:false",
        "evidence_command:echo 'oops",
    ]
    starts = [e for e in events if isinstance(e, CheckStarted)]
    finishes = [e for e in events if isinstance(e, CheckFinished)]
    assert [(e.check, e.index) for e in starts] == list(zip(names, range(4), strict=True))
    assert [(e.check, e.index, e.ok) for e in finishes] == list(
        zip(names, range(4), [True, True, False, False], strict=True)
    )
    assert {(e.seed_id, e.domain) for e in starts} == {("tool", "dev")}
    assert {(e.seed_id, e.domain) for e in finishes} == {("tool", "dev")}
    assert [f.exit_code for f in finishes] == [None, 0, 1, None]
    verdict = events[-1]
    assert isinstance(verdict, SeedChecked)
    assert (verdict.seed_id, verdict.domain, verdict.path) == ("tool", "dev", "/seeds/dev/tool.yml")
    assert verdict.outcomes == tuple(Outcome(f.check, f.ok, f.message) for f in finishes)
    assert verdict.status is VerificationStatus.VERIFIED


async def test_all_failing_checks_fail_the_seed(settings: RunnerSettings) -> None:
    events = await collect(check_seed(make_seed("no-such-tool-7f3e", "false"), "p", settings))
    verdict = events[-1]
    assert isinstance(verdict, SeedChecked)
    assert [o.ok for o in verdict.outcomes] == [False, False]
    assert verdict.status is VerificationStatus.FAILED


async def test_seed_without_evidence_gets_one_failing_check(settings: RunnerSettings) -> None:
    events = await collect(check_seed(make_seed(None), "p", settings))
    assert len(events) == 3
    started, finished, verdict = events
    assert isinstance(started, CheckStarted)
    assert started.check == "evidence"
    assert isinstance(finished, CheckFinished)
    assert (finished.check, finished.ok, finished.message) == (
        "evidence",
        False,
        "no verification evidence declared",
    )
    assert isinstance(verdict, SeedChecked)
    assert verdict.status is VerificationStatus.FAILED


@pytest.mark.slow
async def test_cancelling_a_running_check_kills_its_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    script = write_script(tmp_path / "slow", f"sleep 30 &\necho $$ $! > {pid_file}\nsleep 30")
    events = check_seed(make_seed(None, str(script)), "p", RunnerSettings(check_timeout=30, path=SYSTEM_PATH))
    assert isinstance(await anext(events), CheckStarted)
    # The consumer gives up while the command runs: wait_for cancels the pending step.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(events), timeout=0.5)
    await events.aclose()
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) == 2
    for pid in pids:
        assert await eventually(gone(pid)), f"pid {pid} survived"


@pytest.mark.slow
async def test_cancelling_at_any_step_leaves_no_children(settings: RunnerSettings) -> None:
    # Sweeps the cancellation point across the whole run, including the
    # moment the child exists but asyncio has not finished spawning it.
    duration = f"30.{uuid.uuid4().int % 10**6:06d}"
    argv = ["sh", "-c", f"sleep {duration} & sleep {duration}"]
    for steps in range(10):
        task = asyncio.create_task(run_command(argv, settings, Path.cwd()))
        for _ in range(steps):
            await asyncio.sleep(0)
        freeze_loop(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await eventually(lambda: pids_running(["sleep", duration]) == [], within_s=1.0), (
            f"children survived a cancellation after {steps} loop steps"
        )


async def test_closing_between_checks_starts_nothing_more(tmp_path: Path, settings: RunnerSettings) -> None:
    marker = tmp_path / "ran"
    events = check_seed(make_seed(None, "true", f"touch {marker}"), "p", settings)
    assert isinstance(await anext(events), CheckStarted)
    assert isinstance(await anext(events), CheckFinished)
    await events.aclose()
    assert not marker.exists()


# --- several seeds ----------------------------------------------------------------------


@pytest.mark.slow
async def test_check_seeds_bounds_concurrency_and_streams_everything(settings: RunnerSettings) -> None:
    items = [(make_seed(None, "sleep 0.3", seed_id=f"seed-{n}"), f"/seeds/{n}.yml") for n in range(6)]
    received: list[tuple[float, VerifyEvent]] = []
    started = time.monotonic()
    async for event in check_seeds(items, settings, concurrency=3):
        received.append((time.monotonic(), event))
    elapsed = time.monotonic() - started
    assert 0.55 <= elapsed <= 1.2

    running, peak = 0, 0
    for _, event in received:
        if isinstance(event, CheckStarted):
            running += 1
        elif isinstance(event, CheckFinished):
            running -= 1
        peak = max(peak, running)
    assert peak == 3

    for seed, path in items:
        own = [e for _, e in received if e.seed_id == seed.id]
        assert [type(e) for e in own] == [CheckStarted, CheckFinished, SeedChecked]
        verdict = own[-1]
        assert isinstance(verdict, SeedChecked)
        assert (verdict.path, verdict.status) == (path, VerificationStatus.VERIFIED)


async def test_check_seeds_with_one_slot_runs_seeds_one_at_a_time(settings: RunnerSettings) -> None:
    items = [(make_seed(None, "true", seed_id=f"seed-{n}"), "p") for n in range(3)]
    events = await collect(check_seeds(items, settings, concurrency=1))
    assert [(type(e).__name__, e.seed_id) for e in events] == [
        (kind, f"seed-{n}") for n in range(3) for kind in ("CheckStarted", "CheckFinished", "SeedChecked")
    ]


async def test_check_seeds_with_nothing_to_do(settings: RunnerSettings) -> None:
    assert await collect(check_seeds([], settings, concurrency=4)) == []
    with pytest.raises(ValueError, match="concurrency"):
        await collect(check_seeds([], settings, concurrency=0))


async def test_closing_check_seeds_early_leaves_no_children(settings: RunnerSettings) -> None:
    # A duration no other process on the machine will be sleeping for.
    duration = f"30.{uuid.uuid4().int % 10**6:06d}"
    items = [(make_seed(None, f"sleep {duration}", seed_id=f"seed-{n}"), "p") for n in range(6)]
    events = check_seeds(items, settings, concurrency=3)
    assert isinstance(await anext(events), CheckStarted)
    assert await eventually(lambda: len(pids_running(["sleep", duration])) == 3)
    await asyncio.sleep(0.1)  # past spawning: the checks are now waiting on running commands
    closing = time.monotonic()
    await events.aclose()
    assert time.monotonic() - closing < 2.0
    assert pids_running(["sleep", duration]) == []


async def test_a_cancelled_consumer_task_leaves_no_children(settings: RunnerSettings) -> None:
    duration = f"30.{uuid.uuid4().int % 10**6:06d}"
    items = [(make_seed(None, f"sleep {duration}", seed_id=f"seed-{n}"), "p") for n in range(4)]

    async def consume() -> None:
        async for _ in check_seeds(items, settings, concurrency=2):
            pass

    task = asyncio.create_task(consume())
    assert await eventually(lambda: len(pids_running(["sleep", duration])) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pids_running(["sleep", duration]) == []


@pytest.mark.slow
async def test_timeouts_in_parallel_seeds_are_reported_per_seed(tmp_path: Path) -> None:
    settings = RunnerSettings(check_timeout=0.3, path=SYSTEM_PATH)
    items = [
        (make_seed(None, "sleep 5", seed_id="slow"), "p"),
        (make_seed(None, "true", seed_id="quick"), "p"),
    ]
    events = await collect(check_seeds(items, settings, concurrency=2))
    finishes = {e.seed_id: e for e in events if isinstance(e, CheckFinished)}
    assert (finishes["slow"].ok, finishes["slow"].timed_out) == (False, True)
    assert (finishes["quick"].ok, finishes["quick"].timed_out) == (True, False)
    assert finishes["slow"].message == "evidence command timed out after 0.3s"
