"""The acp adapter: any agent that speaks the Agent Client Protocol (JSON-RPC over stdio).

The operator configures the agent's command; the caller chooses nothing about which program
runs or how it is loaded (the rules of the command adapter, whose `resolve_program`,
`minimal_env` and loader-variable checks this module imports). The negotiator is the ACP
client, through the protocol's Python SDK (`agent-client-protocol`).

The declaration is the agent's own answer. When the adapter is built it starts the agent once,
runs `initialize` and a `session/new` in a scratch directory, and stops it again:

    mcp, mcp_transports     ACP always carries stdio MCP servers; http and sse as
                            `mcpCapabilities` says
    stateful_history        `loadSession` or `sessionCapabilities.resume`: the ACP session id
                            is the conversation state, resumed (or loaded) on the next call
    stream_events           `session/update` notifications, returned as events
    model_override, effort  a session config option of category `model` / `thought_level`
    profile_override        the session's modes (`profile` names a mode id)
    native_approvals,       `session/request_permission` is part of the protocol; the caller
    native_approval_handler answers it on a ToolSession (see "Permissions")
    settings                timeout, and cwd / env as the operator allows
    structured_output       unsupported: ACP has no output schema
    tool_registration       supported only as the permission channel (see "Permissions")
    everything else         unsupported: this adapter does not carry it

When the probe session could not be created (the agent wants a login, say), what only a
session tells (model, effort, modes) is UNKNOWN. Config may narrow the declaration.

One agent process per call, contained by `agentsidecar.sidecar_runtime.proctree` (killed with everything it
started when the call ends, on timeout or cancellation, and when the negotiator dies): it is
initialized, gets `session/new` (or `session/resume` / `session/load` inside a conversation)
with the call's cwd and MCP servers, then `session/prompt` with the prompt. `stream` yields each
text chunk of the agent's messages as a delta the moment it arrives and every other update as an
event; the deltas together are the reply. `invoke` collects that stream (every update, message
chunks included, is then an event of the reply). On the caller's cancellation (closing the
stream, or cancelling invoke) or the
deadline the adapter sends `session/cancel` and waits up to CANCEL_GRACE_SECONDS for the turn to
end before the process is stopped. An agent that exits or closes its output mid-call is
ADAPTER_UNAVAILABLE with the tail of its stderr.

Permissions: an agent's `session/request_permission` is put to the caller through the call's
ToolBox as a call of the tool named by `permission_tool` (default "acp_permission"), with the
arguments {title, kind, raw_input, options: [{option_id, name, kind}]}. The caller declares that
tool in its ToolSession (risk mutating or sensitive, so it is asked as an ApprovalRequest first):
DENY, a tool error, or no such tool in the call (a plain Produce/Invoke has no channel at all)
selects the agent's first reject option; ALLOW and a result selects the option whose id the
result's "option_id" names, or the first allow_once option. An ACP agent cannot see the caller's
other tools, so a call bringing any other tool is refused.

Client capabilities (`fs`, `terminal`) are offered only as the operator allows: `client_fs`
"read" or "read-write" serves `fs/read_text_file` / `fs/write_text_file` for paths inside the
session's cwd; terminals are never offered.

Options:
    argv:               [program, arg, ...] (required); the program must be an executable file
    env:                variables added to a minimal environment (PATH, HOME, LANG)
    cwd:                the session's directory when a call sets none (default: a scratch
                        directory per call, removed afterwards)
    call_env, cwd_roots as for the command adapter
    timeout_seconds:    default 300; a per-call `timeout` setting may only lower it
    startup_timeout_seconds: default 30, for starting the agent and `initialize`
    client_fs:          "none" (default), "read" or "read-write"
    permission_tool:    the caller tool that carries permission requests
    output_cap_bytes:   most bytes of reply text and event text (default 1 MiB)
    max_line_bytes:     most bytes of one line (one JSON-RPC message) from the agent (default
                        8 MiB). The SDK's own reader joins a line's pieces without a limit, so
                        the agent's output is framed here; past the cap the connection ends, the
                        call fails with ADAPTER_REPLY_TOO_LARGE and the agent is stopped
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AcpMcpServer,
    AgentMessageChunk,
    AgentThoughtChunk,
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    EnvVariable,
    FileSystemCapabilities,
    HttpHeader,
    HttpMcpServer,
    Implementation,
    InitializeResponse,
    McpServerStdio,
    NewSessionResponse,
    PermissionOption,
    ReadTextFileResponse,
    RequestPermissionResponse,
    SessionConfigOptionSelect,
    SseMcpServer,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    WriteTextFileResponse,
)

from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters._calls import Deadline, call_deadline, check_call
from agentsidecar.negotiator_service.adapters._options import OptionReader, is_number, type_name
from agentsidecar.negotiator_service.adapters.command import (
    STDERR_TAIL_BYTES,
    _read_call_env,
    _read_cwd_roots,
    is_loader_variable,
    minimal_env,
    resolve_program,
)
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
    McpServer,
    StreamDelta,
    StreamEvent,
    StreamItem,
    ToolBox,
)
from agentsidecar.sidecar_runtime import proctree

DEFAULT_TIMEOUT_SECONDS = 300.0
DEFAULT_STARTUP_TIMEOUT_SECONDS = 30.0
DEFAULT_OUTPUT_CAP_BYTES = 1 << 20
DEFAULT_MAX_LINE_BYTES = 8 * 1024 * 1024
DEFAULT_PERMISSION_TOOL = "acp_permission"
# The event type of a text chunk of the agent's message (its session/update kind).
MESSAGE_CHUNK = "agent_message_chunk"
# How long a cancelled turn may take to end after session/cancel before the process is stopped.
CANCEL_GRACE_SECONDS = 3.0
# How long the stderr of an agent that went away may take to reach EOF.
_STDERR_DRAIN_SECONDS = 1.0
_READ_CHUNK = 64 * 1024
_LOGGER = logging.getLogger("agentsidecar.negotiator_service.adapters.acp")
CLIENT_FS_MODES = ("none", "read", "read-write")
CLIENT_INFO = Implementation(name="agentsidecar-negotiator", title="agentsidecar negotiator", version="0.1.0")

IMPLEMENTED = frozenset(
    {
        Capability.MCP,
        Capability.STATEFUL_HISTORY,
        Capability.STREAM_EVENTS,
        Capability.MODEL_OVERRIDE,
        Capability.EFFORT,
        Capability.PROFILE_OVERRIDE,
        Capability.SETTINGS,
        Capability.NATIVE_APPROVALS,
        Capability.NATIVE_APPROVAL_HANDLER,
        # Only the permission tool: a call with any other tool is refused (see the module docs).
        Capability.TOOL_REGISTRATION,
    }
)
ALWAYS_ACCEPTED_SETTINGS = frozenset({"timeout"})


# --- the declaration, from the agent's answers (pure) ---------------------------------------


@dataclass(frozen=True, slots=True)
class SessionControls:
    """What a session lets a call choose: config option ids and their values, and mode ids."""

    model_option: str | None = None
    model_values: frozenset[str] = frozenset()
    effort_option: str | None = None
    effort_values: frozenset[str] = frozenset()
    modes: frozenset[str] = frozenset()


def _select_values(option: SessionConfigOptionSelect) -> frozenset[str]:
    values: set[str] = set()
    for entry in option.options:
        if hasattr(entry, "value"):
            values.add(entry.value)
        else:  # a group of options
            values.update(item.value for item in entry.options)
    return frozenset(values)


def session_controls(session: NewSessionResponse) -> SessionControls:
    model_option = effort_option = None
    model_values: frozenset[str] = frozenset()
    effort_values: frozenset[str] = frozenset()
    for option in session.config_options or ():
        if not isinstance(option, SessionConfigOptionSelect):
            continue
        if option.category == "model" and model_option is None:
            model_option, model_values = option.id, _select_values(option)
        elif option.category == "thought_level" and effort_option is None:
            effort_option, effort_values = option.id, _select_values(option)
    modes = frozenset(mode.id for mode in session.modes.available_modes) if session.modes else frozenset()
    return SessionControls(model_option, model_values, effort_option, effort_values, modes)


def agent_declaration(
    shortname: str,
    initialized: InitializeResponse,
    controls: SessionControls | None,
    accepted_settings: frozenset[str],
) -> Declaration:
    """The declaration an agent's `initialize` answer (and probe session, if any) supports.

    `controls` None: the probe session failed, so what only a session tells is UNKNOWN.
    """
    capabilities = initialized.agent_capabilities
    mcp = capabilities.mcp_capabilities if capabilities else None
    transports = {"stdio"}
    if mcp is not None and mcp.http:
        transports.add("http")
    if mcp is not None and mcp.sse:
        transports.add("sse")
    sessions = capabilities.session_capabilities if capabilities else None
    resumable = bool(capabilities and capabilities.load_session) or bool(sessions and sessions.resume)

    def state(supported: bool) -> CapabilityState:
        return CapabilityState.SUPPORTED if supported else CapabilityState.UNSUPPORTED

    states = {capability: CapabilityState.UNSUPPORTED for capability in Capability}
    states.update(
        {
            Capability.MCP: CapabilityState.SUPPORTED,
            Capability.STREAM_EVENTS: CapabilityState.SUPPORTED,
            Capability.SETTINGS: CapabilityState.SUPPORTED,
            Capability.NATIVE_APPROVALS: CapabilityState.SUPPORTED,
            Capability.NATIVE_APPROVAL_HANDLER: CapabilityState.SUPPORTED,
            Capability.TOOL_REGISTRATION: CapabilityState.SUPPORTED,
            Capability.STATEFUL_HISTORY: state(resumable),
        }
    )
    for capability, supported in (
        (Capability.MODEL_OVERRIDE, controls is not None and controls.model_option is not None),
        (Capability.EFFORT, controls is not None and controls.effort_option is not None),
        (Capability.PROFILE_OVERRIDE, controls is not None and bool(controls.modes)),
    ):
        states[capability] = CapabilityState.UNKNOWN if controls is None else state(supported)
    return Declaration(
        shortname=shortname,
        kind=AdapterKind.HARNESS,
        capabilities=MappingProxyType(states),
        mcp_transports=frozenset(transports),
        accepted_settings=accepted_settings,
    )


AcpMcpServers = list[HttpMcpServer | SseMcpServer | AcpMcpServer | McpServerStdio]


def acp_mcp_servers(servers: tuple[McpServer, ...]) -> AcpMcpServers:
    """The call's MCP servers as ACP's session/new carries them."""
    converted: AcpMcpServers = []
    for server in servers:
        headers = [HttpHeader(name=name, value=value) for name, value in server.headers.items()]
        if server.transport == "stdio":
            env = [EnvVariable(name=name, value=value) for name, value in server.env.items()]
            converted.append(
                McpServerStdio(name=server.name, command=server.command, args=list(server.args), env=env)
            )
        elif server.transport == "http":
            converted.append(HttpMcpServer(type="http", name=server.name, url=server.url, headers=headers))
        else:
            converted.append(SseMcpServer(type="sse", name=server.name, url=server.url, headers=headers))
    return converted


def chosen_option(options: list[PermissionOption], outcome_allowed: bool, chosen_id: object) -> str | None:
    """The permission option a caller's answer selects; None: cancel the request."""
    if outcome_allowed:
        if isinstance(chosen_id, str) and any(option.option_id == chosen_id for option in options):
            return chosen_id
        kinds: tuple[str, ...] = ("allow_once", "allow_always")
    else:
        kinds = ("reject_once", "reject_always")
    for kind in kinds:
        for option in options:
            if option.kind == kind:
                return option.option_id
    return None


