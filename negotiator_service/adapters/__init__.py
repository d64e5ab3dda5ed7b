"""Adapter implementations, built from config entries.

    scripted  canned replies for demos and tests (declaration from config)
    command   a local agent CLI run without a shell (a harness)
    openai    any chat-completions server (a framework)
    remote    any process implementing agentsidecar.adapter.v1 (declares itself)
    acp       any Agent Client Protocol agent over stdio (declared from its initialize answer)

`build_adapter` builds the synchronous ones; a remote adapter must connect
first and an acp adapter asks its agent, so the server builds a whole config
with `await build_adapters(specs)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from agentsidecar.negotiator_service.declarations import validate_shortname
from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import Adapter, AdapterSpec

# Each implementation's module is imported when a config first asks for it: the openai one
# brings aiohttp (the MCP SDK waits for a call's first MCP server), the acp one the ACP SDK's
# schema models, the remote one the adapter protocol's stubs, and a negotiator pays only for
# the adapters it runs.
if TYPE_CHECKING:
    from agentsidecar.negotiator_service.adapters.command import CommandAdapter
    from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter
    from agentsidecar.negotiator_service.adapters.remote import RemoteAdapter, connect_remote
    from agentsidecar.negotiator_service.adapters.scripted import ScriptedAdapter


def _scripted(spec: AdapterSpec) -> Adapter:
    from agentsidecar.negotiator_service.adapters.scripted import ScriptedAdapter

    return ScriptedAdapter(spec)


def _command(spec: AdapterSpec) -> Adapter:
    from agentsidecar.negotiator_service.adapters.command import CommandAdapter

    return CommandAdapter(spec)


def _openai(spec: AdapterSpec) -> Adapter:
    from agentsidecar.negotiator_service.adapters.openai import OpenAIAdapter

    return OpenAIAdapter(spec)


_SYNC_BUILDERS: Mapping[str, Callable[[AdapterSpec], Adapter]] = MappingProxyType(
    {
        "scripted": _scripted,
        "command": _command,
        "openai": _openai,
    }
)
IMPLEMENTATIONS = frozenset({*_SYNC_BUILDERS, "remote", "acp"})
# The names this package re-exports, from the module that defines each one.
_EXPORTS: Mapping[str, str] = MappingProxyType(
    {
        "CommandAdapter": "command",
        "OpenAIAdapter": "openai",
        "RemoteAdapter": "remote",
        "ScriptedAdapter": "scripted",
        "connect_remote": "remote",
    }
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def _where(spec: AdapterSpec) -> str:
    return f" ({spec.source_path})" if spec.source_path else ""


def _checked(spec: AdapterSpec) -> None:
    try:
        validate_shortname(spec.shortname)
    except ConfigError as exc:
        raise ConfigError(f"{exc.message}{_where(spec)}") from exc
    if spec.implementation not in IMPLEMENTATIONS:
        raise ConfigError(
            f'adapter "{spec.shortname}"{_where(spec)}: unknown implementation "{spec.implementation}"; '
            f"expected one of {', '.join(sorted(IMPLEMENTATIONS))}"
        )


def build_adapter(spec: AdapterSpec) -> Adapter:
    """Build a scripted, command or openai adapter. Bad config → ConfigError."""
    _checked(spec)
    builder = _SYNC_BUILDERS.get(spec.implementation)
    if builder is None:
        raise ConfigError(
            f'adapter "{spec.shortname}"{_where(spec)}: a {spec.implementation} adapter connects '
            "before it exists; build it with build_adapter_async"
        )
    return builder(spec)


async def build_adapter_async(spec: AdapterSpec) -> Adapter:
    """Build any adapter; a remote one connects and fetches its declaration."""
    _checked(spec)
    if spec.implementation == "remote":
        from agentsidecar.negotiator_service.adapters.remote import connect_from_spec

        return await connect_from_spec(spec)
    if spec.implementation == "acp":
        from agentsidecar.negotiator_service.adapters.acp import AcpAdapter

        return await AcpAdapter.start(spec)
    return build_adapter(spec)


async def build_adapters(specs: Sequence[AdapterSpec]) -> list[Adapter]:
    """Build every adapter of a config, in order; remote ones connect concurrently.

    All or nothing: on any failure the adapters already built are closed and
    the first failure in config order is raised.
    """
    seen: dict[str, AdapterSpec] = {}
    for spec in specs:
        if spec.shortname in seen:
            raise ConfigError(
                f'adapter "{spec.shortname}" is defined twice{_where(spec)}{_where(seen[spec.shortname])}'
            )
        seen[spec.shortname] = spec
    results = await asyncio.gather(*(build_adapter_async(spec) for spec in specs), return_exceptions=True)
    built = [result for result in results if not isinstance(result, BaseException)]
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        await asyncio.gather(*(adapter.close() for adapter in built), return_exceptions=True)
        raise failures[0]
    return built


__all__ = [
    "IMPLEMENTATIONS",
    "CommandAdapter",
    "OpenAIAdapter",
    "RemoteAdapter",
    "ScriptedAdapter",
    "build_adapter",
    "build_adapter_async",
    "build_adapters",
    "connect_remote",
]
