"""MCP admission, function names and risks (mcp_policy.py), and the config's `mcp:` section."""

from __future__ import annotations

import pytest

from agentsidecar.negotiator_service.config import load_negotiator_config
from agentsidecar.negotiator_service.errors import ConfigError, McpServerNotAllowed
from agentsidecar.negotiator_service.mcp_policy import (
    MAX_FUNCTION_NAME,
    RULE_CALLER_HOST,
    RULE_CALLER_STDIO,
    McpPolicy,
    check_servers,
    function_name,
    tool_risk,
)
from agentsidecar.negotiator_service.model import McpServer, ToolRisk
from agentsidecar.negotiator_service.tools import TOOL_NAME

R, M, S = ToolRisk.READ_ONLY, ToolRisk.MUTATING, ToolRisk.SENSITIVE


@pytest.mark.parametrize(
    ("read_only", "destructive", "operator", "expected"),
    [
        (True, None, None, R),
        (None, True, None, S),
        (False, False, None, M),
        (None, None, None, M),
        (True, True, None, R),  # the spec: destructiveHint means something only when not read-only
        (True, None, S, S),  # a read-only hint never lowers the operator's risk
        (True, None, M, M),
        (None, None, R, R),  # no hint: the operator's word
        (None, True, R, S),  # a destructive hint raises it
    ],
)
def test_risk_from_annotations_never_lowers_the_operators(
    read_only: bool | None, destructive: bool | None, operator: ToolRisk | None, expected: ToolRisk
) -> None:
    assert tool_risk(read_only, destructive, operator) is expected


def test_function_names_are_namespaced_valid_bounded_and_collision_free() -> None:
    assert function_name("fs", "read_file", ()) == "fs__read_file"
    assert function_name("my.server", "tools/list files", ()) == "my_server__tools_list_files"
    long = function_name("s" * 40, "t" * 40, ())
    assert len(long) == MAX_FUNCTION_NAME
    assert TOOL_NAME.fullmatch(long)
    # Two servers whose names clean to the same text still get two names.
    first = function_name("a.b", "x", ())
    second = function_name("a_b", "x", [first])
    assert first != second
    assert TOOL_NAME.fullmatch(second)
    # A caller tool already named like an MCP tool keeps its name.
    assert function_name("fs", "read", ["fs__read"]) != "fs__read"


def test_caller_servers_need_the_operators_allowlists() -> None:
    policy = McpPolicy(
        caller_stdio_commands=frozenset({"/usr/bin/mcp-git"}), caller_hosts=frozenset({"mcp.lan"})
    )
    check_servers(
        (
            McpServer("git", "stdio", command="/usr/bin/mcp-git"),
            McpServer("web", "streamable-http", url="https://MCP.lan:8443/mcp"),
            McpServer("ops", "stdio", command="/opt/anything", operator=True),
        ),
        policy,
    )
    with pytest.raises(McpServerNotAllowed) as stdio:
        check_servers((McpServer("git", "stdio", command="mcp-git"),), policy)
    assert (stdio.value.server, stdio.value.rule) == ("git", RULE_CALLER_STDIO)
    with pytest.raises(McpServerNotAllowed) as http:
        check_servers((McpServer("w", "sse", url="http://mcp.lan.evil/sse"),), policy)
    assert (http.value.server, http.value.rule) == ("w", RULE_CALLER_HOST)


def test_a_refusal_names_the_requests_own_index_after_the_profiles_servers() -> None:
    servers = (
        McpServer("ops", "stdio", command="/opt/ops", operator=True),
        McpServer("docs", "sse", url="http://mcp.lan/sse"),
        McpServer("git", "stdio", command="mcp-git"),
    )
    with pytest.raises(McpServerNotAllowed) as refused:
        check_servers(servers, McpPolicy(caller_hosts=frozenset({"mcp.lan"})), "invoke.options")
    assert refused.value.server == "git"
    assert "invoke.options.mcp_servers[1]: " in str(refused.value)


def test_the_mcp_section_and_per_tool_settings_are_read() -> None:
    config = load_negotiator_config(
        "adapters: []\n"
        "profiles:\n"
        "  p:\n"
        "    mcp_servers:\n"
        "      - name: fs\n"
        "        transport: stdio\n"
        "        command: /bin/mcp-fs\n"
        "        tool_risks: {write: sensitive, read: read_only}\n"
        "        preapproved: [write]\n"
        "mcp:\n"
        "  caller_stdio_commands: [/bin/mcp-git]\n"
        "  caller_hosts: [MCP.lan, '[::1]']\n",
        "n.yaml",
    )
    assert config.mcp == McpPolicy(frozenset({"/bin/mcp-git"}), frozenset({"mcp.lan", "::1"}))
    assert config.profiles is not None
    server = config.profiles["p"].mcp_servers[0]
    assert server.operator
    assert dict(server.tool_risks) == {"write": S, "read": R}
    assert server.preapproved == {"write"}
    assert load_negotiator_config("adapters: []\n", "n.yaml").mcp == McpPolicy()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("mcp: {caller_hosts: ['http://x']}", "is a host, not a URL"),
        ("mcp: {caller_hosts: ['x:80']}", "not a URL or host:port"),
        ("mcp: {callers: []}", "unknown key 'callers'"),
    ],
)
def test_a_bad_mcp_section_is_refused(section: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_negotiator_config(f"adapters: []\n{section}\n", "n.yaml")