def update_event(update: Any) -> StreamEvent:
    """A session/update as a semantic event: its kind, and the text it carries, if any."""
    kind = str(getattr(update, "session_update", "update"))
    text = ""
    if isinstance(update, AgentMessageChunk | AgentThoughtChunk):
        content = update.content
        text = content.text if isinstance(content, TextContentBlock) else ""
    elif isinstance(update, ToolCallStart | ToolCallProgress):
        text = " ".join(part for part in (update.title or "", update.status or "") if part)
    return StreamEvent(type=kind, text=text)


# --- options --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcpOptions:
    argv: tuple[str, ...]
    program: str
    env: Mapping[str, str]
    cwd: str | None
    call_env: frozenset[str]
    cwd_roots: tuple[str, ...]
    timeout_seconds: float
    startup_timeout_seconds: float
    client_fs: str
    permission_tool: str
    output_cap_bytes: int
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES

    @property
    def accepted_settings(self) -> frozenset[str]:
        return ALWAYS_ACCEPTED_SETTINGS | {
            name for name, allowed in (("env", self.call_env), ("cwd", self.cwd_roots)) if allowed
        }

    def client_capabilities(self) -> ClientCapabilities:
        return ClientCapabilities(
            fs=FileSystemCapabilities(
                read_text_file=self.client_fs != "none", write_text_file=self.client_fs == "read-write"
            ),
            terminal=False,
        )


