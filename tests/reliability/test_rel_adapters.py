"""Adapters that crash, hang or answer garbage: mapped statuses, and the negotiator keeps serving.

One real `negotiator serve` process runs the whole module. Its adapters:

* tests/negotiator/remote_double.py processes, registered at runtime, SIGKILLed in the
  middle of a call (UNAVAILABLE, ADAPTER_UNAVAILABLE), or hanging, either
  sleeping inside the call or frozen with SIGSTOP (DEADLINE_EXCEEDED at the
  caller's deadline);
* command adapters that die by SIGSEGV, exit 139, die by SIGKILL, flood
  stdout past their cap (INTERNAL, ADAPTER_INTERNAL), print binary noise (an
  OK reply with replacement characters) or hang (DEADLINE_EXCEEDED, and their
  process is gone afterwards);
* a scripted adapter whose Produce answers "not json" (INTERNAL,
  OUTPUT_SCHEMA_VIOLATION);
* an openai adapter against tests/negotiator/mock_openai.py answering a
  non-JSON body or no choices (INTERNAL, ADAPTER_INTERNAL), HTTP 500
  (UNAVAILABLE) or never (DEADLINE_EXCEEDED).

After every case the negotiator still lists its adapters, answers a normal
Invoke, and reports SERVING on grpc.health.v1.

No size variable: every case runs once.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from mock_openai import MockOpenAI

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.negotiator import NegotiatorClient
from agentsidecar.negotiator.v1 import negotiator_pb2 as pb
from tests.reliability.rel_support import (
    NEGOTIATOR_DOMAIN,
    Figures,
    Sidecar,
    health,
    is_gone,
    make_short_dir,
    start_negotiator,
    start_remote_adapter,
)

API_KEY_ENV = "RELIABILITY_FAKE_OPENAI_KEY"
DEADLINE_SECONDS = 1.5
# How late a deadline may be reported on a loaded two-core machine.
DEADLINE_SLACK_SECONDS = 1.5

CONFIG = """\
adapters:
  - shortname: steady
    implementation: scripted
    declaration: {{kind: agent-framework}}
    options: {{invoke: {{echo: true}}}}
  - shortname: garbage-produce
    implementation: scripted
    declaration:
      kind: agent-framework
      capabilities: {{structured_output: supported}}
    options: {{produce: {{text: "not json"}}}}
  - shortname: segfault
    implementation: command
    options: {{argv: ["sh", "-c", "echo about to crash >&2; kill -SEGV $$"]}}
  - shortname: exit-139
    implementation: command
    options: {{argv: ["sh", "-c", "exit 139"]}}
  - shortname: sigkilled
    implementation: command
    options: {{argv: ["sh", "-c", "kill -KILL $$"]}}
  - shortname: flood
    implementation: command
    options: {{argv: ["yes", "flood"], output_cap_bytes: 1048576}}
  - shortname: binary-noise
    implementation: command
    options: {{argv: ["head", "-c", "65536", "/dev/urandom"]}}
  - shortname: hang-command
    implementation: command
    options: {{argv: ["sleep", "300"]}}
  - shortname: llm
    implementation: openai
    options:
      base_url: "{base_url}"
      api_key_env: {api_key_env}
      model: mock-model
      timeout_seconds: 30
