"""The MCP servers of one call, with the official `mcp` SDK: start, initialize, list, call, close.

Lifetime: every server of a call is connected when the adapter's tool loop
starts and closed when it ends, however it ends (answer, error, deadline,
the caller's cancellation). Nothing is pooled or shared between calls, so
one call's server state (a stdio child, an HTTP session id) never reaches
another call.

Transports:
- stdio: the command runs under `agentsidecar.sidecar_runtime.proctree` (its whole
  process tree is killed when the call ends, and with the negotiator), with
  the SDK's default inherited environment (HOME, LOGNAME, PATH, SHELL, TERM,
  USER) plus the server's `env`; its stderr is the negotiator's. The SDK's
  `stdio_client` spawns its own process and takes none from outside, so the
  transport here is the SDK's line framing over the contained process.
  A line longer than MAX_STDIO_LINE_BYTES ends the connection.
- http (streamable HTTP) and sse: the SDK's clients, with the server's
  `headers` on every request.

Starting a server (connect, `initialize`, every page of `tools/list`) has
START_TIMEOUT_SECONDS, within the call's own deadline. Failing that is
McpServerTimeout (DEADLINE_EXCEEDED); a server that cannot be started or
reached, or that answers initialize or tools/list with an error, is
McpServerUnavailable (UNAVAILABLE); either fails the whole call. A tool
call's own failure (an `isError` result, a JSON-RPC error, a stdio server
that went away) is a tool error the model reads; the call goes on.

A streamable-HTTP connection that breaks (a request that cannot connect, a
reply stream cut off) fails the whole call with McpServerUnavailable naming
the server (an sse server's is a tool error, as a stdio server's). The SDK's
streamable-HTTP client
cannot go on after one: a request that fails to connect fails its task
group, which cancels the task the call runs in, and a reply stream cut off
without an event id is dropped silently, leaving its request unanswered
for ever. So the negotiator watches every request of the server's HTTP
client, and a tools/call, initialize or tools/list waiting on a server
whose connection broke ends at once instead of waiting out the deadline.

The SDK's transports run in anyio task groups, which wrap whatever leaves
them in an ExceptionGroup, the call's own errors included: leaving a
server, an error of the call (an adapter error, a cancellation) goes on as
it was raised, and a group whose every leaf is a transport failure (httpx,
anyio stream or OS errors) is McpServerUnavailable. Closing a streamable-HTTP
session (its DELETE) has CLOSE_TIMEOUT_SECONDS, so a server that never
answers it cannot hold a finished or cancelled call.

`notifications/tools/list_changed` marks the server's listing stale; the
tool loop re-lists it before its next request to the model (`refresh`).
A tool keeps its function name across re-listings.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import os
import shutil
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from agentsidecar.negotiator_service import mcp_policy
from agentsidecar.negotiator_service.errors import McpServerTimeout, McpServerUnavailable
from agentsidecar.negotiator_service.model import JsonValue, McpServer, ToolOutcome, ToolSpec
from agentsidecar.negotiator_service.negotiation import normalize_transport
from agentsidecar.sidecar_runtime import proctree

# The SDK (and the anyio, httpx, jsonschema and pydantic it runs on) is imported by the functions
# that use it: a negotiator whose calls name no MCP server never loads it.
if TYPE_CHECKING:
    import httpx
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp import ClientSession, types
    from mcp.shared.message import SessionMessage

    ReadStream = MemoryObjectReceiveStream[SessionMessage | Exception]
    WriteStream = MemoryObjectSendStream[SessionMessage]

_T = TypeVar("_T")

START_TIMEOUT_SECONDS = 10.0
CLOSE_TIMEOUT_SECONDS = 2.0
MAX_LIST_PAGES = 64
MAX_TOOLS_PER_SERVER = 512
MAX_STDIO_LINE_BYTES = 8 * 1024 * 1024
_READ_CHUNK = 64 * 1024
_LOGGER = logging.getLogger("agentsidecar.negotiator_service.mcp")


@functools.cache
def _http_timeout() -> httpx.Timeout:
    """The SDK's own defaults for its HTTP transports: 30 s per operation, 300 s for a held stream."""
    import httpx

    return httpx.Timeout(30.0, read=300.0)