def read_options(spec: AdapterSpec) -> AcpOptions:
    reader = OptionReader(spec, spec.options)
    argv = reader.raw("argv")
    if not isinstance(argv, list) or not argv:
        reader.fail("argv", f"must be a non-empty list of strings, not {type_name(argv)}")
    for index, element in enumerate(argv):
        if not isinstance(element, str) or "\0" in element:
            reader.fail(f"argv[{index}]", f"must be a string without NUL bytes, not {element!r}")
    program = resolve_program(argv[0]) if argv[0] else None
    if program is None:
        reader.fail("argv[0]", f'"{argv[0]}" is not an executable file (looked up on the negotiator\'s PATH)')
    env = reader.string_map("env")
    cwd = reader.string("cwd")
    if cwd is not None and (not os.path.isabs(cwd) or not os.path.isdir(cwd)):
        reader.fail("cwd", f'"{cwd}" is not an existing absolute directory')
    call_env = _read_call_env(reader)
    cwd_roots = _read_cwd_roots(reader)
    timeout = reader.positive_number("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    startup = reader.positive_number("startup_timeout_seconds", DEFAULT_STARTUP_TIMEOUT_SECONDS)
    assert timeout is not None  # it has a default
    assert startup is not None  # it has a default
    client_fs = reader.string("client_fs", default="none")
    if client_fs not in CLIENT_FS_MODES:
        reader.fail("client_fs", f"must be one of {', '.join(CLIENT_FS_MODES)}, not {client_fs!r}")
    permission_tool = reader.string("permission_tool", default=DEFAULT_PERMISSION_TOOL)
    assert permission_tool is not None  # it has a default
    cap = reader.positive_int("output_cap_bytes", DEFAULT_OUTPUT_CAP_BYTES)
    max_line = reader.positive_int("max_line_bytes", DEFAULT_MAX_LINE_BYTES)
    reader.finish()
    return AcpOptions(
        argv=tuple(argv),
        program=program,
        env=MappingProxyType(env),
        cwd=os.path.realpath(cwd) if cwd is not None else None,
        call_env=call_env,
        cwd_roots=cwd_roots,
        timeout_seconds=timeout,
        startup_timeout_seconds=startup,
        client_fs=client_fs,
        permission_tool=permission_tool,
        output_cap_bytes=cap,
        max_line_bytes=max_line,
    )


# --- the ACP client side of one agent process -----------------------------------------------


class _Tail:
    """The last STDERR_TAIL_BYTES of a stream, read to EOF."""

    def __init__(self) -> None:
        self.data = bytearray()

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            self.data += chunk
            del self.data[: max(0, len(self.data) - STDERR_TAIL_BYTES)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace").strip()


class OutputTooLarge(Exception):
    pass


class _CallClient:
    """The client half of one call: queues updates, answers permissions and file requests."""

    def __init__(self, options: AcpOptions, tools: ToolBox | None, cwd: str, *, events: bool = False) -> None:
        self._options = options
        self._tools = tools
        self._cwd = cwd
        self._events = events  # updates other than message text are queued only when asked for
        self.session_id: str | None = None  # updates of other sessions (none expected) are ignored
        self.collecting = False  # false while a loaded session replays its history
        # Message text as deltas, other updates as events, in the order the agent sent them.
        self.items: asyncio.Queue[StreamDelta | StreamEvent] = asyncio.Queue()
        self._size = 0
        self.overflowed = False

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if not self.collecting or session_id != self.session_id or self.overflowed:
            return
        event = update_event(update)
        self._size += len(event.text.encode()) + len(event.type)
        if self._size > self._options.output_cap_bytes:
            self.overflowed = True
            self.items.put_nowait(event)  # wakes the stream, which then fails the call
            return
        if isinstance(update, AgentMessageChunk) and event.text:
            self.items.put_nowait(StreamDelta(event.text))
        elif self._events:
            self.items.put_nowait(event)

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        allowed, chosen_id = await self._ask(tool_call, options)
        option_id = chosen_option(options, allowed, chosen_id)
        if option_id is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=option_id))

    async def _ask(self, tool_call: ToolCallUpdate, options: list[PermissionOption]) -> tuple[bool, object]:
        if self._tools is None:
            return False, None  # no approval channel: refused
        arguments = {
            "title": tool_call.title or "",
            "kind": tool_call.kind or "other",
            "raw_input": tool_call.raw_input if _is_json(tool_call.raw_input) else None,
            "options": [
                {"option_id": option.option_id, "name": option.name, "kind": option.kind}
                for option in options
            ],
        }
        outcome = await self._tools.call(self._options.permission_tool, arguments)
        if outcome.denied or outcome.error is not None:
            return False, None
        result = outcome.result
        return True, result.get("option_id") if isinstance(result, dict) else None

    def _inside_cwd(self, path: str) -> str:
        real = os.path.realpath(path)
        if not os.path.isabs(path) or os.path.commonpath((self._cwd, real)) != self._cwd:
            raise RequestError.invalid_params({"path": path, "problem": "outside the session's directory"})
        return real

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> ReadTextFileResponse:
        if self._options.client_fs == "none":
            raise RequestError.method_not_found("fs/read_text_file")
        real = self._inside_cwd(path)
        try:
            content = await asyncio.to_thread(_read_text, real, self._options.output_cap_bytes)
        except OSError as exc:
            raise RequestError.resource_not_found(path) from exc
        lines = content.splitlines(keepends=True)
        start = max(0, (line or 1) - 1)
        selected = lines[start : start + limit] if limit is not None else lines[start:]
        return ReadTextFileResponse(content="".join(selected))

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse | None:
        if self._options.client_fs != "read-write":
            raise RequestError.method_not_found("fs/write_text_file")
        real = self._inside_cwd(path)
        try:
            await asyncio.to_thread(_write_text, real, content)
        except OSError as exc:
            raise RequestError.internal_error({"path": path, "problem": exc.strerror}) from exc
        return WriteTextFileResponse()

    async def create_terminal(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("terminal/create")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None


def _scratch(stack: contextlib.ExitStack, prefix: str) -> str:
    """A fresh private directory, removed when `stack` closes (its real path)."""
    return os.path.realpath(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))


