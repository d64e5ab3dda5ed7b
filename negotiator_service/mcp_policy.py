"""Who may start which MCP server, and how MCP tools are named and rated. Pure: no I/O, no grpc.

Admission (`check_servers`, run by the broker before dispatch):
- a server from the operator's config (a profile's `mcp_servers`) may use any
  transport, stdio included;
- a caller-supplied stdio server is refused unless its `command` is listed
  in the config's `mcp.caller_stdio_commands` (compared as written, so an
  allowlisted absolute path does not admit a same-named program elsewhere);
- a caller-supplied sse/http server is refused unless its URL's host is
  listed in `mcp.caller_hosts` (case-insensitive; ports and paths are free).
The refusal is McpServerNotAllowed naming the server and the rule.

Names: each MCP tool is offered to the model as the function
`<server>__<tool>`, both parts cut to `[A-Za-z0-9_-]`. When that is longer
than the 64 characters a function name may have, or collides with a name
already taken in the call, the name is shortened and ends in an 8-hex-digit
hash of (server, tool), so two servers of one call never share a name.

Risk (`tool_risk`): `readOnlyHint: true` → read_only, else
`destructiveHint: true` → sensitive, else mutating. An operator-set risk
(`tool_risks` of a config server) is kept, and a hint may only raise it
(a destructive hint makes any risk sensitive); a read-only hint never
lowers it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from urllib.parse import urlsplit

from agentsidecar.negotiator_service.errors import McpServerNotAllowed
from agentsidecar.negotiator_service.model import McpServer, ToolRisk

MAX_FUNCTION_NAME = 64
SEPARATOR = "__"
RULE_CALLER_STDIO = "caller-stdio-command-allowlist"
RULE_CALLER_HOST = "caller-host-allowlist"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_HASH_LENGTH = 8
_RISK_ORDER = MappingProxyType({ToolRisk.READ_ONLY: 0, ToolRisk.MUTATING: 1, ToolRisk.SENSITIVE: 2})


@dataclass(frozen=True, slots=True)
class McpPolicy:
    """The config's `mcp:` section: what caller-supplied servers may be."""

    caller_stdio_commands: frozenset[str] = frozenset()
    caller_hosts: frozenset[str] = frozenset()  # lower-cased


def check_servers(servers: Sequence[McpServer], policy: McpPolicy, field_prefix: str = "options") -> None:
    """Raise McpServerNotAllowed for the first server the policy does not admit.

    `servers` are a call's after profile expansion: the profile's (operator)
    servers, then the request's; the refusal names the request's own index.
    """
    hosts = {host.lower() for host in policy.caller_hosts}
    caller_servers = (server for server in servers if not server.operator)
    for index, server in enumerate(caller_servers):
        where = f"{field_prefix}.mcp_servers[{index}]"
        if server.transport == "stdio":
            if server.command not in policy.caller_stdio_commands:
                raise McpServerNotAllowed(
                    server.name,
                    RULE_CALLER_STDIO,
                    f'{where}: a caller-supplied stdio server runs the command "{server.command}", '
                    "which the operator did not allowlist (config mcp.caller_stdio_commands)",
                )
            continue
        host = (urlsplit(server.url).hostname or "").lower()
        if host not in hosts:
            raise McpServerNotAllowed(
                server.name,
                RULE_CALLER_HOST,
                f'{where}: a caller-supplied {server.transport} server at host "{host}" is not on '
                "the operator's list (config mcp.caller_hosts)",
            )


def function_name(server: str, tool: str, taken: Iterable[str]) -> str:
    """The model-facing name of `tool` of `server`, unique among `taken`."""
    name = f"{_UNSAFE.sub('_', server)}{SEPARATOR}{_UNSAFE.sub('_', tool)}"
    taken_set = set(taken)
    if len(name) <= MAX_FUNCTION_NAME and name not in taken_set:
        return name
    digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()
    for start in range(0, len(digest) - _HASH_LENGTH + 1):
        suffix = "_" + digest[start : start + _HASH_LENGTH]
        candidate = name[: MAX_FUNCTION_NAME - len(suffix)] + suffix
        if candidate not in taken_set:
            return candidate
    raise ValueError(f"no free function name for tool {tool!r} of MCP server {server!r}")


def tool_risk(
    read_only_hint: bool | None, destructive_hint: bool | None, operator_risk: ToolRisk | None
) -> ToolRisk:
    """The risk of one MCP tool; see the module docstring."""
    if read_only_hint:
        hinted = ToolRisk.READ_ONLY
    elif destructive_hint:
        hinted = ToolRisk.SENSITIVE
    else:
        hinted = ToolRisk.MUTATING
    if operator_risk is None:
        return hinted
    if hinted is ToolRisk.SENSITIVE:
        return max(operator_risk, hinted, key=_RISK_ORDER.__getitem__)
    return operator_risk


def risks_of(server: McpServer) -> Mapping[str, ToolRisk]:
    """The operator-set risks of a server's tools (none for a caller-supplied server)."""
    return server.tool_risks if server.operator else {}
