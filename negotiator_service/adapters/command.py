"""The command adapter: a local agent CLI, run as a harness without a shell.

It declares only what it can enforce: per-call `cwd`, `env` and `timeout`
settings. A CLI's own flags for models, tools or output formats are outside
what this adapter can check, so everything else is declared unsupported.

Options:
    argv:             [program, arg, ...] (required); an element containing
                      "{prompt}" has it replaced by the prompt, otherwise the
                      prompt is written to stdin
    timeout_seconds:  default 60; a per-call `timeout` setting may only lower it
    cwd:              working directory (default: the negotiator's)
    env:              variables added to a minimal environment (PATH, HOME, LANG)
    output_cap_bytes: most stdout bytes accepted (default 1 MiB)

The process gets its own session; on timeout or cancellation the whole
process group is killed, and whatever it left running is killed when it exits.
`start_process` and `collect` are that harness on their own, for other
callers of local commands (capability bootstrap runs seed commands with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from negotiator_service import errors
from negotiator_service.adapters._calls import Deadline, call_deadline, check_call
from negotiator_service.adapters._options import OptionReader, is_number, type_name
from negotiator_service.declarations import narrow
from negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    AdapterSpec,
    CallKind,
    Capability,
    CapabilityState,
    Declaration,
    JsonValue,
)

PROMPT_PLACEHOLDER = "{prompt}"
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_OUTPUT_CAP_BYTES = 1 << 20
STDERR_TAIL_BYTES = 500
_INHERITED_ENV = ("PATH", "HOME", "LANG")
_READ_CHUNK = 64 * 1024
_EXIT_POLL_SECONDS = 0.05
_REAP_SECONDS = 2.0

ACCEPTED_SETTINGS = frozenset({"cwd", "env", "timeout"})
IMPLEMENTED = frozenset({Capability.SETTINGS})


def code_declaration(shortname: str) -> Declaration:
    """What the code enforces: settings, and nothing else."""
    return Declaration(
        shortname=shortname,
        kind=AdapterKind.HARNESS,
        capabilities=MappingProxyType(
            {
                capability: (
                    CapabilityState.SUPPORTED if capability in IMPLEMENTED else CapabilityState.UNSUPPORTED
                )
                for capability in Capability
            }
        ),
        accepted_settings=ACCEPTED_SETTINGS,
    )


@dataclass(frozen=True, slots=True)
class CommandOptions:
    argv: tuple[str, ...]
    timeout_seconds: float
    cwd: str | None
    env: Mapping[str, str]
    output_cap_bytes: int


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Where and how long one call runs, after per-call settings."""

    cwd: str | None
    env: Mapping[str, str]
    timeout_seconds: float
    timeout_source: str