def _read_text(path: str, cap: int) -> str:
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.read(cap)


def _write_text(path: str, content: str) -> None:
    with open(path, "w", encoding="utf-8") as file:
        file.write(content)


def _is_json(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


class _CappedNdjson:
    """The SDK's stdio framing (one JSON-RPC message per line) with a cap on one line's bytes.

    An acp.Transport: the connection sends and receives decoded messages through it. A line
    longer than `max_line_bytes` (its newline not counted) is never held whole: reading stops
    there, `too_long` is set and the connection sees the end of the agent's output. A line that
    is not a JSON object is logged and skipped, as the SDK's own reader does.
    """

    def __init__(
        self, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader, max_line_bytes: int
    ) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._max_line_bytes = max_line_bytes
        self._writing = asyncio.Lock()  # one message's bytes are never interleaved with another's
        self.too_long = False

    async def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")
        async with self._writing:
            self._stdin.write(data)
            await self._stdin.drain()

    async def receive(self) -> dict[str, Any] | None:
        while (line := await self._read_line()) is not None:
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if isinstance(message, dict):
                return message
            _LOGGER.warning("the ACP agent wrote a line that is not a JSON-RPC message; skipped")
        return None

    async def close(self) -> None:
        self._stdin.close()

    async def _read_line(self) -> bytes | None:
        """The next line; None at the end of the output, or once a line passes the cap."""
        pieces: list[bytes] = []
        size = 0
        while True:
            ended = True
            try:
                piece = await self._stdout.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                # More than the reader's buffer limit without a newline: take what it holds.
                piece = await self._stdout.readexactly(exc.consumed)
                ended = False
            except asyncio.IncompleteReadError as exc:  # the end of the output
                piece = exc.partial
            size += len(piece.removesuffix(b"\n"))
            if size > self._max_line_bytes:
                self.too_long = True
                return None
            pieces.append(piece)
            if ended:
                return b"".join(pieces) or None


class _Agent:
    """One running agent process and the ACP connection to it."""

    def __init__(self, run: proctree.Run, client: Any, max_line_bytes: int) -> None:
        self.run = run
        process = run.process
        assert process.stdin is not None  # PIPE
        assert process.stdout is not None  # PIPE
        assert process.stderr is not None  # PIPE
        self.stderr = _Tail()
        self._stderr_task = asyncio.ensure_future(self.stderr.drain(process.stderr))
        self.transport = _CappedNdjson(process.stdin, process.stdout, max_line_bytes)
        self.conn = ClientSideConnection(client, self.transport)

    async def gone(self) -> str:
        """Why the agent stopped answering: its exit and the tail of its stderr."""
        await _within(self.run.exited.wait(), _STDERR_DRAIN_SECONDS)
        await _within(asyncio.shield(self._stderr_task), _STDERR_DRAIN_SECONDS)
        code = self.run.returncode
        if code is None:
            how = "closed its output"
        elif code < 0:
            how = f"was killed by signal {-code}"
        else:
            how = f"exited with {code}"
        tail = self.stderr.text()
        return f"the agent {how}: {tail}" if tail else f"the agent {how}"

    async def close(self) -> None:
        """Close the connection, then end the agent's tree; a cancellation meanwhile waits for both."""
        await proctree.to_the_end(self._close())

    async def _close(self) -> None:
        with contextlib.suppress(Exception):
            await _within(self.conn.close(), 1.0)
        await self.run.finish()
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._stderr_task


async def _within(waiting: Awaitable[Any], seconds: float) -> bool:
    """Await `waiting` for at most `seconds` (cancel-safe: no timeout context); whether it finished."""
    task = asyncio.ensure_future(waiting)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
    return bool(done)


async def _start_agent(options: AcpOptions, env: Mapping[str, str], cwd: str, client: Any) -> _Agent:
    run = await proctree.start(
        options.program,
        options.argv,
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return _Agent(run, client, options.max_line_bytes)


# --- the adapter ----------------------------------------------------------------------------


class AcpAdapter:
    """An ACP agent; build it with `await AcpAdapter.start(spec)` (see the module docstring)."""

    implementation = "acp"

    def __init__(
        self,
        options: AcpOptions,
        declaration: Declaration,
        controls: SessionControls | None,
        *,
        resumes: bool,
    ) -> None:
        self._options = options
        self._declaration = declaration
        self._controls = controls
        self._resumes = resumes  # session/resume; otherwise a conversation is continued by session/load

    @classmethod
    async def start(cls, spec: AdapterSpec) -> AcpAdapter:
        """Read the options, ask the agent what it supports, and build the declaration.

        Raises ConfigError when the options are wrong or the agent does not answer `initialize`.
        """
        options = read_options(spec)
        initialized, controls = await _probe(spec.shortname, options)
        code = agent_declaration(spec.shortname, initialized, controls, options.accepted_settings)
        declaration = narrow(code, spec.declaration, shortname=spec.shortname, implementation="acp")
        capabilities = initialized.agent_capabilities
        sessions = capabilities.session_capabilities if capabilities else None
        return cls(options, declaration, controls, resumes=bool(sessions and sessions.resume))

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    async def produce(self, call: AdapterCall) -> AdapterReply:
        check_call(self._declaration, call, CallKind.PRODUCE, implemented=IMPLEMENTED)
        # check_call refuses output_schema already (structured_output is unsupported); the backstop.
        raise errors.AdapterRefused(self._declaration.shortname, "ACP has no output schema")

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        """The streamed call, collected: the deltas are the text, every update is an event."""
        events: list[StreamEvent] = []
        reply: AdapterReply | None = None
        items = self.stream(call, CallKind.INVOKE)
        try:
            async for item in items:
                if isinstance(item, StreamDelta):
                    events.append(StreamEvent(type=MESSAGE_CHUNK, text=item.text))
                elif isinstance(item, StreamEvent):
                    events.append(item)
                else:
                    reply = item
        finally:
            await items.aclose()
        assert reply is not None  # the stream ends with its reply or raises
        return dataclasses.replace(reply, events=tuple(events) if call.options.stream_events else ())

    async def stream(self, call: AdapterCall, kind: CallKind) -> AsyncGenerator[StreamItem, None]:
        """One agent turn as it happens: message text as deltas, other updates as events, the reply.

        Closing this iterator (or cancelling its consumer) sends session/cancel, gives the turn
        CANCEL_GRACE_SECONDS to end and stops the agent's process tree.
        """
        if kind is CallKind.PRODUCE:
            await self.produce(call)  # refused: ACP has no output schema
        check_call(self._declaration, call, CallKind.INVOKE, implemented=IMPLEMENTED)
        shortname = self._declaration.shortname
        if call.tools is not None:
            others = sorted(
                spec.name for spec in call.tools.specs if spec.name != self._options.permission_tool
            )
            if others:
                raise errors.AdapterRefused(
                    shortname,
                    f"an ACP agent cannot see caller tools ({', '.join(others)}); the only tool it takes is "
                    f'"{self._options.permission_tool}", which answers its permission requests',
                )
        self._check_controls(call)
        cwd, env, timeout, source = self._run_settings(call.options.settings)
        deadline = call_deadline(shortname, call.time_budget, timeout, source)
        if "\0" in call.prompt:
            raise errors.AdapterRefused(shortname, "the prompt contains a NUL byte")
        with contextlib.ExitStack() as stack:
            if cwd is None:
                cwd = _scratch(stack, "acp-session-")
            client = _CallClient(self._options, call.tools, cwd, events=call.options.stream_events)
            try:
                agent = await _start_agent(self._options, env, cwd, client)
            except (OSError, ValueError) as exc:
                raise errors.AdapterMisconfigured(
                    shortname, f'cannot run "{self._options.program}": {exc}'
                ) from exc
            texts: list[str] = []
            try:
                work = asyncio.ensure_future(self._converse(agent, client, call, cwd))
                loop = asyncio.get_running_loop()
                when = None if deadline.seconds is None else loop.time() + deadline.seconds
                try:
                    while not (work.done() and client.items.empty()):
                        item = await self._next_item(client, work, when)
                        if client.overflowed:
                            await self._cancel_turn(agent, client, work)
                            raise errors.AdapterInternal(
                                shortname,
                                "the agent's output exceeded "
                                f"output_cap_bytes={self._options.output_cap_bytes}",
                            )
                        if item is None and not work.done():
                            raise await self._timed_out(agent, client, work, deadline)
                        if item is not None:
                            if isinstance(item, StreamDelta):
                                texts.append(item.text)
                            yield item
                except (asyncio.CancelledError, GeneratorExit):
                    await self._cancel_turn(agent, client, work)
                    raise
                try:
                    stop_reason, session_id = work.result()
                except (ConnectionError, asyncio.IncompleteReadError, BrokenPipeError) as exc:
                    if agent.transport.too_long:
                        raise errors.AdapterReplyTooLarge(
                            shortname,
                            "the agent wrote a line longer than "
                            f"max_line_bytes={self._options.max_line_bytes}; it was stopped",
                        ) from exc
                    raise errors.AdapterUnavailable(shortname, await agent.gone()) from exc
                except RequestError as exc:
                    raise self._agent_error(exc) from exc
            finally:
                await agent.close()
        if stop_reason == "refusal":
            raise errors.AdapterRefused(shortname, "the agent refused to continue (stop reason: refusal)")
        state = (
            {"session_id": session_id}
            if self._declaration.state(Capability.STATEFUL_HISTORY) is CapabilityState.SUPPORTED
            else None
        )
        yield AdapterReply(text="".join(texts), conversation_state=state)

    async def _next_item(
        self, client: _CallClient, work: asyncio.Future[Any], when: float | None
    ) -> StreamDelta | StreamEvent | None:
        """The next queued update; None when the turn ended with nothing queued, or at `when`.

        Updates the agent sent before its prompt answer are queued before that answer resolves
        `work` (the connection reads its input in order), so a done `work` with an empty queue
        has delivered every update of the turn.
        """
        if not client.items.empty():
            return client.items.get_nowait()
        if work.done():
            return None
        getter = asyncio.ensure_future(client.items.get())
        try:
            remaining = None if when is None else max(0.0, when - asyncio.get_running_loop().time())
            await asyncio.wait({getter, work}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return client.items.get_nowait() if not client.items.empty() else None

    async def _timed_out(
        self, agent: _Agent, client: _CallClient, work: asyncio.Future[Any], deadline: Deadline
    ) -> errors.AdapterTimeout:
        prompted = client.collecting
        stopped = await self._cancel_turn(agent, client, work)
        if not prompted:
            how = "the agent had not started the turn yet"
        elif stopped:
            how = "the agent ended its turn on session/cancel"
        else:
            how = f"the agent did not end its turn within {CANCEL_GRACE_SECONDS:g} s of session/cancel"
        return errors.AdapterTimeout(
            self._declaration.shortname, f"no answer within {deadline.seconds:g} s ({deadline.limit}); {how}"
        )

    async def close(self) -> None:
        return None

    def _refuse(self, setting: str, problem: str) -> errors.AdapterRefused:
        return errors.AdapterRefused(self._declaration.shortname, f"setting {setting}: {problem}")

    def _check_controls(self, call: AdapterCall) -> None:
        """Refuse a model, effort or profile the agent's session does not offer, before it starts."""
        controls = self._controls
        if controls is None:
            return  # UNKNOWN, allowed by the caller: the agent itself judges the value
        checks = (
            ("model", call.options.model, controls.model_values),
            ("effort", call.options.effort, controls.effort_values),
            ("profile", call.options.profile, controls.modes),
        )
        for name, value, offered in checks:
            if value is not None and value not in offered:
                raise errors.AdapterRefused(
                    self._declaration.shortname,
                    f"{name} {value!r} is not one the agent offers ({', '.join(sorted(offered))})",
                )

    def _run_settings(
        self, settings: Mapping[str, JsonValue]
    ) -> tuple[str | None, dict[str, str], float, str]:
        accepted = self._options.accepted_settings
        for name in settings:
            if name not in accepted:
                raise self._refuse(name, f"not one of {', '.join(sorted(accepted))}")
        cwd = self._options.cwd
        if "cwd" in settings:
            value = settings["cwd"]
            if not isinstance(value, str) or not value or "\0" in value:
                raise self._refuse("cwd", "must be a directory path")
            real = os.path.realpath(value)
            if not any(os.path.commonpath((root, real)) == root for root in self._options.cwd_roots):
                raise self._refuse("cwd", f"{value!r} is not inside the adapter's cwd_roots")
            if not os.path.isdir(real):
                raise self._refuse("cwd", f"{value!r} is not an existing directory")
            cwd = real
        call_env: dict[str, str] = {}
        if "env" in settings:
            value = settings["env"]
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) and "\0" not in v for k, v in value.items()
            ):
                raise self._refuse("env", "must be a mapping of names to strings")
            for name in value:
                if is_loader_variable(name):
                    raise self._refuse(
                        "env", f"{name} is a loader or search-path variable, which no call may set"
                    )
                if name not in self._options.call_env:
                    allowed = ", ".join(sorted(self._options.call_env))
                    raise self._refuse("env", f"{name} is not one of the adapter's call_env ({allowed})")
            call_env = dict(value)
        timeout, source = self._options.timeout_seconds, "the adapter's timeout_seconds"
        if "timeout" in settings:
            value = settings["timeout"]
            if not is_number(value) or not 0 < value <= self._options.timeout_seconds:
                raise self._refuse(
                    "timeout", f"must be a number of seconds in (0, {self._options.timeout_seconds:g}]"
                )
            timeout, source = float(value), "the call's timeout setting"
        return cwd, minimal_env(self._options.env, call_env), timeout, source

    def _agent_error(self, exc: RequestError) -> errors.AdapterFailure:
        shortname = self._declaration.shortname
        detail = f"{exc}"
        if exc.data:
            detail += f" ({exc.data})"
        if exc.code in (-32602, -32601):  # invalid params, method not found: what this call asked for
            return errors.AdapterRefused(shortname, f"the agent refused the request: {detail}")
        return errors.AdapterInternal(shortname, f"the agent answered with an error: {detail}")

    async def _converse(
        self, agent: _Agent, client: _CallClient, call: AdapterCall, cwd: str
    ) -> tuple[str, str]:
        """initialize, a session, its settings, the prompt: the stop reason and the session id."""
        conn = agent.conn
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=self._options.client_capabilities(),
            client_info=CLIENT_INFO,
        )
        servers = acp_mcp_servers(call.options.mcp_servers)
        previous = (
            call.conversation_state.get("session_id") if isinstance(call.conversation_state, dict) else None
        )
        if isinstance(previous, str) and previous:
            session_id = previous
            await self._reopen(conn, previous, cwd, servers)
        else:
            session = await conn.new_session(cwd=cwd, mcp_servers=servers)
            session_id = session.session_id
        client.session_id = session_id
        options = call.options
        controls = self._controls
        if options.profile is not None:
            await conn.set_session_mode(session_id=session_id, mode_id=options.profile)
        if options.model is not None and controls is not None and controls.model_option is not None:
            await conn.set_config_option(
                config_id=controls.model_option, session_id=session_id, value=options.model
            )
        if options.effort is not None and controls is not None and controls.effort_option is not None:
            await conn.set_config_option(
                config_id=controls.effort_option, session_id=session_id, value=options.effort
            )
        client.collecting = True
        response = await conn.prompt(session_id=session_id, prompt=[text_block(call.prompt)])
        return str(response.stop_reason), session_id

    async def _reopen(
        self, conn: ClientSideConnection, session_id: str, cwd: str, servers: list[Any]
    ) -> None:
        """Continue a conversation's ACP session: resumed where the agent can, else loaded.

        A loaded session replays its history as updates; they arrive before `collecting` is set,
        so they are not part of this call's reply.
        """
        if self._resumes:
            await conn.resume_session(session_id=session_id, cwd=cwd, mcp_servers=servers)
        else:
            await conn.load_session(session_id=session_id, cwd=cwd, mcp_servers=servers)

    async def _cancel_turn(self, agent: _Agent, client: _CallClient, work: asyncio.Future[Any]) -> bool:
        """Send session/cancel and give the turn CANCEL_GRACE_SECONDS to end; whether it did."""
        if client.session_id is not None and client.collecting:
            with contextlib.suppress(Exception):
                await _within(agent.conn.cancel(session_id=client.session_id), 1.0)
            await _within(asyncio.shield(work), CANCEL_GRACE_SECONDS)
        stopped = work.done()
        work.cancel()
        with contextlib.suppress(BaseException):
            await _within(asyncio.shield(work), 1.0)
        return stopped


