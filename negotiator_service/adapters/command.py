"""The command adapter: a local agent CLI, run as a harness without a shell.

It declares what it can enforce or pass on: per-call `timeout`, `env` and
`cwd` when the operator allowed them, and every capability the operator
mapped onto the CLI's own flags and files (`map`, see `command_map`): a model
is SUPPORTED only with a `{model}` fragment, structured output only with an
`{output_schema_file}` fragment, and so on. Everything else is declared
unsupported. Structured output read back from the CLI is validated against
the caller's schema by the broker, as every adapter's is.

No caller chooses the program, how it is loaded, or where it runs: argv[0] is
resolved once, when the adapter is built, on the negotiator's own PATH, and
every call executes that absolute path; a call may set only the environment
variables the operator listed in `call_env` (never a loader or search-path
variable, see `is_loader_variable`), and a `cwd` only inside `cwd_roots`.
Caller text (prompt, model, persona, ...) only ever lands inside the argv
element holding its placeholder. An MCP stdio server a call names runs only
when it is one of the operator's `map.mcp.stdio_commands`.

Options:
    argv:             [program, arg, ...] (required); an element containing
                      "{prompt}" has it replaced by the prompt, otherwise (and
                      when `tail` holds none) the prompt is written to stdin.
                      The program must be an executable file: a path, or a
                      name on the negotiator's PATH
    tail:             [arg, ...] after the mapped fragments (may hold "{prompt}")
    map:              capability -> argv fragment (see `command_map`)
    delegation:       "provider-managed": the CLI delegates on its own
                      (declares subagents and depth_limit)
    preset:           a shipped preset (`command_presets`) whose options these
                      options are laid over, key by key
    timeout_seconds:  default 60; a per-call `timeout` setting may only lower it
    cwd:              working directory (default: the negotiator's)
    env:              variables added to a minimal environment (PATH, HOME, LANG)
    call_env:         [NAME, ...] variables a call may set with its `env` setting
                      (default none: `env` is not an accepted setting)
    cwd_roots:        [DIR, ...] directories a call's `cwd` setting must resolve
                      inside, symlinks and `..` followed (default none: `cwd` is
                      not an accepted setting)
    output_cap_bytes: most stdout bytes accepted, and most bytes read from an
                      output file (default 1 MiB)

Files a run hands the CLI (`{output_schema_file}`, `{output_file}`,
`{mcp_config_file}`) live in a scratch directory of that run, removed when it ends.

Each run is contained by `agentsidecar.sidecar_runtime.proctree`: whatever it starts, even
in a session of its own, is killed when the command exits, on timeout or
cancellation, and when the negotiator dies. `start_process` and `collect` are
that harness on their own, for other callers of local commands (capability
bootstrap runs seed commands with it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters._calls import Deadline, call_deadline, check_call, plain_json
from agentsidecar.negotiator_service.adapters._options import OptionReader, is_number, type_name
from agentsidecar.negotiator_service.adapters.command_map import (
    CallArguments,
    CallNotPassable,
    HarnessMap,
    mcp_config,
    parse_events,
    read_map,
)
from agentsidecar.negotiator_service.adapters.command_presets import with_preset
from agentsidecar.negotiator_service.declarations import narrow
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    AdapterSpec,
    CallKind,
    Capability,
    CapabilityState,
    Declaration,
    JsonValue,
    StreamDelta,
    StreamEvent,
    StreamItem,
)
from agentsidecar.sidecar_runtime import proctree

PROMPT_PLACEHOLDER = "{prompt}"
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_OUTPUT_CAP_BYTES = 1 << 20
STDERR_TAIL_BYTES = 500
_T = TypeVar("_T")
_INHERITED_ENV = ("PATH", "HOME", "LANG")
_READ_CHUNK = 64 * 1024
# The supervisor exits only once the whole tree is gone, so the pipes are at EOF by then; this
# bounds the read for a tree the supervisor could not hold (it was itself killed from outside).
_DRAIN_AFTER_EXIT_SECONDS = 1.0

ALWAYS_ACCEPTED_SETTINGS = frozenset({"timeout"})
IMPLEMENTED = frozenset({Capability.SETTINGS})

# Variables that choose which code runs rather than what it works on: the dynamic loader's
# preloads and search paths, interpreters' module paths and start-up code, a shell's start-up
# files and word splitting, exported shell functions. Whoever sets one chooses the program, so
# no call may set them and `call_env` may not list them.
LOADER_VARIABLES = frozenset(
    {
        "PATH",
        "IFS",
        "ENV",
        "BASH_ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "CDPATH",
        "GLOBIGNORE",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "RES_OPTIONS",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "PERL5DB",
        "RUBYLIB",
        "RUBYOPT",
        "CLASSPATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "LUA_PATH",
        "LUA_CPATH",
        "LUA_INIT",
        "TCLLIBPATH",
        "GIT_EXEC_PATH",
    }
)
LOADER_PREFIXES = ("LD_", "DYLD_", "PYTHON", "BASH_FUNC_", "MALLOC_", "GLIBC_")


def is_loader_variable(name: str) -> bool:
    """Whether `name` is a loader or search-path variable (see LOADER_VARIABLES); case-sensitive,
    as the environment is."""
    return name in LOADER_VARIABLES or name.startswith(LOADER_PREFIXES)


def resolve_program(name: str, search_path: str | None = None) -> str | None:
    """The absolute path `name` runs as, or None when that is not an executable file.

    A name with a slash is a path (relative to this process's working directory); a bare
    name is looked up on `search_path`, by default this process's own PATH.
    """
    if "\0" in name:
        return None
    if "/" in name:
        candidate = os.path.abspath(name)
        return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    found = shutil.which(
        name, path=os.environ.get("PATH", os.defpath) if search_path is None else search_path
    )
    return os.path.abspath(found) if found else None


def locate_program(name: str) -> str | None:
    """`name` as an absolute path to exec: a path made absolute as it is (exec reports what is
    wrong with it), a bare name resolved on this process's own PATH (None: not found there)."""
    return os.path.abspath(name) if "/" in name else resolve_program(name)


def code_declaration(
    shortname: str,
    accepted_settings: frozenset[str] = ALWAYS_ACCEPTED_SETTINGS,
    harness: HarnessMap | None = None,
) -> Declaration:
    """What the code enforces: settings (those the options allow), what `harness` maps, nothing else."""
    harness = harness if harness is not None else HarnessMap()
    implemented = IMPLEMENTED | harness.capabilities
    return Declaration(
        shortname=shortname,
        kind=AdapterKind.HARNESS,
        capabilities=MappingProxyType(
            {
                capability: (
                    CapabilityState.SUPPORTED if capability in implemented else CapabilityState.UNSUPPORTED
                )
                for capability in Capability
            }
        ),
        mcp_transports=harness.mcp_transports,
        accepted_settings=accepted_settings,
        string_formats=harness.string_formats if harness.output_schema is not None else frozenset(),
        # The levels the map passes on are a typed set, so another level is refused before dispatch.
        effort_levels=harness.effort_values,
    )


@dataclass(frozen=True, slots=True)
class CommandOptions:
    argv: tuple[str, ...]
    program: str  # argv[0] resolved at start-up: the absolute path every run executes
    timeout_seconds: float
    cwd: str | None
    env: Mapping[str, str]
    call_env: frozenset[str]
    cwd_roots: tuple[str, ...]  # real paths
    output_cap_bytes: int
    harness: HarnessMap = field(default_factory=HarnessMap)

    @property
    def accepted_settings(self) -> frozenset[str]:
        return (
            ALWAYS_ACCEPTED_SETTINGS
            | {name for name, allowed in (("env", self.call_env), ("cwd", self.cwd_roots)) if allowed}
            | frozenset(self.harness.settings)
        )


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Where and how long one call runs, after per-call settings."""

    cwd: str | None
    env: Mapping[str, str]
    timeout_seconds: float
    timeout_source: str


def read_options(spec: AdapterSpec) -> CommandOptions:
    reader = OptionReader(spec, with_preset(spec))
    reader.raw("preset")  # applied by with_preset
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
    program = resolve_program(argv[0])
    if program is None:
        reader.fail("argv[0]", f'"{argv[0]}" is not an executable file (looked up on the negotiator\'s PATH)')
    timeout = reader.positive_number("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    assert timeout is not None  # it has a default
    cwd = reader.string("cwd")
    if cwd is not None and not os.path.isdir(cwd):
        reader.fail("cwd", f'"{cwd}" is not an existing directory')
    env = reader.string_map("env")
    call_env = _read_call_env(reader)
    cwd_roots = _read_cwd_roots(reader)
    cap = reader.positive_int("output_cap_bytes", DEFAULT_OUTPUT_CAP_BYTES)
    harness = read_map(reader, resolve_program)
    reader.finish()
    return CommandOptions(
        argv=tuple(argv),
        program=program,
        timeout_seconds=timeout,
        cwd=cwd,
        env=MappingProxyType(env),
        call_env=call_env,
        cwd_roots=cwd_roots,
        output_cap_bytes=cap,
        harness=harness,
    )


def _string_list(reader: OptionReader, key: str) -> list[str]:
    value = reader.raw(key)
    if value is None:
        return []
    if not isinstance(value, list):
        reader.fail(key, f"must be a list of strings, not {type_name(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item or "\0" in item:
            reader.fail(f"{key}[{index}]", f"must be a non-empty string, not {item!r}")
    return list(value)


def _read_call_env(reader: OptionReader) -> frozenset[str]:
    names = _string_list(reader, "call_env")
    for index, name in enumerate(names):
        if "=" in name:
            reader.fail(f"call_env[{index}]", f"{name!r} is not a variable name")
        if is_loader_variable(name):
            reader.fail(
                f"call_env[{index}]",
                f"{name} is a loader or search-path variable, which no call may set",
            )
    return frozenset(names)


def _read_cwd_roots(reader: OptionReader) -> tuple[str, ...]:
    roots = []
    for index, root in enumerate(_string_list(reader, "cwd_roots")):
        if not os.path.isabs(root) or not os.path.isdir(root):
            reader.fail(f"cwd_roots[{index}]", f'"{root}" is not an existing absolute directory')
        roots.append(os.path.realpath(root))
    return tuple(roots)


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
        self._implemented = IMPLEMENTED | self._options.harness.capabilities
        self._declaration = narrow(
            code_declaration(spec.shortname, self._options.accepted_settings, self._options.harness),
            spec.declaration,
            shortname=spec.shortname,
            implementation="command",
        )

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    async def produce(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.PRODUCE, implemented=self._implemented)
        if self._options.harness.output_schema is None:
            # check_call refuses output_schema already; this is the backstop.
            raise errors.AdapterRefused(
                self._declaration.shortname, "a command cannot enforce structured output"
            )
        return await self._call(call)

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.INVOKE, implemented=self._implemented)
        return await self._call(call)

    async def _call(self, call: AdapterCall) -> AdapterReply:
        shortname = self._declaration.shortname
        settings = self._run_settings(call.options.settings)
        deadline = call_deadline(
            shortname, call.time_budget, settings.timeout_seconds, settings.timeout_source
        )
        scratch = tempfile.mkdtemp(prefix="negotiator-cmd-") if self._needs_scratch(call) else None
        try:
            argv, stdin, values = self._command(call, scratch)
            stdout = (await self._run(argv, stdin, settings, deadline)).decode("utf-8", errors="replace")
            return self._reply(call, stdout, values.get("output_file"))
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    async def stream(self, call: AdapterCall, kind: CallKind) -> AsyncGenerator[StreamItem, None]:
        """The run with its stdout read as it comes: one delta per line, or its events in event mode.

        In event mode (an `events` map and options.stream_events) each
        JSON-lines record is yielded as the events it stands for as soon as
        its line is complete; otherwise each line (with its newline) is a
        text delta. The reply is the one `invoke`/`produce` would return for
        the same output. One deadline bounds the run, checked on every read;
        closing this iterator stops the whole process tree (proctree) at once.
        """
        check_call(self._declaration, call, kind, implemented=self._implemented)
        shortname = self._declaration.shortname
        if kind is CallKind.PRODUCE and self._options.harness.output_schema is None:
            raise errors.AdapterRefused(shortname, "a command cannot enforce structured output")
        settings = self._run_settings(call.options.settings)
        deadline = call_deadline(
            shortname, call.time_budget, settings.timeout_seconds, settings.timeout_source
        )
        events = self._options.harness.events
        event_format = events.format if events is not None and call.options.stream_events else None
        cap = self._options.output_cap_bytes
        scratch = tempfile.mkdtemp(prefix="negotiator-cmd-") if self._needs_scratch(call) else None
        try:
            argv, stdin, values = self._command(call, scratch)
            run = await self._start(argv, stdin, settings)
            when = None if deadline.seconds is None else asyncio.get_running_loop().time() + deadline.seconds
            process = run.process
            assert process.stdout is not None  # PIPE
            assert process.stderr is not None  # PIPE
            stderr = _Capture(STDERR_TAIL_BYTES, keep_tail=True)
            tasks = [asyncio.create_task(stderr.drain(process.stderr))]
            if stdin is not None:
                assert process.stdin is not None  # PIPE
                tasks.append(asyncio.create_task(_feed(process.stdin, stdin)))
            output = bytearray()
            pending = b""
            try:
                while True:
                    chunk = await _until(process.stdout.read(_READ_CHUNK), when, deadline, shortname)
                    output += chunk
                    if len(output) > cap:
                        raise errors.AdapterInternal(shortname, f"output exceeded output_cap_bytes={cap}")
                    pending += chunk
                    # At EOF the unterminated rest counts as a last line.
                    lines = pending.split(b"\n") if chunk else [pending, b""]
                    pending = lines.pop()
                    for line in lines:
                        if not line and not chunk:
                            continue
                        text = line.decode("utf-8", errors="replace") + ("\n" if chunk else "")
                        if event_format is None:
                            yield StreamDelta(text)
                        else:
                            for event in parse_events(event_format, text).events:
                                yield event
                    if not chunk:
                        break
                await _until(run.exited.wait(), when, deadline, shortname)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await run.finish()
            self._check_exit(run.returncode, stderr.kept())
            reply = self._reply(call, output.decode("utf-8", errors="replace"), values.get("output_file"))
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        yield reply

    def _command(
        self, call: AdapterCall, scratch: str | None
    ) -> tuple[tuple[str, ...], bytes | None, dict[str, str]]:
        """The argv of a call, its stdin (None: the prompt is in argv), and its placeholder values."""
        shortname = self._declaration.shortname
        harness = self._options.harness
        head, in_head = build_argv(self._options.argv, call.prompt)
        in_tail = any(PROMPT_PLACEHOLDER in element for element in harness.tail)
        values = self._prepare_files(call, scratch)
        try:
            mapped = harness.arguments(
                CallArguments(
                    prompt=call.prompt,
                    options=call.options,
                    settings=call.options.settings,
                    delegation_depth=call.delegation_depth,
                    values=MappingProxyType(values),
                )
            )
        except CallNotPassable as exc:
            raise errors.AdapterRefused(shortname, str(exc)) from exc
        argv = (*head, *mapped)
        if any("\0" in element for element in argv):
            raise errors.AdapterRefused(
                shortname, "the call holds a NUL byte (prompt or option), which no argument can carry"
            )
        stdin = None if in_head or in_tail else call.prompt.encode()
        return argv, stdin, values

    def _needs_scratch(self, call: AdapterCall) -> bool:
        harness = self._options.harness
        return (
            (call.output_schema is not None and harness.output_schema is not None)
            or harness.output_file is not None
            or (bool(call.options.mcp_servers) and harness.mcp is not None and harness.mcp.wants_file)
        )

    def _prepare_files(self, call: AdapterCall, scratch: str | None) -> dict[str, str]:
        """Write what the run hands the CLI as files (into `scratch`); the placeholder values."""
        harness = self._options.harness
        values: dict[str, str] = {}
        if call.options.mcp_servers and harness.mcp is not None:
            try:
                text = mcp_config(harness.mcp, call.options.mcp_servers, is_loader_variable)
            except CallNotPassable as exc:
                raise errors.AdapterRefused(self._declaration.shortname, str(exc)) from exc
            values["mcp_config"] = text
            if scratch is not None and harness.mcp.wants_file:
                suffix = "toml" if harness.mcp.format == "codex" else "json"
                values["mcp_config_file"] = _write(scratch, f"mcp.{suffix}", text)
        if scratch is None:
            return values
        if call.output_schema is not None and harness.output_schema is not None:
            values["output_schema_file"] = _write(
                scratch, "output-schema.json", json.dumps(plain_json(call.output_schema))
            )
        if harness.output_file is not None:
            values["output_file"] = os.path.join(scratch, "output")
        return values

    def _reply(self, call: AdapterCall, stdout: str, output_file: str | None) -> AdapterReply:
        """The reply: the output file when mapped, else stdout (the final answer in an event mode)."""
        shortname = self._declaration.shortname
        harness = self._options.harness
        events: tuple[StreamEvent, ...] = ()
        text = stdout
        if harness.events is not None and call.options.stream_events:
            parsed = parse_events(harness.events.format, stdout)
            if parsed.failure is not None:
                raise errors.AdapterInternal(shortname, f"the harness reported a failure: {parsed.failure}")
            events = parsed.events
            text = parsed.final_text if parsed.final_text is not None else ""
        if output_file is not None:
            text = self._read_output(output_file)
        return AdapterReply(text=text, events=events)

    def _read_output(self, path: str) -> str:
        shortname = self._declaration.shortname
        cap = self._options.output_cap_bytes
        try:
            with open(path, "rb") as handle:
                data = handle.read(cap + 1)
        except FileNotFoundError:
            raise errors.AdapterInternal(shortname, "the command wrote no output file") from None
        except OSError as exc:
            raise errors.AdapterInternal(shortname, f"cannot read the output file: {exc.strerror}") from exc
        if len(data) > cap:
            raise errors.AdapterInternal(shortname, f"the output file exceeded output_cap_bytes={cap}")
        return data.decode("utf-8", errors="replace")

    async def close(self) -> None:
        return None

    def _refuse(self, setting: str, problem: str) -> errors.AdapterRefused:
        return errors.AdapterRefused(self._declaration.shortname, f"setting {setting}: {problem}")

    def _run_settings(self, settings: Mapping[str, JsonValue]) -> RunSettings:
        accepted = self._options.accepted_settings
        harness = self._options.harness
        for name, value in settings.items():
            if name not in accepted:
                raise self._refuse(name, f"not one of {', '.join(sorted(accepted))}")
            if name in harness.settings and (problem := harness.check_setting(name, value)):
                raise self._refuse(name, problem)
        cwd = self._options.cwd
        if "cwd" in settings:
            cwd = self._call_cwd(settings["cwd"])
        call_env: dict[str, str] = {}
        if "env" in settings:
            call_env = self._call_env(settings["env"])
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

    def _call_cwd(self, value: JsonValue) -> str:
        if not isinstance(value, str) or not value or "\0" in value:
            raise self._refuse("cwd", "must be a directory path")
        # Resolved first, so neither a symlink nor `..` can lead out of a root; the run gets the
        # resolved path.
        real = os.path.realpath(value)
        if not any(os.path.commonpath((root, real)) == root for root in self._options.cwd_roots):
            raise self._refuse("cwd", f"{value!r} is not inside the adapter's cwd_roots")
        if not os.path.isdir(real):
            raise self._refuse("cwd", f"{value!r} is not an existing directory")
        return real

    def _call_env(self, value: JsonValue) -> dict[str, str]:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
        ):
            raise self._refuse("env", "must be a mapping of names to strings")
        allowed = self._options.call_env
        for name, item in value.items():
            if is_loader_variable(name):
                raise self._refuse(
                    "env", f"{name} is a loader or search-path variable, which no call may set"
                )
            if name not in allowed:
                raise self._refuse(
                    "env", f"{name} is not one of the adapter's call_env ({', '.join(sorted(allowed))})"
                )
            if "\0" in item:
                raise self._refuse("env", f"the value of {name} contains a NUL byte")
        return dict(value)

    async def _start(self, argv: tuple[str, ...], stdin: bytes | None, settings: RunSettings) -> proctree.Run:
        shortname = self._declaration.shortname
        program = self._options.program
        try:
            return await start_process(program, argv, stdin is not None, settings)
        except FileNotFoundError as exc:
            raise errors.AdapterMisconfigured(
                shortname, f'cannot run "{program}": not found ({exc})'
            ) from exc
        except PermissionError as exc:
            raise errors.AdapterMisconfigured(shortname, f'cannot run "{program}": {exc.strerror}') from exc
        except OSError as exc:
            raise errors.AdapterMisconfigured(shortname, f'cannot run "{program}": {exc}') from exc

    async def _run(
        self, argv: tuple[str, ...], stdin: bytes | None, settings: RunSettings, deadline: Deadline
    ) -> bytes:
        shortname = self._declaration.shortname
        run = await self._start(argv, stdin, settings)
        try:
            result = await collect(
                run,
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
        self._check_exit(result.returncode, result.stderr_tail)
        return result.stdout

    def _check_exit(self, returncode: int | None, stderr_tail: bytes) -> None:
        """AdapterInternal for a run that did not exit with 0, quoting the end of its stderr."""
        if returncode == 0:
            return
        how = (
            "did not exit"
            if returncode is None
            else f"was killed by signal {-returncode}"
            if returncode < 0
            else f"exited with {returncode}"
        )
        tail = stderr_tail.decode("utf-8", errors="replace").strip()
        raise errors.AdapterInternal(self._declaration.shortname, f"{how}: {tail}" if tail else how)


@dataclass(frozen=True, slots=True)
class ProcessResult:
    """How a command ended: its exit status (negative: killed by that signal) and output."""

    returncode: int
    stdout: bytes
    stderr_tail: bytes  # the last STDERR_TAIL_BYTES


async def start_process(
    program: str, argv: Sequence[str], with_stdin: bool, settings: RunSettings
) -> proctree.Run:
    """Start `argv` as the absolute `program`, without a shell, contained; finish it with `collect`.

    Raises OSError (FileNotFoundError, PermissionError, ...) when it cannot start.
    """
    return await proctree.start(
        program,
        argv,
        env=settings.env,
        cwd=settings.cwd,
        stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def collect(
    run: proctree.Run,
    stdin: bytes | None,
    *,
    timeout_seconds: float | None,
    output_cap_bytes: int,
) -> ProcessResult:
    """Feed `stdin`, read the output, and wait for a process from `start_process` to exit.

    Raises TimeoutError when `timeout_seconds` ran out and OutputTooLarge when
    stdout exceeded `output_cap_bytes`. However it ends (also when cancelled),
    the whole process tree is killed and the supervisor reaped before this returns.
    """
    process = run.process
    assert process.stdout is not None  # PIPE
    assert process.stderr is not None  # PIPE
    stdout = _Capture(output_cap_bytes, on_overflow=run.stop)
    stderr = _Capture(STDERR_TAIL_BYTES, keep_tail=True)
    readers = [
        asyncio.create_task(stdout.drain(process.stdout)),
        asyncio.create_task(stderr.drain(process.stderr)),
    ]
    tasks = list(readers)
    if stdin is not None:
        assert process.stdin is not None  # PIPE
        tasks.append(asyncio.create_task(_feed(process.stdin, stdin)))
    try:
        async with asyncio.timeout(timeout_seconds):
            await run.exited.wait()
        returncode = run.returncode
        assert returncode is not None  # set before the exit is reported
        # The tree is gone with its supervisor; stop reading shortly after in any case.
        _, late = await asyncio.wait(readers, timeout=_DRAIN_AFTER_EXIT_SECONDS)
        if late:
            run.kill_group()
    finally:
        # The tree is told to stop before anything here can be interrupted, and the rest runs
        # to its end even when a cancellation arrives meanwhile (the caller's deadline meeting
        # the run's own timeout): a second cancellation must not leave the tree running.
        run.stop()
        await proctree.to_the_end(_end_run(run, tasks))
    if stdout.overflowed:
        raise OutputTooLarge
    return ProcessResult(returncode=returncode, stdout=stdout.kept(), stderr_tail=stderr.kept())


async def _end_run(run: proctree.Run, tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await run.finish()


class _Capture:
    """Reads a stream to EOF, keeping at most `cap` bytes: the first ones, or with `keep_tail` the last.

    Past the cap of a head capture it calls `on_overflow` once (to stop the writer rather than
    buffer a runaway stream until the deadline) and keeps draining, since a paused pipe would
    never report the close.
    """

    def __init__(
        self, cap: int, *, keep_tail: bool = False, on_overflow: Callable[[], None] | None = None
    ) -> None:
        self._cap = cap
        self._keep_tail = keep_tail
        self._on_overflow = on_overflow
        self._data = bytearray()
        self.overflowed = False

    def kept(self) -> bytes:
        return b"" if self.overflowed else bytes(self._data)

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            if self._keep_tail:
                self._data += chunk
                del self._data[: max(0, len(self._data) - self._cap)]
            elif not self.overflowed:
                self._data += chunk
                if len(self._data) > self._cap:
                    self.overflowed = True
                    self._data.clear()
                    if self._on_overflow is not None:
                        self._on_overflow()


def _write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "x", encoding="utf-8") as handle:
        handle.write(text)
    return path


async def _feed(stdin: asyncio.StreamWriter, data: bytes) -> None:
    try:
        stdin.write(data)
        await stdin.drain()
        stdin.close()
        await stdin.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the command does not read its stdin; its exit status tells the rest


async def _until(awaitable: Awaitable[_T], when: float | None, deadline: Deadline, adapter: str) -> _T:
    """`awaitable`, bounded by the loop time `when` (None: unbounded); the deadline's timeout past it."""
    if when is None:
        return await awaitable
    try:
        async with asyncio.timeout_at(when):
            return await awaitable
    except TimeoutError as exc:
        raise deadline.expired(adapter) from exc
