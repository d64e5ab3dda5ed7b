"""The `negotiator` CLI against a real server: JSON on stdout, errors and refusals on stderr, exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fakes import make_declaration
from negotiator_testkit import NEGOTIATOR_BIN, TEST_CONFIG, add_fake

from agentsidecar.negotiator_service.cli import main
from agentsidecar.negotiator_service.config import load_config
from agentsidecar.negotiator_service.model import Capability, MaxDepth, McpServer, ToolFilter
from agentsidecar.negotiator_service.server import RunningNegotiator

SCHEMA = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'


async def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """main() in a worker thread (it blocks on a sync channel; the server needs this loop)."""
    capsys.readouterr()
    try:
        code = await asyncio.to_thread(main, list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def server(negotiator: RunningNegotiator) -> str:
    return negotiator.bound[0]


async def test_adapters_lists_json(capsys: pytest.CaptureFixture[str], server: str) -> None:
    code, out, _ = await run_cli(capsys, "--server", server, "adapters")
    assert code == 0
    adapters = json.loads(out)["adapters"]
    fw = next(a for a in adapters if a["shortname"] == "scripted-fw")
    assert fw["kind"] == "agent-framework"
    assert fw["implementation"] == "scripted"
    assert fw["source"] == "config"
    assert fw["scripted"] is True
    assert fw["capabilities"]["persona"] == "unsupported"
    assert fw["capabilities"]["structured_output"] == "supported"
    assert fw["accepted_settings"] == ["temperature"]
    assert fw["declaration_version"].startswith("sha256:")


async def test_adapters_get_uses_the_env_server(
    capsys: pytest.CaptureFixture[str], server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEGOTIATOR_SERVER", server)
    code, out, _ = await run_cli(capsys, "adapters", "scripted-harness")
    assert code == 0
    assert json.loads(out)["adapter"]["kind"] == "agent-harness"


async def test_produce_prints_parsed_output_and_verdicts(
    capsys: pytest.CaptureFixture[str], server: str
) -> None:
    code, out, err = await run_cli(
        capsys,
        "--server",
        server,
        "produce",
        "--adapter",
        "scripted-fw",
        "--schema",
        SCHEMA,
        "who?",
        "--model",
        "m",
    )
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert result["adapter"] == "scripted-fw"
    assert result["declaration_version"].startswith("sha256:")
    assert result["output"] == {"name": "Ada", "email": "ada@example.org"}
    assert result["events"] == []
    assert result["verdicts"] == [
        {
            "capability": "structured_output",
            "set": None,
            "member": None,
            "request_field": "output_schema",
            "state": "supported",
            "allowed_unknown": False,
        },
        {
            "capability": "model_override",
            "set": None,
            "member": None,
            "request_field": "options.model",
            "state": "supported",
            "allowed_unknown": False,
        },
    ]


async def test_produce_reads_the_schema_from_a_file(
    capsys: pytest.CaptureFixture[str], server: str, tmp_path: Path
) -> None:
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(SCHEMA)
    code, out, _ = await run_cli(
        capsys, "--server", server, "produce", "--adapter", "scripted-fw", "--schema", str(schema_file), "x"
    )
    assert code == 0
    assert json.loads(out)["output"]["name"] == "Ada"


async def test_invoke_with_events(capsys: pytest.CaptureFixture[str], server: str) -> None:
    code, out, _ = await run_cli(
        capsys, "--server", server, "invoke", "--adapter", "scripted-fw", "hello", "--stream-events"
    )
    assert code == 0
    result = json.loads(out)
    assert result["text"] == "hello"
    assert result["events"] == [{"type": "message", "text": "thinking"}]
    assert [v["capability"] for v in result["verdicts"]] == ["stream_events"]


async def test_refusal_prints_gaps_on_stderr_and_exits_3(
    capsys: pytest.CaptureFixture[str], server: str
) -> None:
    code, out, err = await run_cli(
        capsys,
        "--server",
        server,
        "invoke",
        "--adapter",
        "scripted-fw",
        "p",
        "--persona",
        "critic",
        "--setting",
        "top_p=0.5",
        "--effort",
        "low",
    )
    assert code == 3
    assert out == ""
    first, _, rest = err.partition("\n")
    assert first.startswith('error: adapter "scripted-fw" cannot honour this call')
    error = json.loads(rest)["error"]
    assert error["code"] == "FAILED_PRECONDITION"
    assert error["reason"] == "UNSUPPORTED_CAPABILITY"
    assert error["adapter"] == "scripted-fw"
    assert error["declaration_version"].startswith("sha256:")
    assert "persona" in error["message"]
    assert error["gaps"] == [
        {
            "capability": "effort",
            "set": None,
            "member": None,
            "request_field": "options.effort",
            "state": "unknown",
        },
        {
            "capability": "settings",
            "set": "accepted_settings",
            "member": "top_p",
            "request_field": "options.settings.top_p",
            "state": "unsupported",
        },
        {
            "capability": "persona",
            "set": None,
            "member": None,
            "request_field": "options.persona",
            "state": "unsupported",
        },
    ]


async def test_negotiate_prints_the_decision_and_exits_3_when_refused(
    capsys: pytest.CaptureFixture[str], server: str
) -> None:
    code, out, _ = await run_cli(
        capsys, "--server", server, "negotiate", "--adapter", "scripted-fw", "p", "--model", "m"
    )
    assert code == 0
    assert json.loads(out)["accepted"] is True

    code, out, _ = await run_cli(
        capsys,
        "--server",
        server,
        "negotiate",
        "--adapter",
        "scripted-fw",
        "--schema",
        SCHEMA,
        "p",
        "--persona",
        "x",
    )
    assert code == 3
    decision = json.loads(out)
    assert decision["accepted"] is False
    assert [v["capability"] for v in decision["verdicts"]] == ["structured_output", "persona"]
    assert [g["capability"] for g in decision["gaps"]] == ["persona"]


async def test_other_errors_print_message_and_json_and_exit_1(
    capsys: pytest.CaptureFixture[str], server: str
) -> None:
    code, out, err = await run_cli(capsys, "--server", server, "invoke", "--agent", "scripted-fw", "p")
    assert code == 1
    assert out == ""
    first, _, rest = err.partition("\n")
    assert first.startswith("error: ")
    assert "agent-harness" in first
    error = json.loads(rest)["error"]
    assert (error["code"], error["reason"]) == ("FAILED_PRECONDITION", "ADAPTER_KIND_MISMATCH")
    assert error["metadata"]["adapter"] == "scripted-fw"

    code, _, err = await run_cli(
        capsys, "--server", server, "produce", "--adapter", "scripted-fw", "--schema", '{"type": 5}', "p"
    )
    assert code == 1
    error = json.loads(err.partition("\n")[2])["error"]
    assert error["code"] == "INVALID_ARGUMENT"
    assert [v["field"] for v in error["field_violations"]] == ["output_schema"]


async def test_adapter_failure_exit_1_names_the_adapter(
    capsys: pytest.CaptureFixture[str], server: str
) -> None:
    code, _, err = await run_cli(capsys, "--server", server, "invoke", "--adapter", "fail-rate-limited", "p")
    assert code == 1
    error = json.loads(err.partition("\n")[2])["error"]
    assert (error["code"], error["reason"]) == ("RESOURCE_EXHAUSTED", "ADAPTER_RATE_LIMITED")
    assert error["metadata"]["adapter"] == "fail-rate-limited"


async def test_timeout_option_sets_the_deadline(capsys: pytest.CaptureFixture[str], server: str) -> None:
    code, _, err = await run_cli(
        capsys, "--server", server, "invoke", "--adapter", "slow", "p", "--timeout", "0.3"
    )
    assert code == 1
    assert json.loads(err.partition("\n")[2])["error"]["code"] == "DEADLINE_EXCEEDED"


async def test_every_call_option_reaches_the_adapter(
    capsys: pytest.CaptureFixture[str], server: str, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(
        negotiator,
        make_declaration(
            "fake",
            supported=list(Capability),
            mcp_transports=["stdio", "http"],
            accepted_settings=["seed", "style"],
        ),
    )
    code, out, err = await run_cli(
        capsys,
        "--server",
        server,
        "invoke",
        "--adapter",
        "fake",
        "hi",
        "--model",
        "m",
        "--effort",
        "high",
        "--profile",
        "prof",
        "--persona",
        "critic",
        "--setting",
        "seed=7",
        "--setting",
        'style="terse"',
        "--mcp",
        "fs=stdio:npx -y fs-server /tmp",
        "--mcp",
        "docs=http:http://localhost:9000/mcp",
        "--max-depth",
        "provider-managed",
        "--allow-tool",
        "read",
        "--deny-tool",
        "write",
        "--stream-events",
    )
    assert code == 0, err
    options = fake.calls[0][1].options
    assert (options.model, options.effort, options.profile, options.persona) == (
        "m",
        "high",
        "prof",
        "critic",
    )
    assert dict(options.settings) == {"seed": 7, "style": "terse"}
    assert options.mcp_servers == (
        McpServer("fs", "stdio", command="npx", args=("-y", "fs-server", "/tmp")),
        McpServer("docs", "http", url="http://localhost:9000/mcp"),
    )
    assert options.max_depth == MaxDepth(provider_managed=True)
    assert options.tool_filter == ToolFilter(allow=("read",), deny=("write",))
    assert options.stream_events is True
    assert json.loads(out)["text"] == "hi"


async def test_allow_unknown_lets_the_call_run(
    capsys: pytest.CaptureFixture[str], server: str, negotiator: RunningNegotiator
) -> None:
    fake = add_fake(negotiator, make_declaration("fake"))
    code, _, err = await run_cli(
        capsys, "--server", server, "invoke", "--adapter", "fake", "p", "--max-depth", "2"
    )
    assert code == 3
    assert json.loads(err.splitlines()[-1])["error"]["gaps"][0]["capability"] == "depth_limit"
    assert fake.calls == []

    code, out, _ = await run_cli(
        capsys,
        "--server",
        server,
        "invoke",
        "--adapter",
        "fake",
        "p",
        "--max-depth",
        "2",
        "--allow-unknown",
        "depth_limit",
    )
    assert code == 0
    verdict = json.loads(out)["verdicts"][0]
    assert (verdict["capability"], verdict["state"], verdict["allowed_unknown"]) == (
        "depth_limit",
        "unknown",
        True,
    )
    assert fake.calls[0][1].options.max_depth == MaxDepth(depth=2)


@pytest.mark.parametrize(
    "argv",
    [
        ["invoke", "p"],  # neither --adapter nor --agent
        ["invoke", "--adapter", "a", "--agent", "b", "p"],
        ["invoke", "--adapter", "a", "p", "--setting", "seed=not json"],
        ["invoke", "--adapter", "a", "p", "--setting", "noequals"],
        ["invoke", "--adapter", "a", "p", "--mcp", "fs=stdio"],
        ["invoke", "--adapter", "a", "p", "--max-depth", "deep"],
        ["invoke", "--adapter", "a", "p", "--allow-unknown", "telepathy"],
        ["produce", "--adapter", "a", "p"],  # no --schema
        ["produce", "--adapter", "a", "--schema", "/no/such/file.json", "p"],
        ["frobnicate"],
    ],
)
async def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], server: str, argv: list[str]) -> None:
    code, out, err = await run_cli(capsys, "--server", server, *argv)
    assert code == 2
    assert out == ""
    assert "usage:" in err


@pytest.mark.slow
async def test_without_server_the_run_commands_socket_is_used(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server: str
) -> None:
    monkeypatch.delenv("NEGOTIATOR_SERVER", raising=False)
    monkeypatch.chdir(tmp_path)
    code, _, err = await run_cli(capsys, "adapters", "--timeout", "2")
    assert code == 1
    assert err.startswith(
        "error: cannot reach the negotiator at unix:run/negotiator.sock "
        "(the default; pass --server ADDR or set NEGOTIATOR_SERVER)"
    )
    # run/negotiator.sock, as agentsidecar-pair makes it, is where the CLI goes by default.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "negotiator.sock").symlink_to(server.removeprefix("unix:"))
    code, out, err = await run_cli(capsys, "adapters")
    assert (code, err) == (0, "")
    assert json.loads(out)["adapters"]


@pytest.mark.slow
async def test_unreachable_server_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = await run_cli(
        capsys, "--server", f"unix:{tmp_path}/none.sock", "adapters", "--timeout", "1"
    )
    assert code == 1
    assert json.loads(err.partition("\n")[2])["error"]["code"] in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


@pytest.mark.slow
async def test_installed_console_script_refuses_with_exit_3(server: str) -> None:
    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(NEGOTIATOR_BIN),
                "--server",
                server,
                "invoke",
                "--adapter",
                "scripted-fw",
                "p",
                "--persona",
                "x",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )

    result = await asyncio.to_thread(run)
    assert result.returncode == 3
    assert result.stdout == ""
    error: dict[str, Any] = json.loads(result.stderr.splitlines()[-1])["error"]
    assert error["reason"] == "UNSUPPORTED_CAPABILITY"
    assert error["gaps"][0]["request_field"] == "options.persona"


async def test_adapters_watch_prints_json_lines_until_the_server_stops(
    capsys: pytest.CaptureFixture[str], server: str, negotiator: RunningNegotiator
) -> None:
    capsys.readouterr()
    watcher = asyncio.ensure_future(asyncio.to_thread(main, ["--server", server, "adapters", "--watch"]))
    for _ in range(250):
        if negotiator.registry.watcher_count:
            break
        await asyncio.sleep(0.02)
    add_fake(negotiator, make_declaration("late-fake"), source="runtime")
    out = ""
    for _ in range(250):  # the change reaches the CLI before the stream ends
        out += capsys.readouterr().out
        if "late-fake" in out:
            break
        await asyncio.sleep(0.02)
    await negotiator.stop()
    code = await asyncio.wait_for(watcher, 10)
    rest, err = capsys.readouterr()
    out += rest
    lines = [json.loads(line) for line in out.splitlines()]
    assert {line["change"] for line in lines[:-1]} == {"existing"}
    assert len(lines) == len(load_config(TEST_CONFIG, "test")) + 1
    assert (lines[-1]["change"], lines[-1]["adapter"]["shortname"]) == ("registered", "late-fake")
    assert lines[-1]["adapter"]["source"] == "runtime"
    assert code == 1
    assert json.loads(err.partition("\n")[2])["error"]["reason"] == "SHUTTING_DOWN"


def test_a_reader_that_has_gone_gets_no_traceback() -> None:
    """`negotiator config-schema | head -c 1` once head has exited: exit 1, nothing on stderr.

    The pipe's read end is closed before the command starts, so its first write fails as a
    write after the reader left does.
    """
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [str(NEGOTIATOR_BIN), "config-schema"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == b""
    assert result.returncode == 1