@functools.cache
def _close_timeout() -> httpx.Timeout:
    import httpx

    return httpx.Timeout(CLOSE_TIMEOUT_SECONDS)


@functools.cache
def _transport_failures() -> tuple[type[BaseException], ...]:
    """What a transport raises when its server went away or broke the exchange."""
    import anyio
    import httpx

    return (
        httpx.HTTPError,
        anyio.ClosedResourceError,
        anyio.BrokenResourceError,
        anyio.EndOfStream,
        OSError,
    )


@functools.cache
def _client_info() -> types.Implementation:
    from mcp import types

    return types.Implementation(name="agentsidecar-negotiator", version="0.1.0")


@dataclass(frozen=True, slots=True)
class McpTool:
    """One tool of one server, as offered to the model."""

    server: str
    tool: str  # the name the server knows it by
    spec: ToolSpec  # the function name the model sees, schema, description, risk
    preapproved: bool


@dataclass(slots=True)
class _Watch:
    """The first transport error of one server's HTTP client, set by its transport (`_watching`)."""

    failure: BaseException | None = None
    broken: asyncio.Event = field(default_factory=asyncio.Event)

    def broke(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.broken.set()


@dataclass(slots=True)
class _Connection:
    server: McpServer
    session: ClientSession
    watch: _Watch | None  # None: not an HTTP client the negotiator watches (stdio, sse)
    stale: bool = False
    tools: dict[str, McpTool] = field(default_factory=dict)  # by function name


class McpTools:
    """The MCP tools of one call, across its servers (build with `open_servers`)."""

    def __init__(self, adapter: str, reserved: Iterable[str]) -> None:
        self._adapter = adapter
        self._reserved = frozenset(reserved)
        self._connections: dict[str, _Connection] = {}
        # (server, tool) → function name, kept across re-listings.
        self._names: dict[tuple[str, str], str] = {}

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(t.spec for c in self._connections.values() for t in c.tools.values())

    def tool(self, name: str) -> McpTool | None:
        for connection in self._connections.values():
            found = connection.tools.get(name)
            if found is not None:
                return found
        return None

    async def refresh(self) -> None:
        """Re-list every server that said its tools changed."""
        for connection in self._connections.values():
            if connection.stale:
                connection.stale = False
                await self._list(connection)

    async def call(self, name: str, arguments: JsonValue) -> ToolOutcome:
        """Run `tools/call`; every failure is a tool error for the model."""
        from mcp.shared.exceptions import McpError

        found = self.tool(name)
        if found is None:
            return ToolOutcome(error=f'there is no tool named "{name}" in this call')
        if not isinstance(arguments, dict):
            return ToolOutcome(error=f'the arguments of "{name}" must be a JSON object; the tool did not run')
        connection = self._connections[found.server]
        where = f'MCP server "{found.server}"'
        try:
            result = await self._unless_broken(
                connection, connection.session.call_tool(found.tool, arguments), f'tools/call "{found.tool}"'
            )
        except McpServerUnavailable:
            raise
        except McpError as exc:
            return ToolOutcome(error=f"{where} answered tools/call with an error: {exc.error.message}")
        except Exception as exc:  # a broken connection, a malformed answer
            return ToolOutcome(error=f"{where} failed the call: {_describe(exc)}")
        if result.isError:
            return ToolOutcome(
                error=_content_text(result.content) or f'"{found.tool}" failed without a message'
            )
        if result.structuredContent is not None:
            return ToolOutcome(result=result.structuredContent)
        return ToolOutcome(result=_content_json(result.content))

    async def _connect(self, stack: contextlib.AsyncExitStack, server: McpServer) -> None:
        from mcp import types
        from mcp.shared.exceptions import McpError

        connection: _Connection | None = None

        async def on_message(message: Any) -> None:
            if (
                connection is not None
                and isinstance(message, types.ServerNotification)
                and isinstance(message.root, types.ToolListChangedNotification)
            ):
                connection.stale = True

        guard = _Guarded(self._adapter, server.name, _session(server, stack, on_message))
        try:
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                session, watch = await stack.enter_async_context(guard)
                connection = _Connection(server, session, watch)
                await self._unless_broken(connection, session.initialize(), "initialize")
                await self._list(connection)
        except TimeoutError as exc:
            raise McpServerTimeout(
                self._adapter,
                f"did not finish initialize and tools/list within {START_TIMEOUT_SECONDS:g} s",
                server=server.name,
            ) from exc
        except McpServerUnavailable:
            raise
        except McpError as exc:
            raise McpServerUnavailable(
                self._adapter, f"answered with an error: {exc.error.message}", server=server.name
            ) from exc
        except Exception as exc:
            raise McpServerUnavailable(
                self._adapter, f"cannot start: {_describe(exc)}", server=server.name
            ) from exc
        guard.started = True
        self._connections[server.name] = connection

    async def _unless_broken(self, connection: _Connection, work: Coroutine[Any, Any, _T], what: str) -> _T:
        """`work`'s result or error, unless the server's HTTP connection breaks first.

        The SDK leaves a request whose reply stream was cut off unanswered, so
        the wait ends on the watch's break too: McpServerUnavailable.
        """
        watch = connection.watch
        if watch is None:
            return await work
        if watch.broken.is_set():
            work.close()
            raise self._broken(connection.server.name, what, watch)
        task = asyncio.ensure_future(work)
        broken = asyncio.ensure_future(watch.broken.wait())
        try:
            await asyncio.wait((task, broken), return_when=asyncio.FIRST_COMPLETED)
        finally:
            broken.cancel()
            if not task.done():
                task.cancel()
                # Ended before this returns, so nothing of the request outlives the wait.
                await asyncio.wait((task,))
        # A request's own error while its connection broke is the break's doing.
        if not task.cancelled() and (task.exception() is None or watch.failure is None):
            return task.result()
        raise self._broken(connection.server.name, what, watch)

    def _broken(self, server: str, what: str, watch: _Watch) -> McpServerUnavailable:
        cause = _describe(watch.failure) if watch.failure is not None else "no error recorded"
        return McpServerUnavailable(
            self._adapter, f"the connection broke during {what}: {cause}", server=server
        )

    async def _list(self, connection: _Connection) -> None:
        from mcp import types

        from agentsidecar.negotiator_service.tools import tool_schema

        server = connection.server
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            page = await self._unless_broken(
                connection, connection.session.list_tools(params=params), "tools/list"
            )
            listed.extend(page.tools)
            if len(listed) > MAX_TOOLS_PER_SERVER:
                raise McpServerUnavailable(
                    self._adapter, f"lists more than {MAX_TOOLS_PER_SERVER} tools", server=server.name
                )
            cursor = page.nextCursor
            if not cursor:
                break
        else:
            raise McpServerUnavailable(
                self._adapter, f"tools/list did not end within {MAX_LIST_PAGES} pages", server=server.name
            )
        risks = mcp_policy.risks_of(server)
        tools: dict[str, McpTool] = {}
        for tool in listed:
            schema, problems = tool_schema(json.dumps(tool.inputSchema))
            if schema is None:
                _LOGGER.warning(
                    'MCP server "%s": tool "%s" is not offered, its inputSchema is invalid: %s',
                    server.name,
                    tool.name,
                    "; ".join(problems),
                )
                continue
            name = self._function_name(server.name, tool.name)
            annotations = tool.annotations
            risk = mcp_policy.tool_risk(
                annotations.readOnlyHint if annotations is not None else None,
                annotations.destructiveHint if annotations is not None else None,
                risks.get(tool.name),
            )
            spec = ToolSpec(
                name=name,
                arguments_schema=MappingProxyType(schema),
                description=tool.description
                or (annotations.title if annotations and annotations.title else ""),
                metadata=MappingProxyType({"mcp_server": server.name, "mcp_tool": tool.name}),
                risk=risk,
            )
            tools[name] = McpTool(
                server.name, tool.name, spec, server.operator and tool.name in server.preapproved
            )
        connection.tools = tools

    def _function_name(self, server: str, tool: str) -> str:
        key = (server, tool)
        name = self._names.get(key)
        if name is None:
            name = mcp_policy.function_name(server, tool, [*self._reserved, *self._names.values()])
            self._names[key] = name
        return name


@contextlib.asynccontextmanager
async def open_servers(
    servers: Sequence[McpServer], adapter: str, reserved: Iterable[str] = ()
) -> AsyncIterator[McpTools]:
    """Connect every server (in order), yield their tools, close them all on the way out.

    `reserved` are names the function names must avoid (the caller's tools).
    """
    tools = McpTools(adapter, reserved)
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            await tools._connect(stack, server)
        yield tools


class _Guarded(Generic[_T]):
    """A server's session and transport, leaving by the errors its task groups' exception groups hold.

    anyio task groups wrap every exception that leaves them, the one their
    body raised included. On the way out: the body's own error, or an outside
    cancellation, goes on as it was raised; a group of transport failures
    only is McpServerUnavailable naming the server; anything else goes on.
    """

    def __init__(
        self,
        adapter: str,
        server: str,
        inner: contextlib.AbstractAsyncContextManager[_T],
    ) -> None:
        self._adapter = adapter
        self._server = server
        self._inner = inner
        self.started = False  # initialize and tools/list answered

    async def __aenter__(self) -> _T:
        return await self._inner.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        try:
            return bool(await self._inner.__aexit__(exc_type, exc, traceback))
        except BaseException as raised:
            if raised is exc:
                raise
            leaves = list(_leaves(raised))
            if exc is not None and (_cancelled_from_outside(exc) or any(leaf is exc for leaf in leaves)):
                return False
            if leaves and all(isinstance(leaf, _transport_failures()) for leaf in leaves):
                phase = "the connection broke" if self.started else "cannot start"
                raise McpServerUnavailable(
                    self._adapter, f"{phase}: {_describe(raised)}", server=self._server
                ) from raised
            raise


def _cancelled_from_outside(exc: BaseException) -> bool:
    """A cancellation of the task itself, not one the transport's task group made and took back."""
    task = asyncio.current_task()
    return isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


@contextlib.asynccontextmanager
async def _session(
    server: McpServer, stack: contextlib.AsyncExitStack, on_message: Any
) -> AsyncIterator[tuple[ClientSession, _Watch | None]]:
    from mcp import ClientSession

    async with (
        _transport(server, stack) as (read, write, watch),
        ClientSession(read, write, message_handler=on_message, client_info=_client_info()) as session,
    ):
        yield session, watch


@contextlib.asynccontextmanager
async def _transport(
    server: McpServer, stack: contextlib.AsyncExitStack
) -> AsyncIterator[tuple[ReadStream, WriteStream, _Watch | None]]:
    transport = normalize_transport(server.transport)
    if transport == "stdio":
        async with _stdio(server) as (read, write):
            yield read, write, None
        return
    import httpx
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    if transport == "http":
        watch = _Watch()
        client = await stack.enter_async_context(
            httpx.AsyncClient(
                headers=dict(server.headers),
                timeout=_http_timeout(),
                follow_redirects=False,
                transport=_watching(watch),
            )
        )
        async with streamable_http_client(server.url, http_client=client) as (read, write, _):
            try:
                yield read, write, watch
            finally:
                # What is left is the session's DELETE, sent as the SDK's client closes.
                client.timeout = _close_timeout()
        return

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        auth: httpx.Auth | None = None,
    ) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers=headers, timeout=timeout or _http_timeout(), auth=auth, follow_redirects=False
        )

    async with sse_client(server.url, headers=dict(server.headers), httpx_client_factory=factory) as (
        read,
        write,
    ):
        yield read, write, None