def read_options(spec: AdapterSpec) -> CommandOptions:
    reader = OptionReader(spec, spec.options)
    argv = reader.raw("argv")
    if not isinstance(argv, list) or not argv:
        reader.fail("argv", f"must be a non-empty list of strings, not {type_name(argv)}")
    for index, element in enumerate(argv):
        if not isinstance(element, str):
            reader.fail(f"argv[{index}]", f"must be a string, not {type_name(element)}")
    if not argv[0]:
        reader.fail("argv[0]", "must name the program")
    if PROMPT_PLACEHOLDER in argv[0]:
        reader.fail("argv[0]", f"must name the program; {PROMPT_PLACEHOLDER} belongs in an argument")
    timeout = reader.positive_number("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    assert timeout is not None  # it has a default
    cwd = reader.string("cwd")
    if cwd is not None and not os.path.isdir(cwd):
        reader.fail("cwd", f'"{cwd}" is not an existing directory')
    env = reader.string_map("env")
    cap = reader.positive_int("output_cap_bytes", DEFAULT_OUTPUT_CAP_BYTES)
    reader.finish()
    return CommandOptions(
        argv=tuple(argv),
        timeout_seconds=timeout,
        cwd=cwd,
        env=MappingProxyType(env),
        output_cap_bytes=cap,
    )


def build_argv(argv: tuple[str, ...], prompt: str) -> tuple[tuple[str, ...], bool]:
    """The argv with the prompt substituted, and whether the prompt went into it."""
    substituted = any(PROMPT_PLACEHOLDER in element for element in argv[1:])
    if not substituted:
        return argv, False
    return (argv[0], *(element.replace(PROMPT_PLACEHOLDER, prompt) for element in argv[1:])), True


def minimal_env(*layers: Mapping[str, str]) -> dict[str, str]:
    env = {name: os.environ[name] for name in _INHERITED_ENV if name in os.environ}
    for layer in layers:
        env.update(layer)
    return env


class OutputTooLarge(Exception):
    pass


class CommandAdapter:
    """Runs `argv` once per call; see the module docstring for the options."""

    implementation = "command"

    def __init__(self, spec: AdapterSpec) -> None:
        self._options = read_options(spec)
        self._declaration = narrow(
            code_declaration(spec.shortname),
            spec.declaration,
            shortname=spec.shortname,
            implementation="command",
        )

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    async def produce(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.PRODUCE, implemented=IMPLEMENTED)
        # check_call refuses output_schema already; this is the backstop.
        raise errors.AdapterRefused(self._declaration.shortname, "a command cannot enforce structured output")

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.INVOKE, implemented=IMPLEMENTED)
        settings = self._run_settings(call.options.settings)
        deadline = call_deadline(
            self._declaration.shortname, call.time_budget, settings.timeout_seconds, settings.timeout_source
        )
        argv, in_argv = build_argv(self._options.argv, call.prompt)
        if any("\0" in element for element in argv):
            raise errors.AdapterRefused(
                self._declaration.shortname, "the prompt contains a NUL byte, which no argument can carry"
            )
        stdin = None if in_argv else call.prompt.encode()
        stdout = await self._run(argv, stdin, settings, deadline)
        return AdapterReply(text=stdout.decode("utf-8", errors="replace"))

    async def close(self) -> None:
        return None

    def _refuse(self, setting: str, problem: str) -> errors.AdapterRefused:
        return errors.AdapterRefused(self._declaration.shortname, f"setting {setting}: {problem}")

    def _run_settings(self, settings: Mapping[str, JsonValue]) -> RunSettings:
        for name in settings:
            if name not in ACCEPTED_SETTINGS:
                raise self._refuse(name, f"not one of {', '.join(sorted(ACCEPTED_SETTINGS))}")
        cwd = self._options.cwd
        if "cwd" in settings:
            value = settings["cwd"]
            if not isinstance(value, str) or not os.path.isdir(value):
                raise self._refuse("cwd", f"{value!r} is not an existing directory")
            cwd = value
        call_env: dict[str, str] = {}
        if "env" in settings:
            value = settings["env"]
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
            ):
                raise self._refuse("env", "must be a mapping of names to strings")
            call_env = dict(value)
        timeout, source = self._options.timeout_seconds, "the adapter's timeout_seconds"
        if "timeout" in settings:
            value = settings["timeout"]
            if not is_number(value) or not 0 < value <= self._options.timeout_seconds:
                raise self._refuse(
                    "timeout", f"must be a number of seconds in (0, {self._options.timeout_seconds:g}]"
                )
            timeout, source = float(value), "the call's timeout setting"
        env = minimal_env(self._options.env, call_env)
        return RunSettings(cwd=cwd, env=MappingProxyType(env), timeout_seconds=timeout, timeout_source=source)

    async def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, settings: RunSettings, deadline: Deadline
    ) -> bytes:
        shortname = self._declaration.shortname
        try:
            process = await start_process(argv, stdin is not None, settings)
        except FileNotFoundError as exc:
            raise errors.AdapterMisconfigured(
                shortname, f'cannot run "{argv[0]}": not found ({exc})'
            ) from exc
        except PermissionError as exc:
            raise errors.AdapterMisconfigured(shortname, f'cannot run "{argv[0]}": {exc.strerror}') from exc
        except OSError as exc:
            raise errors.AdapterMisconfigured(shortname, f'cannot run "{argv[0]}": {exc}') from exc

        try:
            result = await collect(
                process,
                stdin,
                timeout_seconds=deadline.seconds,
                output_cap_bytes=self._options.output_cap_bytes,
            )
        except TimeoutError as exc:
            raise deadline.expired(shortname) from exc
        except OutputTooLarge as exc:
            raise errors.AdapterInternal(
                shortname, f"output exceeded output_cap_bytes={self._options.output_cap_bytes}"
            ) from exc

        returncode = result.returncode
        if returncode != 0:
            how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with {returncode}"
            tail = result.stderr_tail.decode("utf-8", errors="replace").strip()
            raise errors.AdapterInternal(shortname, f"{how}: {tail}" if tail else how)
        return result.stdout


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How a command ended: its exit status (negative: killed by that signal) and output."""

    returncode: int
    stdout: bytes
    stderr_tail: bytes  # the last STDERR_TAIL_BYTES


async def collect(
    process: asyncio.subprocess.Process,
    stdin: bytes | None,
    *,
    timeout_seconds: float | None,
    output_cap_bytes: int,
) -> ProcessResult:
    """Feed `stdin`, read the output, and wait for a process from `start_process` to exit.

    Raises TimeoutError when `timeout_seconds` ran out and OutputTooLarge when
    stdout exceeded `output_cap_bytes`. However it ends (also when cancelled),
    the process group is killed and the process reaped before this returns.
    """
    tasks: list[asyncio.Task[bytes] | asyncio.Task[None]] = []
    finished = False
    try:
        async with asyncio.timeout(timeout_seconds):
            assert process.stdout is not None  # PIPE
            assert process.stderr is not None  # PIPE
            stdout_task = asyncio.create_task(_read_capped(process.stdout, output_cap_bytes, process.pid))
            stderr_task = asyncio.create_task(_read_tail(process.stderr, STDERR_TAIL_BYTES))
            tasks = [stdout_task, stderr_task]
            if stdin is not None:
                assert process.stdin is not None  # PIPE
                tasks.append(asyncio.create_task(_feed(process.stdin, stdin)))
            returncode = await _exit_status(process)
            # Anything the command left behind still holds our pipes, and the call is over.
            _kill_group(process.pid)
            stderr_tail = await stderr_task
            stdout = await stdout_task
            finished = True
    finally:
        if not finished:
            _kill_group(process.pid)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Reap, and let the transport close its pipes; bounded, since a process that
        # left our group (setsid) may still hold them.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), _REAP_SECONDS)
    return ProcessResult(returncode=returncode, stdout=stdout, stderr_tail=stderr_tail)


async def start_process(
    argv: tuple[str, ...], with_stdin: bool, settings: RunSettings
) -> asyncio.subprocess.Process:
    """Start `argv` without a shell, in a session (process group) of its own; finish it with `collect`.

    Raises OSError (FileNotFoundError, PermissionError, ...) when it cannot start.
    """
    starting = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=settings.cwd,
            env=dict(settings.env),
            start_new_session=True,
        )
    )
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        # Cancelled mid-start, asyncio's own cleanup would kill only the leader and then
        # wait for the pipes the rest of its group holds; finish starting, kill the group.
        with contextlib.suppress(Exception):
            process = await starting
            _kill_group(process.pid)
            await asyncio.wait_for(process.wait(), _REAP_SECONDS)
        raise


async def _exit_status(process: asyncio.subprocess.Process) -> int:
    """The command's exit status as soon as it exits.

    Python 3.11's `Process.wait()` also waits for every pipe to close, which
    a background child of the command can delay indefinitely.
    """
    waiter = asyncio.ensure_future(process.wait())
    try:
        while process.returncode is None and not waiter.done():
            await asyncio.wait({waiter}, timeout=_EXIT_POLL_SECONDS)
    finally:
        waiter.cancel()
    assert process.returncode is not None  # the loop ends only once it is set
    return process.returncode


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, signal.SIGKILL)


async def _read_capped(stream: asyncio.StreamReader, cap: int, pgid: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    overflowed = False
    while chunk := await stream.read(_READ_CHUNK):
        size += len(chunk)
        if size <= cap:
            chunks.append(chunk)
        elif not overflowed:
            # Stop the writer now rather than buffer a runaway stream until the deadline,
            # and keep draining to EOF: a paused pipe would never report the close.
            _kill_group(pgid)
            overflowed = True
            chunks.clear()
    if overflowed:
        raise OutputTooLarge
    return b"".join(chunks)


async def _read_tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    tail = b""
    while chunk := await stream.read(_READ_CHUNK):
        tail = (tail + chunk)[-keep:]
    return tail


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
        await stdin.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command does not read its stdin; its exit status tells the rest