"""


@dataclass
class Rig:
    negotiator: Sidecar
    client: NegotiatorClient
    mock: MockOpenAI
    socket_dir: Path
    log_dir: Path
    outcomes: dict[str, dict[str, object]]
    remotes_started: int = 0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory, figures: Figures) -> Iterator[Rig]:
    directory = tmp_path_factory.mktemp("adapters")
    socket_dir = make_short_dir("rel-ad-")
    with MockOpenAI() as mock:
        config = directory / "negotiator.yaml"
        config.write_text(CONFIG.format(base_url=mock.base_url, api_key_env=API_KEY_ENV))
        negotiator = start_negotiator(
            config, socket_dir / "ng.sock", directory / "negotiator.log", extra_env={API_KEY_ENV: "sk-mock"}
        )
        client = NegotiatorClient(negotiator.target, timeout=30)
        rig = Rig(negotiator, client, mock, socket_dir, directory, {})
        try:
            yield rig
            assert negotiator.alive(), negotiator.log_tail()
            figures.record(
                "adapter_failures",
                {
                    "cases": rig.outcomes,
                    "negotiator_rss_kib_after": negotiator.rss_kib(),
                    "health_after": "SERVING",
                },
            )
        finally:
            client.close()
            negotiator.stop()
            shutil.rmtree(socket_dir, ignore_errors=True)


def assert_still_serving(rig: Rig) -> None:
    assert rig.negotiator.alive(), rig.negotiator.log_tail()
    names = {adapter.declaration.shortname for adapter in rig.client.list_adapters()}
    assert {"steady", "segfault", "llm"} <= names
    reply = rig.client.invoke(pb.InvokeRequest(adapter="steady", prompt="still there?"), timeout=10)
    assert reply.text == "still there?"
    assert health(rig.negotiator.target) == "SERVING"


def failing_call(call: Callable[[], object]) -> tuple[SidecarError, float]:
    started = time.monotonic()
    with pytest.raises(SidecarError) as caught:
        call()
    return caught.value, time.monotonic() - started


def record(rig: Rig, case: str, error: SidecarError, elapsed: float) -> None:
    rig.outcomes[case] = {
        "code": error.code.name,
        "reason": error.reason,
        "elapsed_ms": round(elapsed * 1000),
    }


def assert_error_info(error: SidecarError, code: grpc.StatusCode, reason: str) -> None:
    assert error.code is code, error
    assert error.reason == reason, error
    assert error.domain == NEGOTIATOR_DOMAIN, error


def assert_deadline(error: SidecarError, elapsed: float) -> None:
    assert error.code is grpc.StatusCode.DEADLINE_EXCEEDED, error
    assert DEADLINE_SECONDS * 0.9 <= elapsed <= DEADLINE_SECONDS + DEADLINE_SLACK_SECONDS, elapsed


@pytest.fixture
def remote(rig: Rig) -> Iterator[Sidecar]:
    """A remote adapter process, registered as "echo-remote" and deregistered afterwards."""
    # A fresh address each time keeps the cases independent of one another.
    rig.remotes_started += 1
    name = f"remote-{rig.remotes_started}"
    adapter = start_remote_adapter(
        rig.socket_dir / f"{name}.sock", rig.log_dir / f"{name}.log", "echo-remote"
    )
    try:
        registered = rig.client.register_adapter(adapter.target, "echo-remote")
        assert registered.declaration.shortname == "echo-remote"
        try:
            yield adapter
        finally:
            rig.client.deregister_adapter("echo-remote")
    finally:
        adapter.stop()


def test_a_remote_adapter_killed_mid_call_is_unavailable_with_error_info(rig: Rig, remote: Sidecar) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(
            rig.client.invoke, pb.InvokeRequest(adapter="echo-remote", prompt="sleep:20"), timeout=30
        )
        time.sleep(0.5)  # the call is now inside the adapter's sleep
        assert not pending.done()
        killed_at = time.monotonic()
        os.kill(remote.pid, signal.SIGKILL)
        with pytest.raises(SidecarError) as caught:
            pending.result(timeout=30)
        elapsed = time.monotonic() - killed_at
    assert_error_info(caught.value, grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE")
    assert caught.value.metadata["adapter"] == "echo-remote"
    assert elapsed < 5
    record(rig, "remote_sigkill_mid_call", caught.value, elapsed)

    # The dead adapter keeps failing fast and mapped, not hanging.
    error, elapsed = failing_call(
        lambda: rig.client.invoke(pb.InvokeRequest(adapter="echo-remote", prompt="hello"), timeout=10)
    )
    assert_error_info(error, grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE")
    assert elapsed < 5
    record(rig, "remote_dead_next_call", error, elapsed)
    assert_still_serving(rig)


@pytest.mark.parametrize("how", ["sleeps", "frozen"])
def test_a_remote_adapter_that_hangs_hits_the_callers_deadline(rig: Rig, remote: Sidecar, how: str) -> None:
    prompt = "sleep:30" if how == "sleeps" else "hello"
    if how == "frozen":
        os.kill(remote.pid, signal.SIGSTOP)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(
                failing_call,
                lambda: rig.client.invoke(
                    pb.InvokeRequest(adapter="echo-remote", prompt=prompt), timeout=DEADLINE_SECONDS
                ),
            )
            # While one call hangs, the negotiator answers others.
            assert rig.client.invoke(pb.InvokeRequest(adapter="steady", prompt="meanwhile"), timeout=5).text
            error, elapsed = pending.result(timeout=30)
    finally:
        os.kill(remote.pid, signal.SIGCONT)
    assert_deadline(error, elapsed)
    record(rig, f"remote_hang_{how}", error, elapsed)
    assert_still_serving(rig)


@pytest.mark.parametrize(
    ("shortname", "cause"),
    [
        ("segfault", "killed by signal 11"),
        ("exit-139", "exited with 139"),
        ("sigkilled", "killed by signal 9"),
        ("flood", "output exceeded output_cap_bytes"),
    ],
)
def test_a_crashing_or_flooding_command_adapter_is_adapter_internal(
    rig: Rig, shortname: str, cause: str
) -> None:
    error, elapsed = failing_call(
        lambda: rig.client.invoke(pb.InvokeRequest(agent=shortname, prompt="do it"), timeout=30)
    )
    assert_error_info(error, grpc.StatusCode.INTERNAL, "ADAPTER_INTERNAL")
    assert cause in error.metadata["cause"], error
    assert elapsed < 10
    record(rig, f"command_{shortname}", error, elapsed)
    assert_still_serving(rig)


def test_a_command_adapter_printing_binary_noise_answers_replacement_text(rig: Rig) -> None:
    reply = rig.client.invoke(pb.InvokeRequest(agent="binary-noise", prompt="noise"), timeout=30)
    assert len(reply.text) > 1000
    assert "\ufffd" in reply.text
    rig.outcomes["command_binary_noise"] = {"code": "OK", "text_chars": len(reply.text)}
    assert_still_serving(rig)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def test_a_hanging_command_adapter_hits_the_deadline_and_its_process_is_killed(rig: Rig) -> None:
    before = set(children_of(rig.negotiator.pid))
    error, elapsed = failing_call(
        lambda: rig.client.invoke(
            pb.InvokeRequest(agent="hang-command", prompt="wait"), timeout=DEADLINE_SECONDS
        )
    )
    assert_deadline(error, elapsed)
    record(rig, "command_hang", error, elapsed)
    # No `sleep 300` outlives the call.
    leftover = set(children_of(rig.negotiator.pid)) - before
    deadline = time.monotonic() + 5
    while leftover and time.monotonic() < deadline:
        time.sleep(0.05)
        leftover = {pid for pid in leftover if not is_gone(pid)}
    assert leftover == set()
    assert_still_serving(rig)


def test_a_produce_answering_not_json_is_output_schema_violation(rig: Rig) -> None:
    request = pb.ProduceRequest(
        adapter="garbage-produce", prompt="give json", output_schema='{"type": "object"}'
    )
    error, elapsed = failing_call(lambda: rig.client.produce(request, timeout=10))
    assert_error_info(error, grpc.StatusCode.INTERNAL, "OUTPUT_SCHEMA_VIOLATION")
    assert "not valid JSON" in error.message
    record(rig, "scripted_produce_not_json", error, elapsed)
    assert_still_serving(rig)


@pytest.mark.parametrize(
    ("mode", "code", "reason"),
    [
        ("malformed", grpc.StatusCode.INTERNAL, "ADAPTER_INTERNAL"),
        ("no_choices", grpc.StatusCode.INTERNAL, "ADAPTER_INTERNAL"),
        ("500", grpc.StatusCode.UNAVAILABLE, "ADAPTER_UNAVAILABLE"),
        ("hang", grpc.StatusCode.DEADLINE_EXCEEDED, ""),
    ],
)
def test_an_openai_server_answering_garbage_is_mapped(
    rig: Rig, mode: str, code: grpc.StatusCode, reason: str
) -> None:
    rig.mock.mode = mode
    try:
        timeout = DEADLINE_SECONDS if mode == "hang" else 30
        error, elapsed = failing_call(
            lambda: rig.client.invoke(pb.InvokeRequest(adapter="llm", prompt="hi"), timeout=timeout)
        )
    finally:
        rig.mock.mode = "ok"
    if mode == "hang":
        assert_deadline(error, elapsed)
    else:
        assert_error_info(error, code, reason)
    record(rig, f"openai_{mode}", error, elapsed)
    assert_still_serving(rig)
    # The adapter itself recovers once the provider does.
    assert (
        rig.client.invoke(pb.InvokeRequest(adapter="llm", prompt="hi"), timeout=10).text
        == rig.mock.reply_text
    )


# Regression: connect_remote used grpc's global subchannel pool, so a channel still open to the
# dead adapter made its restarted process unreachable until the reconnect backoff (1 s, growing) expired.
def test_a_remote_adapter_restarted_at_the_same_address_registers_at_once(rig: Rig) -> None:
    socket_path = rig.socket_dir / "restarted.sock"
    first = start_remote_adapter(socket_path, rig.log_dir / "restarted-1.log", "restarted")
    second: Sidecar | None = None
    try:
        rig.client.register_adapter(first.target, "restarted")
        os.kill(first.pid, signal.SIGKILL)
        first.stop()
        with pytest.raises(SidecarError):
            rig.client.invoke(pb.InvokeRequest(adapter="restarted", prompt="hello"), timeout=10)
        rig.client.deregister_adapter("restarted")
        second = start_remote_adapter(socket_path, rig.log_dir / "restarted-2.log", "restarted")
        try:
            registered = rig.client.register_adapter(second.target, "restarted")
        finally:
            assert_still_serving(rig)
        assert registered.declaration.shortname == "restarted"
        rig.client.deregister_adapter("restarted")
    finally:
        first.stop()
        if second is not None:
            second.stop()