def _watching(watch: _Watch) -> httpx.AsyncBaseTransport:
    """httpx's transport, telling `watch` of every request that fails and every POST reply cut off."""
    return _watching_class()(watch)


@functools.cache
def _watching_class() -> Callable[[_Watch], httpx.AsyncBaseTransport]:
    import httpx

    class WatchedReply(httpx.AsyncByteStream):
        def __init__(self, inner: httpx.AsyncByteStream, watch: _Watch) -> None:
            self._inner = inner
            self._watch = watch

        async def __aiter__(self) -> AsyncIterator[bytes]:
            try:
                async for chunk in self._inner:
                    yield chunk
            except httpx.TransportError as exc:
                self._watch.broke(exc)
                raise

        async def aclose(self) -> None:
            await self._inner.aclose()

    class WatchingTransport(httpx.AsyncBaseTransport):
        def __init__(self, watch: _Watch) -> None:
            # What httpx.AsyncClient builds when given no transport.
            self._inner = httpx.AsyncHTTPTransport()
            self._watch = watch

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            try:
                response = await self._inner.handle_async_request(request)
            except httpx.TransportError as exc:
                self._watch.broke(exc)
                raise
            # A POST's reply carries the answers; the GET stream the SDK reopens by itself.
            if request.method == "POST" and isinstance(response.stream, httpx.AsyncByteStream):
                response.stream = WatchedReply(response.stream, self._watch)
            return response

        async def aclose(self) -> None:
            await self._inner.aclose()

    return WatchingTransport


