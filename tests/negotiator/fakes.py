"""Test doubles for the negotiator: a FakeAdapter that records every call.

Import from tests with `from fakes import FakeAdapter, make_declaration`
(pytest puts this directory on sys.path for the tests beside it).

A FakeAdapter answers from a script: each call takes the next scripted reply,
and when the script is empty it uses `default`. A reply is one of:

    str                               the reply text
    AdapterReply                      returned as is
    BaseException (instance or type)  raised
    Hang()                            waits until cancelled
    callable(kind, call)              its result (sync or async) is the reply
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeAlias

from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterReply,
    Capability,
    CapabilityState,
    Declaration,
)


@dataclass(frozen=True)
class Hang:
    """A reply that never comes: the call waits until it is cancelled."""


ReplyFn: TypeAlias = Callable[[str, AdapterCall], str | AdapterReply | Awaitable[str | AdapterReply]]
Reply: TypeAlias = str | AdapterReply | BaseException | type[BaseException] | Hang | ReplyFn


def make_declaration(
    shortname: str = "fake",
    kind: AdapterKind = AdapterKind.FRAMEWORK,
    *,
    supported: Iterable[Capability] = (),
    unsupported: Iterable[Capability] = (),
    unknown: Iterable[Capability] = (),
    mcp_transports: Iterable[str] = (),
    accepted_settings: Iterable[str] = (),
    string_formats: Iterable[str] = (),
    hook_events: Iterable[str] = (),
    scripted: bool = False,
) -> Declaration:
    """A declaration; capabilities listed in `unknown` are declared explicitly UNKNOWN."""
    capabilities: dict[Capability, CapabilityState] = {}
    capabilities.update(dict.fromkeys(unknown, CapabilityState.UNKNOWN))
    capabilities.update(dict.fromkeys(unsupported, CapabilityState.UNSUPPORTED))
    capabilities.update(dict.fromkeys(supported, CapabilityState.SUPPORTED))
    return Declaration(
        shortname=shortname,
        kind=kind,
        capabilities=MappingProxyType(capabilities),
        mcp_transports=frozenset(mcp_transports),
        accepted_settings=frozenset(accepted_settings),
        string_formats=frozenset(string_formats),
        hook_events=frozenset(hook_events),
        scripted=scripted,
    )


class FakeAdapter:
    """An Adapter that records every call and answers from a script."""

    implementation = "fake"

    def __init__(
        self,
        declaration: Declaration | None = None,
        *,
        replies: Iterable[Reply] = (),
        default: Reply | None = None,
        delay: float = 0.0,
    ) -> None:
        self._declaration = declaration if declaration is not None else make_declaration()
        self._script: list[Reply] = list(replies)
        self.default = default
        self.delay = delay
        self.calls: list[tuple[str, AdapterCall]] = []  # ("produce" | "invoke", call), in order
        self.cancelled: list[tuple[str, AdapterCall]] = []  # calls that saw CancelledError
        self.completed: list[tuple[str, AdapterCall]] = []  # calls that returned a reply
        self.close_count = 0
        self.started = asyncio.Event()  # set when any call starts

    @property
    def declaration(self) -> Declaration:
        return self._declaration

    @property
    def shortname(self) -> str:
        return self._declaration.shortname

    @property
    def call_count(self) -> int:
        return len(self.calls)

    def script(self, *replies: Reply) -> None:
        """Append replies to the script."""
        self._script.extend(replies)

    async def produce(self, call: AdapterCall) -> AdapterReply:
        return await self._answer("produce", call)

    async def invoke(self, call: AdapterCall) -> AdapterReply:
        return await self._answer("invoke", call)

    async def close(self) -> None:
        self.close_count += 1

    async def _answer(self, kind: str, call: AdapterCall) -> AdapterReply:
        self.calls.append((kind, call))
        self.started.set()
        reply = self._script.pop(0) if self._script else self.default
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            result = await self._realise(kind, call, reply)
        except asyncio.CancelledError:
            self.cancelled.append((kind, call))
            raise
        self.completed.append((kind, call))
        return result

    async def _realise(self, kind: str, call: AdapterCall, reply: Reply | None) -> AdapterReply:
        if reply is None:
            # Unscripted: Invoke echoes the prompt, Produce answers an empty object.
            return AdapterReply(text=call.prompt if kind == "invoke" else "{}")
        if isinstance(reply, Hang):
            await asyncio.Event().wait()
            raise AssertionError("unreachable: the event is never set")
        if isinstance(reply, BaseException | type):
            raise reply
        if isinstance(reply, str):
            return AdapterReply(text=reply)
        if isinstance(reply, AdapterReply):
            return reply
        produced = reply(kind, call)
        if inspect.isawaitable(produced):
            produced = await produced
        return produced if isinstance(produced, AdapterReply) else AdapterReply(text=produced)
