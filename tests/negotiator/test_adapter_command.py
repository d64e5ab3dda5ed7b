"""The command adapter: real processes, no shell, process groups killed on timeout and cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc
import pytest
from negotiator_testkit import NEGOTIATOR_BIN

from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.negotiator_service import errors
from agentsidecar.negotiator_service.adapters import build_adapter
from agentsidecar.negotiator_service.adapters.command import CommandAdapter
from agentsidecar.negotiator_service.model import (
    AdapterCall,
    AdapterKind,
    AdapterSpec,
    CallOptions,
    Capability,
    CapabilityState,
    DeclarationOverride,
)
from agentsidecar.sidecar_runtime.richstatus import DecodedError, decode_error
from tests.procs import process_alive, start_process, stop_process


def command(
    argv: list[str], declaration: DeclarationOverride | None = None, **options: Any
) -> CommandAdapter:
    spec = AdapterSpec(
        shortname="cli",
        implementation="command",
        declaration=declaration,
        options=MappingProxyType({"argv": argv, **options}),
    )
    adapter = build_adapter(spec)
    assert isinstance(adapter, CommandAdapter)
    return adapter


def call(prompt: str = "hello", time_budget: float | None = None, **options: Any) -> AdapterCall:
    return AdapterCall(prompt=prompt, options=CallOptions(**options), time_budget=time_budget)


def settings(**values: Any) -> MappingProxyType[str, Any]:
    return MappingProxyType(values)


async def wait_gone(pid: int, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


def spawner_script(tmp_path: Path, then: str) -> tuple[Path, Path]:
    """A script that starts a background sleep, writes its pid, then does `then`."""
    pidfile = tmp_path / "child.pid"
    script = tmp_path / "spawner.sh"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\n{then}\n")
    script.chmod(0o755)
    return script, pidfile


def written_pid(pidfile: Path) -> int | None:
    text = pidfile.read_text().strip() if pidfile.exists() else ""
    return int(text) if text else None


async def read_pid(pidfile: Path) -> int:
    for _ in range(200):
        if (pid := written_pid(pidfile)) is not None:
            return pid
        await asyncio.sleep(0.01)
    raise AssertionError("the script never wrote its child's pid")


async def test_prompt_goes_to_stdin_without_a_placeholder() -> None:
    reply = await command(["cat"]).invoke(call("from stdin\nsecond line"))
    assert reply.text == "from stdin\nsecond line"


async def test_a_large_prompt_on_stdin_does_not_deadlock() -> None:
    prompt = "x" * 300_000
    reply = await command(["cat"]).invoke(call(prompt, time_budget=10))
    assert reply.text == prompt


async def test_placeholder_element_is_replaced_by_the_prompt() -> None:
    reply = await command(["echo", "{prompt}"]).invoke(call("hello world"))
    assert reply.text == "hello world\n"


async def test_placeholder_inside_an_element_is_replaced() -> None:
    reply = await command(["printf", "%s|%s", "--say={prompt}", "{prompt}!"]).invoke(call("hi"))
    assert reply.text == "--say=hi|hi!"


async def test_no_shell_interprets_the_prompt(tmp_path: Path) -> None:
    marker = tmp_path / "X"
    adapter = command(["echo", "{prompt}"], cwd=str(tmp_path))
    reply = await adapter.invoke(call(f"a; touch {marker} && echo $HOME `id`"))
    assert reply.text == f"a; touch {marker} && echo $HOME `id`\n"
    assert os.listdir(tmp_path) == []


async def test_non_zero_exit_is_internal_with_the_stderr_tail() -> None:
    adapter = command(["sh", "-c", "echo partial; echo 'it broke' >&2; exit 3"])
    with pytest.raises(errors.AdapterInternal) as raised:
        await adapter.invoke(call())
    assert raised.value.adapter == "cli"
    assert raised.value.cause == "exited with 3: it broke"


async def test_only_the_last_500_bytes_of_stderr_are_kept() -> None:
    code = "import sys; sys.stderr.write('a' * 5000 + 'THE END'); sys.exit(1)"
    with pytest.raises(errors.AdapterInternal) as raised:
        await command([sys.executable, "-c", code]).invoke(call())
    assert raised.value.cause.endswith("THE END")
    assert len(raised.value.cause) <= len("exited with 1: ") + 500


def test_missing_executable_fails_start_up_naming_the_adapter() -> None:
    with pytest.raises(errors.ConfigError) as raised:
        command(["no-such-agent-cli-xyz", "{prompt}"])
    assert '"cli"' in raised.value.message
    assert "`argv[0]`" in raised.value.message
    assert "no-such-agent-cli-xyz" in raised.value.message


async def test_a_program_gone_after_start_up_is_misconfigured(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    adapter = command([str(script)])
    script.unlink()
    with pytest.raises(errors.AdapterMisconfigured) as raised:
        await adapter.invoke(call())
    assert str(script) in raised.value.cause
    assert raised.value.adapter == "cli"


@pytest.mark.slow
async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    script, pidfile = spawner_script(tmp_path, "wait")
    adapter = command([str(script)], timeout_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout) as raised:
        await adapter.invoke(call())
    assert time.monotonic() - started < 3
    assert "timeout_seconds" in raised.value.cause
    assert await wait_gone(await read_pid(pidfile))


@pytest.mark.slow
async def test_time_budget_shorter_than_the_timeout_wins(tmp_path: Path) -> None:
    script, pidfile = spawner_script(tmp_path, "wait")
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout) as raised:
        await command([str(script)], timeout_seconds=30).invoke(call(time_budget=0.4))
    assert time.monotonic() - started < 3
    assert "time budget" in raised.value.cause
    assert await wait_gone(await read_pid(pidfile))


async def test_cancellation_kills_the_whole_process_group(tmp_path: Path) -> None:
    script, pidfile = spawner_script(tmp_path, "wait")
    task = asyncio.create_task(command([str(script)]).invoke(call()))
    child = await read_pid(pidfile)
    assert process_alive(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_gone(child)


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.0, 0.002, 0.005, 0.01, 0.02])
async def test_cancellation_while_starting_neither_hangs_nor_leaks(tmp_path: Path, after: float) -> None:
    # asyncio's own start-up cleanup would wait for pipes the background child holds.
    script, pidfile = spawner_script(tmp_path, "wait")
    task = asyncio.create_task(command([str(script)]).invoke(call()))
    await asyncio.sleep(after)
    task.cancel()
    started = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 3
    await asyncio.sleep(0.1)
    if (pid := written_pid(pidfile)) is not None:
        assert await wait_gone(pid)


async def test_leftover_children_are_killed_when_the_command_exits(tmp_path: Path) -> None:
    script, pidfile = spawner_script(tmp_path, "echo finished")
    reply = await command([str(script)], timeout_seconds=10).invoke(call())
    assert reply.text == "finished\n"
    assert await wait_gone(await read_pid(pidfile))


async def test_output_over_the_cap_is_an_internal_error_not_a_truncation() -> None:
    started = time.monotonic()
    with pytest.raises(errors.AdapterInternal, match="output_cap_bytes=1000"):
        await command(["yes"], output_cap_bytes=1000).invoke(call())
    assert time.monotonic() - started < 3


async def test_minimal_environment_plus_configured_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEGOTIATOR_TEST_SECRET", "must-not-leak")
    reply = await command(["env"], env={"AGENT_MODE": "batch"}).invoke(call())
    names = {line.partition("=")[0] for line in reply.text.splitlines()}
    assert "AGENT_MODE=batch" in reply.text.splitlines()
    assert "NEGOTIATOR_TEST_SECRET" not in names
    assert names <= {"PATH", "HOME", "LANG", "AGENT_MODE"}


async def test_settings_env_is_layered_over_the_configured_env() -> None:
    adapter = command(["env"], env={"A": "config", "B": "config"}, call_env=["B", "C"])
    reply = await adapter.invoke(call(settings=settings(env={"B": "call", "C": "call"})))
    lines = set(reply.text.splitlines())
    assert {"A=config", "B=call", "C=call"} <= lines


async def test_settings_cwd_overrides_the_configured_cwd(tmp_path: Path) -> None:
    configured = tmp_path / "configured"
    per_call = tmp_path / "per-call"
    configured.mkdir()
    per_call.mkdir()
    adapter = command(["pwd"], cwd=str(configured), cwd_roots=[str(tmp_path)])
    assert (await adapter.invoke(call())).text.strip() == str(configured)
    reply = await adapter.invoke(call(settings=settings(cwd=str(per_call))))
    assert reply.text.strip() == str(per_call)


@pytest.mark.slow
async def test_settings_timeout_lowers_the_timeout() -> None:
    adapter = command(["sleep", "5"], timeout_seconds=30)
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout, match="timeout setting"):
        await adapter.invoke(call(settings=settings(timeout=0.3)))
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"timeout": 120.0}, "timeout"),  # above the configured 60 s
        ({"timeout": 0}, "timeout"),
        ({"timeout": "soon"}, "timeout"),
        ({"cwd": "/no/such/dir"}, "cwd"),
        ({"env": {"A": 1}}, "env"),
        ({"env": "A=1"}, "env"),
        ({"env": {"A": "a\0b"}}, "env"),
        ({"cwd": "a\0b"}, "cwd"),
    ],
)
async def test_bad_settings_are_refused(values: dict[str, Any], named: str) -> None:
    adapter = command(["true"], call_env=["A"], cwd_roots=["/"])
    with pytest.raises(errors.AdapterRefused, match=f"setting {named}"):
        await adapter.invoke(call(settings=settings(**values)))


async def test_unaccepted_setting_and_other_options_are_refused() -> None:
    adapter = command(["cat"])
    with pytest.raises(errors.AdapterRefused, match="accepted_settings:temperature"):
        await adapter.invoke(call(settings=settings(temperature=0.2)))
    with pytest.raises(errors.AdapterRefused) as raised:
        await adapter.invoke(call(model="m", effort="high", persona="p", stream_events=True))
    for field in ("options.model", "options.effort", "options.persona", "options.stream_events"):
        assert field in raised.value.cause
    # Declared unsupported: allowing unknowns does not help.
    with pytest.raises(errors.AdapterRefused):
        await adapter.invoke(call(model="m", allow_unknown=frozenset({Capability.MODEL_OVERRIDE})))


async def test_produce_is_refused() -> None:
    adapter = command(["cat"])
    with pytest.raises(errors.AdapterRefused, match="structured_output"):
        await adapter.produce(
            AdapterCall(prompt="x", options=CallOptions(), output_schema={"type": "object"})
        )


async def test_a_nul_byte_in_a_prompt_argument_is_refused() -> None:
    with pytest.raises(errors.AdapterRefused, match="NUL"):
        await command(["echo", "{prompt}"]).invoke(call("a\0b"))


def test_declaration_advertises_only_settings() -> None:
    declaration = command(["cat"]).declaration
    assert declaration.kind is AdapterKind.HARNESS
    assert declaration.shortname == "cli"
    assert declaration.scripted is False
    assert declaration.accepted_settings == {"timeout"}
    for capability in Capability:
        expected = (
            CapabilityState.SUPPORTED if capability is Capability.SETTINGS else CapabilityState.UNSUPPORTED
        )
        assert declaration.state(capability) is expected, capability


def test_the_declaration_lists_env_and_cwd_only_when_the_operator_allowed_them(tmp_path: Path) -> None:
    assert command(["cat"], call_env=["A"]).declaration.accepted_settings == {"env", "timeout"}
    assert command(["cat"], cwd_roots=[str(tmp_path)]).declaration.accepted_settings == {"cwd", "timeout"}
    both = command(["cat"], call_env=["A"], cwd_roots=[str(tmp_path)])
    assert both.declaration.accepted_settings == {"cwd", "env", "timeout"}


def test_config_may_not_declare_settings_the_options_do_not_allow() -> None:
    with pytest.raises(errors.ConfigError, match='accepted_settings contains "env"'):
        command(["cat"], declaration=DeclarationOverride(accepted_settings=frozenset({"env"})))


async def test_config_may_narrow_the_settings(tmp_path: Path) -> None:
    adapter = command(
        ["env"],
        declaration=DeclarationOverride(accepted_settings=frozenset({"cwd"})),
        call_env=["A"],
        cwd_roots=[str(tmp_path)],
    )
    assert adapter.declaration.accepted_settings == {"cwd"}
    with pytest.raises(errors.AdapterRefused, match="accepted_settings:env"):
        await adapter.invoke(call(settings=settings(env={"A": "1"})))


def test_config_may_not_widen_the_declaration() -> None:
    widening = DeclarationOverride(
        capabilities=MappingProxyType({Capability.STRUCTURED_OUTPUT: CapabilityState.SUPPORTED})
    )
    with pytest.raises(errors.ConfigError, match="structured_output"):
        command(["cat"], declaration=widening)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "argv"),
        ({"argv": []}, "argv"),
        ({"argv": "cat"}, "argv"),
        ({"argv": ["cat", 3]}, "argv[1]"),
        ({"argv": ["{prompt}"]}, "argv[0]"),
        ({"argv": [""]}, "argv[0]"),
        ({"argv": ["cat"], "timeout_seconds": 0}, "timeout_seconds"),
        ({"argv": ["cat"], "timeout_seconds": "1m"}, "timeout_seconds"),
        ({"argv": ["cat"], "cwd": "/no/such/dir"}, "cwd"),
        ({"argv": ["cat"], "env": {"A": 1}}, "env.A"),
        ({"argv": ["cat"], "output_cap_bytes": 0}, "output_cap_bytes"),
        ({"argv": ["cat"], "shell": True}, "shell"),
        ({"argv": ["no-such-agent-cli-xyz"]}, "argv[0]"),
        ({"argv": ["/etc/passwd"]}, "argv[0]"),  # not executable
        ({"argv": ["cat"], "call_env": "A"}, "call_env"),
        ({"argv": ["cat"], "call_env": ["A", ""]}, "call_env[1]"),
        ({"argv": ["cat"], "call_env": ["A=B"]}, "call_env[0]"),
        ({"argv": ["cat"], "call_env": ["PATH"]}, "call_env[0]"),
        ({"argv": ["cat"], "call_env": ["OK", "LD_PRELOAD"]}, "call_env[1]"),
        ({"argv": ["cat"], "call_env": ["PYTHONPATH"]}, "call_env[0]"),
        ({"argv": ["cat"], "call_env": ["BASH_ENV"]}, "call_env[0]"),
        ({"argv": ["cat"], "cwd_roots": ["relative/dir"]}, "cwd_roots[0]"),
        ({"argv": ["cat"], "cwd_roots": ["/no/such/dir"]}, "cwd_roots[0]"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(options: dict[str, Any], named: str) -> None:
    spec = AdapterSpec(shortname="cli", implementation="command", options=MappingProxyType(options))
    with pytest.raises(errors.ConfigError) as raised:
        build_adapter(spec)
    assert '"cli"' in raised.value.message
    assert f"`{named}`" in raised.value.message


def test_the_environment_of_this_test_is_unix() -> None:
    # start_new_session and killpg are POSIX; the adapter is not meant for Windows.
    assert os.name == "posix"


# --- process trees -------------------------------------------------------------------------


def escaping_script(tmp_path: Path, then: str, *, daemon: bool = False) -> tuple[Path, Path]:
    """A script whose grandchild leaves the session (setsid) and writes its own pid; then `then`.

    Without `daemon` the grandchild keeps stdout open; with it, it double-forks with stdio closed.
    """
    pidfile = tmp_path / "grandchild.pid"
    inner = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60'"
    start = f"( {inner} </dev/null >/dev/null 2>&1 & )" if daemon else f"{inner} &"
    script = tmp_path / "escaper.sh"
    script.write_text(f"#!/bin/sh\n{start}\nwhile [ ! -s {pidfile} ]; do sleep 0.01; done\n{then}\n")
    script.chmod(0o755)
    return script, pidfile


async def test_a_setsid_grandchild_holding_stdout_neither_holds_the_call_nor_outlives_it(
    tmp_path: Path,
) -> None:
    script, pidfile = escaping_script(tmp_path, "echo finished")
    started = time.monotonic()
    reply = await command([str(script)], timeout_seconds=30).invoke(call(time_budget=30))
    assert time.monotonic() - started < 3  # well under the 30 s timeout
    assert reply.text == "finished\n"
    assert await wait_gone(await read_pid(pidfile))


async def test_a_double_forked_daemon_does_not_outlive_the_call(tmp_path: Path) -> None:
    script, pidfile = escaping_script(tmp_path, "echo finished", daemon=True)
    reply = await command([str(script)], timeout_seconds=30).invoke(call())
    assert reply.text == "finished\n"
    assert await wait_gone(await read_pid(pidfile))


@pytest.mark.slow
async def test_a_timeout_kills_a_setsid_grandchild(tmp_path: Path) -> None:
    script, pidfile = escaping_script(tmp_path, "sleep 60")
    started = time.monotonic()
    with pytest.raises(errors.AdapterTimeout):
        await command([str(script)], timeout_seconds=0.5).invoke(call())
    assert time.monotonic() - started < 3
    assert await wait_gone(await read_pid(pidfile))


async def test_a_signal_death_is_reported_as_the_signal() -> None:
    with pytest.raises(errors.AdapterInternal) as raised:
        await command(["sh", "-c", "kill -SEGV $$"]).invoke(call())
    assert raised.value.cause == "was killed by signal 11"


# --- over a real negotiator process ----------------------------------------------------------


def fake_cat(directory: Path) -> Path:
    """A directory holding a `cat` that writes a marker file when it runs; the marker's path."""
    directory.mkdir()
    marker = directory / "fake-cat-ran"
    fake = directory / "cat"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\necho pwned\n")
    fake.chmod(0o755)
    return marker


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # A Unix socket path must fit in ~107 bytes; tmp_path may not.
    path = Path(tempfile.mkdtemp(prefix="cmd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def negotiator_process(
    socket_dir: Path, config: Path | None = None
) -> Iterator[tuple[subprocess.Popen[str], negotiator_pb2_grpc.NegotiatorServiceStub]]:
    target = f"unix:{socket_dir / 'negotiator.sock'}"
    flags = ["--config", str(config)] if config is not None else []
    process, _ = start_process([str(NEGOTIATOR_BIN), "serve", "--listen", target, *flags])
    try:
        with grpc.insecure_channel(target) as channel:
            yield process, negotiator_pb2_grpc.NegotiatorServiceStub(channel)
    finally:
        stop_process(process)


def invoke_request(agent: str, prompt: str = "hello", **settings: Any) -> pb.InvokeRequest:
    request = pb.InvokeRequest(agent=agent, prompt=prompt)
    request.options.settings.update(settings)
    return request


def refusal(stub: negotiator_pb2_grpc.NegotiatorServiceStub, request: pb.InvokeRequest) -> DecodedError:
    with pytest.raises(grpc.RpcError) as raised:
        stub.Invoke(request, timeout=20)
    return decode_error(raised.value)


@pytest.mark.slow
async def test_the_embedded_shell_echo_runs_no_program_a_caller_chooses(
    tmp_path: Path, socket_dir: Path
) -> None:
    marker = fake_cat(tmp_path / "x")
    with negotiator_process(socket_dir) as (_, stub):
        assert stub.Invoke(invoke_request("shell-echo", "plain"), timeout=20).text == "plain"
        hostile: list[dict[str, Any]] = [
            {"env": {"PATH": str(tmp_path / "x")}},
            {"env": {"LD_PRELOAD": str(tmp_path / "x" / "cat")}},
            {"env": {"LD_LIBRARY_PATH": str(tmp_path / "x")}},
            {"cwd": str(tmp_path / "x")},
        ]
        errors_seen = [
            await asyncio.to_thread(refusal, stub, invoke_request("shell-echo", **s)) for s in hostile
        ]
        declared = stub.GetAdapter(pb.GetAdapterRequest(shortname="shell-echo"), timeout=20).adapter
    for settings_sent, error in zip(hostile, errors_seen, strict=True):
        (name,) = settings_sent
        assert error.code is grpc.StatusCode.FAILED_PRECONDITION, (settings_sent, error)
        assert error.reason == "UNSUPPORTED_CAPABILITY", error
        assert error.metadata["gaps"] == f"accepted_settings:{name}", error
    assert not marker.exists()
    assert list(declared.declaration.accepted_settings) == ["timeout"]


SHAPED_CONFIG = """\
adapters:
  - shortname: shaped
    implementation: command
    options:
      argv: ["sh", "-c", "pwd; echo mode=$AGENT_MODE; cat"]
      call_env: [AGENT_MODE]
      cwd_roots: [{root}]
  - shortname: spawner
    implementation: command
    options:
      argv: [{spawner}]
      timeout_seconds: 60
"""


@pytest.mark.slow
async def test_call_env_and_cwd_roots_allow_exactly_what_the_operator_listed(
    tmp_path: Path, socket_dir: Path
) -> None:
    root = tmp_path / "root"
    inside = root / "work"
    inside.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    marker = fake_cat(tmp_path / "x")
    config = tmp_path / "negotiator.yaml"
    config.write_text(SHAPED_CONFIG.format(root=json.dumps(str(root)), spawner=json.dumps("true")))
    with negotiator_process(socket_dir, config) as (_, stub):
        allowed = stub.Invoke(
            invoke_request("shaped", "in", env={"AGENT_MODE": "batch"}, cwd=str(inside)), timeout=20
        )
        refused = {
            "PATH": refusal(stub, invoke_request("shaped", env={"PATH": str(tmp_path / "x")})),
            "LD_PRELOAD": refusal(stub, invoke_request("shaped", env={"LD_PRELOAD": "/x.so"})),
            "unlisted": refusal(stub, invoke_request("shaped", env={"OTHER": "1"})),
            "outside": refusal(stub, invoke_request("shaped", cwd=str(outside))),
            "dotdot": refusal(stub, invoke_request("shaped", cwd=f"{inside}/../../outside")),
            "symlink": refusal(stub, invoke_request("shaped", cwd=str(root / "escape"))),
        }
        declared = stub.GetAdapter(pb.GetAdapterRequest(shortname="shaped"), timeout=20).adapter
    assert allowed.text == f"{inside}\nmode=batch\nin"
    assert sorted(declared.declaration.accepted_settings) == ["cwd", "env", "timeout"]
    assert "setting env: PATH is a loader or search-path variable" in refused["PATH"].message
    assert "setting env: LD_PRELOAD is a loader or search-path variable" in refused["LD_PRELOAD"].message
    assert (
        "setting env: OTHER is not one of the adapter's call_env (AGENT_MODE)" in refused["unlisted"].message
    )
    for case in ("outside", "dotdot", "symlink"):
        assert "setting cwd:" in refused[case].message, refused[case]
        assert "is not inside the adapter's cwd_roots" in refused[case].message, refused[case]
    assert all(error.code is grpc.StatusCode.FAILED_PRECONDITION for error in refused.values()), refused
    assert not marker.exists()


@pytest.mark.slow
def test_a_config_listing_a_loader_variable_in_call_env_fails_start_up(tmp_path: Path) -> None:
    config = tmp_path / "negotiator.yaml"
    config.write_text(
        "adapters:\n  - shortname: leaky\n    implementation: command\n"
        "    options: {argv: [cat], call_env: [LD_PRELOAD]}\n"
    )
    done = subprocess.run(
        [str(NEGOTIATOR_BIN), "serve", "--config", str(config), "--listen", "unix:/tmp/never-bound.sock"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert 'adapter "leaky"' in done.stderr
    assert "call_env[0]" in done.stderr
    assert "LD_PRELOAD is a loader or search-path variable" in done.stderr


@pytest.mark.slow
async def test_a_negotiator_killed_mid_call_leaves_no_process_behind(
    tmp_path: Path, socket_dir: Path
) -> None:
    spawner, pidfile = escaping_script(tmp_path, f"echo $$ > {tmp_path / 'leader.pid'}\nsleep 60")
    config = tmp_path / "negotiator.yaml"
    config.write_text(SHAPED_CONFIG.format(root=json.dumps(str(tmp_path)), spawner=json.dumps(str(spawner))))
    with negotiator_process(socket_dir, config) as (process, stub):
        calling = stub.Invoke.future(invoke_request("spawner"), timeout=60)
        grandchild = await read_pid(pidfile)
        leader = await read_pid(tmp_path / "leader.pid")
        assert process_alive(grandchild)
        assert process_alive(leader)
        process.kill()
        process.wait(timeout=10)
        killed = time.monotonic()
        assert await wait_gone(leader, within=3.0), "the harness process outlived the negotiator"
        assert await wait_gone(grandchild, within=3.0), "the setsid grandchild outlived the negotiator"
        assert time.monotonic() - killed < 3.0
        with pytest.raises(grpc.RpcError):
            calling.result(timeout=10)