@contextlib.asynccontextmanager
async def _stdio(server: McpServer) -> AsyncIterator[tuple[ReadStream, WriteStream]]:
    import anyio
    from mcp import types
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError

    env = {**get_default_environment(), **server.env}
    program = _program(server.command, env.get("PATH", os.defpath))
    run = await proctree.start(
        program,
        [server.command, *server.args],
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=None,
    )
    stdin, stdout = run.process.stdin, run.process.stdout
    assert stdin is not None
    assert stdout is not None
    read_sender, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_receiver = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_lines() -> None:
        async with read_sender:
            buffer = bytearray()
            while chunk := await stdout.read(_READ_CHUNK):
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if not line.strip():
                        continue
                    try:
                        message = types.JSONRPCMessage.model_validate_json(line)
                    except ValidationError as exc:
                        await read_sender.send(exc)
                        continue
                    await read_sender.send(SessionMessage(message))
                if len(buffer) > MAX_STDIO_LINE_BYTES:
                    await read_sender.send(
                        ValueError(f"the server wrote a line longer than {MAX_STDIO_LINE_BYTES} bytes")
                    )
                    return

    async def write_lines() -> None:
        async with write_receiver:
            async for message in write_receiver:
                text = message.message.model_dump_json(by_alias=True, exclude_none=True)
                try:
                    stdin.write(text.encode() + b"\n")
                    await stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    return

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read_lines)
            group.start_soon(write_lines)
            try:
                yield read_stream, write_stream
            finally:
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            stdin.close()
            await run.finish()
            for stream in (read_stream, write_stream):
                await stream.aclose()


def _program(command: str, path: str) -> str:
    """The absolute program a command names, looked up on the server's PATH as a shell would."""
    program = shutil.which(command, path=path)
    if program is None:
        raise FileNotFoundError(errno.ENOENT, f'"{command}" is not an executable on PATH')
    return os.path.abspath(program)


def _content_text(content: Sequence[types.ContentBlock]) -> str:
    from mcp import types

    return "\n".join(block.text for block in content if isinstance(block, types.TextContent))


def _content_json(content: Sequence[types.ContentBlock]) -> JsonValue:
    """A result's content for the model: the text when it is all text, else the blocks as JSON."""
    from mcp import types

    if all(isinstance(block, types.TextContent) for block in content):
        return _content_text(content)
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in content]


def _describe(exc: BaseException) -> str:
    """An exception as one line, looking inside the task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
