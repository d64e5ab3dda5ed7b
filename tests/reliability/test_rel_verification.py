"""Verification safety through the real service: no shell, whole-group timeouts, capped output.

Seeds are added and verified over gRPC against a `seedstore serve` process
whose check PATH holds a few test scripts:

* Shell metacharacters are inert: evidence commands full of `;`, `|`,
  `$(...)`, backticks, `&&`, `||`, `&`, redirections, newlines and `${IFS}`
  run without a shell. `record-args OUT ...` writes the argv it received to
  OUT; it must be exactly the POSIX split of the command (the metacharacters
  arrive as plain arguments) and none of the `touch` targets may exist.
  Commands whose program is a metacharacter construct fail to start.
* A timeout kills the whole process group: `fork-and-sleep PIDFILE` leaves a
  background `sleep`, and a `sleep` in a subshell, and waits. With a 1 s
  check timeout the check reports timed_out, and afterwards the script and
  both sleeps are gone (absent from /proc, or zombies: PID 1 here does not
  reap orphans).
* Output is capped: a command printing 50 MB completes quickly with
  output_truncated set, an endless `yes` is stopped by its timeout, and the
  service answers other calls promptly throughout, without its memory
  following the output.

No size variable: every case runs once.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from tests.reliability.rel_support import (
    Figures,
    Sidecar,
    is_gone,
    latency_summary,
    start_seedstore,
)

FLOOD_BYTES = 50 * 1024 * 1024
RECORD_ARGS = """#!/bin/sh
out="$1"
shift
: > "$out"
for arg in "$@"; do printf '%s\\0' "$arg" >> "$out"; done
"""
FORK_AND_SLEEP = """#!/bin/sh
sleep 300 &
first=$!
( sleep 301 & echo $! > "$1.sub" )
echo "$$ $first $(cat "$1.sub")" > "$1"
wait
"""


def install(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(body)
    path.chmod(0o755)


@pytest.fixture
def service(
    tmp_path: Path, short_dir: Path, sidecars: Callable[[Sidecar], Sidecar]
) -> Iterator[tuple[Sidecar, SeedStoreClient]]:
    tools = tmp_path / "bin"
    tools.mkdir()
    install(tools, "record-args", RECORD_ARGS)
    install(tools, "fork-and-sleep", FORK_AND_SLEEP)
    server = sidecars(
        start_seedstore(
            tmp_path / "home",
            short_dir / "ss.sock",
            tmp_path / "seedstore.log",
            check_path=f"{tools}:/usr/bin:/bin",
        )
    )
    with SeedStoreClient(server.target, timeout=60) as client:
        yield server, client


def add_seed(client: SeedStoreClient, seed_id: str, *evidence: str) -> None:
    client.add_seed(
        pb.AddSeedRequest(
            id=seed_id, domain="checks", kind="cli", provides=["checking"], evidence_commands=list(evidence)
        )
    )


def verify(
    client: SeedStoreClient, seed_id: str, timeout_seconds: float | None = None
) -> list[pb.VerifySeedsResponse]:
    request = pb.VerifySeedsRequest(ids=[seed_id])
    if timeout_seconds is not None:
        request.check_timeout.CopyFrom(duration_pb2.Duration(seconds=int(timeout_seconds)))
    return list(client.verify_seeds(request))


def finished_checks(events: list[pb.VerifySeedsResponse]) -> list[pb.CheckFinished]:
    return [event.check_finished for event in events if event.HasField("check_finished")]


def test_shell_metacharacters_in_evidence_commands_are_inert(
    tmp_path: Path, service: tuple[Sidecar, SeedStoreClient], figures: Figures
) -> None:
    _, client = service
    markers = tmp_path / "markers"
    markers.mkdir()
    payloads = {
        "semicolon": f"a; touch {markers}/semicolon",
        "pipe": f"a | touch {markers}/pipe",
        "substitution": f"$(touch {markers}/substitution)",
        "backticks": f"`touch {markers}/backticks`",
        "and": f"true && touch {markers}/and",
        "or": f"false || touch {markers}/or",
        "background": f"a & touch {markers}/background",
        "redirect": f"a > {markers}/redirect",
        "append": f"a >> {markers}/append",
        "stderr": f"a 2> {markers}/stderr",
        "stdin": "a < /etc/passwd",
        "newline": f"a\ntouch {markers}/newline",
        "ifs": f"a${{IFS}}touch${{IFS}}{markers}/ifs",
        "quoted": f"'a; touch {markers}/quoted' \"$(touch {markers}/double)\"",
        "variable": "$HOME ${PATH} $0 ~",
    }
    outputs = {name: tmp_path / f"args-{name}" for name in payloads}
    commands = [f"record-args {outputs[name]} {payload}" for name, payload in payloads.items()]
    # Programs made of metacharacters are looked up literally, and not found.
    commands += [f";touch {markers}/program-semicolon", f"$(touch {markers}/program-substitution)"]
    add_seed(client, "metachars", *commands)

    checks = finished_checks(verify(client, "metachars"))

    assert len(checks) == len(commands)
    for check in checks[: len(payloads)]:
        assert check.ok, check
        assert check.exit_code == 0, check
    for check in checks[len(payloads) :]:
        assert not check.ok, check
        assert "No such file or directory" in check.message, check
    for name, payload in payloads.items():
        received = outputs[name].read_bytes().split(b"\0")[:-1]
        assert [arg.decode() for arg in received] == shlex.split(payload), name
    assert sorted(path.name for path in markers.iterdir()) == []
    figures.record(
        "verification_metacharacters",
        {"commands": len(commands), "argv_exact": len(payloads), "files_created_by_metacharacters": 0},
    )


def test_a_check_timeout_kills_the_whole_process_group(
    tmp_path: Path, service: tuple[Sidecar, SeedStoreClient], figures: Figures
) -> None:
    _, client = service
    pid_file = tmp_path / "pids"
    add_seed(client, "forker", f"fork-and-sleep {pid_file}")

    started = time.monotonic()
    checks = finished_checks(verify(client, "forker", timeout_seconds=1))
    elapsed = time.monotonic() - started

    assert len(checks) == 1
    assert checks[0].timed_out
    assert not checks[0].ok
    assert "timed out after 1s" in checks[0].message
    assert elapsed < 5
    pids = [int(pid) for pid in pid_file.read_text().split()]
    assert len(pids) == 3  # the script, its background sleep, and the subshell's sleep
    deadline = time.monotonic() + 5
    while not all(is_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if not is_gone(pid)] == []
    figures.record(
        "verification_timeout",
        {
            "check_timeout_s": 1,
            "verify_call_s": round(elapsed, 2),
            "processes_left_running": 0,
            "pids_checked": 3,
        },
    )


class Responsiveness:
    """Lists seeds in a loop while a flood is verified; keeps the latencies."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._stop = threading.Event()
        self.latencies: list[float] = []
        self._thread = threading.Thread(target=self._run, name="rel-responsiveness", daemon=True)

    def __enter__(self) -> Responsiveness:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with SeedStoreClient(self._target, timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                client.list_seeds(pb.ListSeedsRequest())
                self.latencies.append(time.monotonic() - started)
                self._stop.wait(0.02)


def test_output_is_capped_and_the_service_stays_responsive(
    service: tuple[Sidecar, SeedStoreClient], figures: Figures
) -> None:
    server, client = service
    add_seed(client, "flood", f"head -c {FLOOD_BYTES} /dev/zero")
    add_seed(client, "endless", "yes endless output")
    rss_before = server.rss_kib()

    with Responsiveness(server.target) as probe:
        started = time.monotonic()
        flood = finished_checks(verify(client, "flood"))
        flood_seconds = time.monotonic() - started
        started = time.monotonic()
        endless = finished_checks(verify(client, "endless", timeout_seconds=2))
        endless_seconds = time.monotonic() - started
    rss_after = server.rss_kib()

    assert [(check.ok, check.output_truncated) for check in flood] == [(True, True)]
    assert flood_seconds < 15
    assert [(check.timed_out, check.output_truncated) for check in endless] == [(True, True)]
    assert endless_seconds < 6
    assert probe.latencies
    assert max(probe.latencies) < 2.0
    # 64 KiB are kept; the rest is read and dropped, not buffered.
    assert rss_after - rss_before < 32 * 1024
    figures.record(
        "verification_output_cap",
        {
            "flood_bytes": FLOOD_BYTES,
            "flood_verify_s": round(flood_seconds, 2),
            "flood_mb_per_s": round(FLOOD_BYTES / 1e6 / flood_seconds, 1),
            "endless_verify_s_with_2s_timeout": round(endless_seconds, 2),
            "service_rss_kib_before": rss_before,
            "service_rss_kib_after": rss_after,
            "list_calls_during": len(probe.latencies),
            **latency_summary(probe.latencies, "list_during_flood"),
        },
    )