async def _probe(shortname: str, options: AcpOptions) -> tuple[InitializeResponse, SessionControls | None]:
    """Start the agent once: its `initialize` answer, and what a fresh session offers (None: none)."""
    with contextlib.ExitStack() as stack:
        cwd = options.cwd or _scratch(stack, "acp-probe-")
        client = _CallClient(options, None, cwd)
        try:
            agent = await _start_agent(options, minimal_env(options.env), cwd, client)
        except (OSError, ValueError) as exc:
            raise errors.ConfigError(f'adapter "{shortname}": cannot run "{options.program}": {exc}') from exc
        try:
            task = asyncio.ensure_future(
                agent.conn.initialize(
                    protocol_version=PROTOCOL_VERSION,
                    client_capabilities=options.client_capabilities(),
                    client_info=CLIENT_INFO,
                )
            )
            done, _ = await asyncio.wait({task}, timeout=options.startup_timeout_seconds)
            if not done:
                task.cancel()
                raise errors.ConfigError(
                    f'adapter "{shortname}": the agent did not answer initialize within '
                    f"{options.startup_timeout_seconds:g} s (startup_timeout_seconds)"
                )
            try:
                initialized = task.result()
            except (ConnectionError, RequestError, ValueError) as exc:
                why = await agent.gone() if isinstance(exc, ConnectionError) else str(exc)
                raise errors.ConfigError(f'adapter "{shortname}": initialize failed: {why}') from exc
            controls: SessionControls | None = None
            session = asyncio.ensure_future(agent.conn.new_session(cwd=cwd, mcp_servers=[]))
            opened, _ = await asyncio.wait({session}, timeout=options.startup_timeout_seconds)
            if opened and session.exception() is None:
                controls = session_controls(session.result())
            else:
                session.cancel()
            return initialized, controls
        finally:
            await agent.close()
