"""A small ACP agent written with the SDK's agent side, for the acp adapter's deterministic tests.

Run as `python fake_acp_agent.py`; it speaks ACP on stdin/stdout. Every request it receives is
appended to the JSON-lines file named by FAKE_ACP_LOG (method and params). Sessions are kept in
the JSON file FAKE_ACP_SESSIONS, so a later process can resume them, as a real agent's session
store does. FAKE_ACP_CAPABILITIES (JSON) replaces the agentCapabilities it announces.

What a prompt makes it do:

    echo:TEXT        a thought, a tool call, then TEXT as two message chunks
    history          "turn N" where N counts this session's prompts, across processes
    permission       asks the client's permission to run `rm -rf build`; replies with the outcome
    read:PATH        reads PATH through the client's fs/read_text_file; replies with its text
    slow:N           N message chunks 200 ms apart, each "chunk I at T\n" (T: its monotonic time),
                     with a tool call update after the first
    hang             waits for session/cancel, then ends the turn as cancelled
    ignore-cancel    waits forever, even through session/cancel
    crash            writes a line to stderr and exits with status 3
    long-line:N      writes one line of N bytes straight to its stdout (a JSON-RPC notification
                     padded with spaces), then waits like `hang`
    anything else    "ok"
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import sys
import time
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    start_tool_call,
    update_agent_message_text,
    update_agent_thought_text,
)
from acp.schema import (
    AgentCapabilities,
    Implementation,
    LoadSessionResponse,
    McpCapabilities,
    PermissionOption,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionConfigOptionSelect,
    SessionConfigSelectOption,
    SessionMode,
    SessionModeState,
    SessionResumeCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    ToolCallUpdate,
)


def log(method: str, params: Any) -> None:
    path = os.environ.get("FAKE_ACP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps({"method": method, "params": params}, default=str) + "\n")


def sessions() -> dict[str, int]:
    path = os.environ.get("FAKE_ACP_SESSIONS")
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as file:
        loaded: dict[str, int] = json.load(file)
        return loaded


def save_sessions(known: dict[str, int]) -> None:
    path = os.environ.get("FAKE_ACP_SESSIONS")
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(known, file)


def dump(value: Any) -> Any:
    if isinstance(value, list):
        return [dump(item) for item in value]
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


class FakeAgent:
    def __init__(self) -> None:
        self._conn: Any = None
        self._cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Any) -> None:
        self._conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        log("initialize", {"protocol_version": protocol_version, **{k: dump(v) for k, v in kwargs.items()}})
        announced = os.environ.get("FAKE_ACP_CAPABILITIES")
        capabilities = (
            AgentCapabilities.model_validate(json.loads(announced))
            if announced
            else AgentCapabilities(
                load_session=True,
                mcp_capabilities=McpCapabilities(http=True, sse=False),
                session_capabilities=SessionCapabilities(resume=SessionResumeCapabilities()),
            )
        )
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=capabilities,
            agent_info=Implementation(name="fake-acp-agent", version="1.0.0"),
        )

    def _session_answer(self) -> dict[str, Any]:
        return {
            "modes": SessionModeState(
                current_mode_id="ask",
                available_modes=[SessionMode(id="ask", name="Ask"), SessionMode(id="code", name="Code")],
            ),
            "config_options": [
                SessionConfigOptionSelect(
                    id="model",
                    name="Model",
                    category="model",
                    type="select",
                    current_value="fake-small",
                    options=[
                        SessionConfigSelectOption(value="fake-small", name="Small"),
                        SessionConfigSelectOption(value="fake-large", name="Large"),
                    ],
                ),
                SessionConfigOptionSelect(
                    id="reasoning",
                    name="Reasoning",
                    category="thought_level",
                    type="select",
                    current_value="low",
                    options=[
                        SessionConfigSelectOption(value="low", name="Low"),
                        SessionConfigSelectOption(value="high", name="High"),
                    ],
                ),
            ],
        }

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        log("session/new", {"cwd": cwd, "mcp_servers": dump(mcp_servers or [])})
        known = sessions()
        session_id = f"fake-session-{len(known) + 1}-{os.getpid()}"
        known[session_id] = 0
        save_sessions(known)
        return NewSessionResponse(session_id=session_id, **self._session_answer())

    async def resume_session(
        self, session_id: str, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> ResumeSessionResponse:
        log("session/resume", {"session_id": session_id, "cwd": cwd})
        if session_id not in sessions():
            raise RequestError.resource_not_found(session_id)
        return ResumeSessionResponse(**self._session_answer())

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse:
        log("session/load", {"session_id": session_id, "cwd": cwd})
        if session_id not in sessions():
            raise RequestError.resource_not_found(session_id)
        # A loaded session replays its history to the client.
        await self._conn.session_update(session_id, update_agent_message_text("(replayed history)"))
        return LoadSessionResponse(**self._session_answer())

    async def set_session_mode(self, mode_id: str, session_id: str, **kwargs: Any) -> SetSessionModeResponse:
        log("session/set_mode", {"session_id": session_id, "mode_id": mode_id})
        return SetSessionModeResponse()

    async def set_config_option(
        self, config_id: str, session_id: str, value: Any, **kwargs: Any
    ) -> SetSessionConfigOptionResponse:
        log("session/set_config_option", {"session_id": session_id, "config_id": config_id, "value": value})
        return SetSessionConfigOptionResponse(config_options=self._session_answer()["config_options"])

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        log("session/cancel", {"session_id": session_id})
        self._cancelled.setdefault(session_id, asyncio.Event()).set()

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        text = "".join(getattr(block, "text", "") for block in prompt)
        log("session/prompt", {"session_id": session_id, "text": text})
        known = sessions()
        known[session_id] = known.get(session_id, 0) + 1
        save_sessions(known)
        say = self._say(session_id)
        if text.startswith("echo:"):
            message = text.removeprefix("echo:")
            await self._conn.session_update(session_id, update_agent_thought_text("thinking it over"))
            await self._conn.session_update(
                session_id, start_tool_call("tool-1", "Looking around", kind="read", status="completed")
            )
            half = len(message) // 2
            await say(message[:half])
            await say(message[half:])
        elif text.startswith("slow:"):
            for index in range(int(text.removeprefix("slow:"))):
                if index:
                    await asyncio.sleep(0.2)
                await say(f"chunk {index} at {time.monotonic()}\n")
                if index == 0:
                    await self._conn.session_update(
                        session_id, start_tool_call("tool-3", "Working", kind="edit", status="in_progress")
                    )
        elif text == "history":
            await say(f"turn {known[session_id]}")
        elif text == "permission":
            answer = await self._conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(
                    tool_call_id="tool-2",
                    title="rm -rf build",
                    kind="execute",
                    raw_input={"cmd": "rm -rf build"},
                ),
                options=[
                    PermissionOption(option_id="yes", name="Yes", kind="allow_once"),
                    PermissionOption(option_id="always", name="Always", kind="allow_always"),
                    PermissionOption(option_id="no", name="No", kind="reject_once"),
                ],
            )
            outcome = answer.outcome
            await say(f"permission: {getattr(outcome, 'option_id', outcome.outcome)}")
        elif text.startswith("read:"):
            read = await self._conn.read_text_file(session_id=session_id, path=text.removeprefix("read:"))
            await say(read.content)
        elif text == "hang":
            await self._cancelled.setdefault(session_id, asyncio.Event()).wait()
            return PromptResponse(stop_reason="cancelled")
        elif text == "ignore-cancel":
            await asyncio.Event().wait()
        elif text.startswith("long-line:"):
            size = int(text.removeprefix("long-line:"))
            notification = b'{"jsonrpc":"2.0","method":"fake/padding","params":{}}'
            line = notification[:-1] + b" " * max(0, size - len(notification)) + b"}\n"
            await asyncio.to_thread(_write_all, line)
            await self._cancelled.setdefault(session_id, asyncio.Event()).wait()
            return PromptResponse(stop_reason="cancelled")
        elif text == "crash":
            sys.stderr.write("fatal: the fake agent crashed on purpose\n")
            sys.stderr.flush()
            os._exit(3)
        else:
            await say("ok")
        return PromptResponse(stop_reason="end_turn")

    def _say(self, session_id: str) -> Any:
        async def say(text: str) -> None:
            await self._conn.session_update(session_id, update_agent_message_text(text))

        return say


def _write_all(data: bytes) -> None:
    """Write all of `data` to stdout, which the SDK's event loop has made non-blocking."""
    fd = sys.stdout.fileno()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


if __name__ == "__main__":
    # session/resume is still marked unstable in the SDK; codex-acp serves it.
    # FakeAgent implements the methods its tests use, not the whole Agent protocol.
    asyncio.run(run_agent(FakeAgent(), use_unstable_protocol=True))  # type: ignore[arg-type]
