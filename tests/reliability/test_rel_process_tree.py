"""Process-tree containment through the real services: nothing a command starts outlives it.

Every case runs `escaper DIR [hang]`, a script that leaves three processes behind, each writing
its pid into DIR: a plain background `sleep`, a `sleep` that called setsid() and keeps the output
pipe open, and a double-forked daemon (setsid, stdio closed). Then it exits, or with `hang`
sleeps on.

* A seedstore check of `escaper` ends as soon as the script exits (not at its 30 s timeout), and
  every process it left is gone.
* A seedstore SIGKILLed mid-check, and a negotiator SIGKILLed mid-Invoke of a command adapter
  running `escaper DIR hang`: the script and all three leftovers are gone within seconds.
* The supervisor's added cost per run, measured in this process: a supervised `true` against a
  plain asyncio subprocess.

Figures: seconds until the check returned and until the tree was gone, leaks found (must be 0),
and the supervisor's cost in milliseconds. No size variable: every case runs once (the cost is
the mean of 20 runs each).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.negotiator.v1 import negotiator_pb2 as npb
from agentsidecar.negotiator.v1 import negotiator_pb2_grpc
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.sidecar_runtime import proctree
from tests.reliability.rel_support import Figures, Sidecar, is_gone, start_negotiator, start_seedstore

ESCAPER = """#!/bin/sh
dir="$1"
sleep 300 &
echo $! > "$dir/background"
setsid sh -c 'echo $$ > "$1"; exec sleep 301' _ "$dir/setsid" &
( setsid sh -c 'echo $$ > "$1"; exec sleep 302' _ "$dir/daemon" </dev/null >/dev/null 2>&1 & )
echo $$ > "$dir/leader"
while [ ! -s "$dir/setsid" ] || [ ! -s "$dir/daemon" ]; do sleep 0.01; done
if [ "$2" = hang ]; then sleep 303; fi
echo escaped
"""
LEFT_BEHIND = ("leader", "background", "setsid", "daemon")
GONE_WITHIN_SECONDS = 5.0
COST_RUNS = 20


def install_escaper(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "escaper"
    script.write_text(ESCAPER)
    script.chmod(0o755)
    return script


def wait_for_pids(directory: Path, within: float = 10.0) -> dict[str, int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        texts = {
            name: (directory / name).read_text().strip()
            for name in LEFT_BEHIND
            if (directory / name).exists()
        }
        if len(texts) == len(LEFT_BEHIND) and all(texts.values()):
            return {name: int(text) for name, text in texts.items()}
        time.sleep(0.01)
    raise AssertionError(f"escaper did not write every pid into {directory}")


def seconds_until_gone(pids: dict[str, int], since: float) -> tuple[float, list[str]]:
    """Seconds from `since` until every pid was gone (bounded), and the names still alive."""
    deadline = since + GONE_WITHIN_SECONDS
    while time.monotonic() < deadline and not all(is_gone(pid) for pid in pids.values()):
        time.sleep(0.01)
    return time.monotonic() - since, [name for name, pid in pids.items() if not is_gone(pid)]


def add_escaper_seed(client: SeedStoreClient, seed_id: str, script: Path, pid_dir: Path, *extra: str) -> None:
    client.add_seed(
        pb.AddSeedRequest(
            id=seed_id,
            domain="trees",
            kind="cli",
            provides=["escaping"],
            evidence_commands=[" ".join([str(script), str(pid_dir), *extra])],
        )
    )


@pytest.fixture
def seedstore(tmp_path: Path, short_dir: Path, sidecars: Callable[[Sidecar], Sidecar]) -> Sidecar:
    return sidecars(start_seedstore(tmp_path / "home", short_dir / "ss.sock", tmp_path / "seedstore.log"))


def test_a_check_ends_with_its_command_and_leaves_no_process(
    tmp_path: Path, seedstore: Sidecar, figures: Figures
) -> None:
    script = install_escaper(tmp_path / "bin")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    with SeedStoreClient(seedstore.target, timeout=60) as client:
        add_escaper_seed(client, "leaver", script, pid_dir)
        started = time.monotonic()
        request = pb.VerifySeedsRequest(ids=["leaver"])
        request.check_timeout.seconds = 30
        events = list(client.verify_seeds(request))
        returned = time.monotonic() - started
    pids = wait_for_pids(pid_dir)
    gone_after, alive = seconds_until_gone(pids, time.monotonic())
    (finished,) = [e.check_finished for e in events if e.HasField("check_finished")]
    figures.record(
        "process_tree_check",
        {
            "check_returned_s": round(returned, 3),
            "tree_gone_after_return_s": round(gone_after, 3),
            "leaks": len(alive),
        },
    )
    assert (finished.ok, finished.timed_out) == (True, False)
    assert returned < 5.0, "the check waited on a leftover holding its pipe"
    assert alive == []


def test_a_seedstore_killed_mid_check_leaves_no_process(
    tmp_path: Path, seedstore: Sidecar, figures: Figures
) -> None:
    script = install_escaper(tmp_path / "bin")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    ended: list[BaseException | None] = []

    def verify() -> None:
        with SeedStoreClient(seedstore.target, timeout=60) as client:
            try:
                request = pb.VerifySeedsRequest(ids=["hanger"])
                request.check_timeout.seconds = 120
                list(client.verify_seeds(request))
                ended.append(None)
            except Exception as error:  # the server dies under the stream
                ended.append(error)

    with SeedStoreClient(seedstore.target, timeout=60) as client:
        add_escaper_seed(client, "hanger", script, pid_dir, "hang")
    streaming = threading.Thread(target=verify)
    streaming.start()
    pids = wait_for_pids(pid_dir)
    killed = time.monotonic()
    seedstore.process.kill()
    seedstore.process.wait(timeout=10)
    gone_after, alive = seconds_until_gone(pids, killed)
    streaming.join(timeout=30)
    figures.record(
        "process_tree_seedstore_sigkill", {"tree_gone_s": round(gone_after, 3), "leaks": len(alive)}
    )
    assert alive == [], f"still running after the seedstore's SIGKILL: {alive}"
    assert ended
    assert ended[0] is not None


NEGOTIATOR_CONFIG = """\
adapters:
  - shortname: escaper
    implementation: command
    options:
      argv: {argv}
      timeout_seconds: 120
"""


def test_a_negotiator_killed_mid_call_leaves_no_process(
    tmp_path: Path, short_dir: Path, sidecars: Callable[[Sidecar], Sidecar], figures: Figures
) -> None:
    script = install_escaper(tmp_path / "bin")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    config = tmp_path / "negotiator.yaml"
    config.write_text(NEGOTIATOR_CONFIG.format(argv=json.dumps([str(script), str(pid_dir), "hang"])))
    negotiator = sidecars(start_negotiator(config, short_dir / "n.sock", tmp_path / "negotiator.log"))
    with grpc.insecure_channel(negotiator.target) as channel:
        stub = negotiator_pb2_grpc.NegotiatorServiceStub(channel)
        calling = stub.Invoke.future(npb.InvokeRequest(agent="escaper", prompt="go"), timeout=120)
        pids = wait_for_pids(pid_dir)
        killed = time.monotonic()
        negotiator.process.kill()
        negotiator.process.wait(timeout=10)
        gone_after, alive = seconds_until_gone(pids, killed)
        with pytest.raises(grpc.RpcError):
            calling.result(timeout=30)
    figures.record(
        "process_tree_negotiator_sigkill", {"tree_gone_s": round(gone_after, 3), "leaks": len(alive)}
    )
    assert alive == [], f"still running after the negotiator's SIGKILL: {alive}"


async def _supervised_true() -> None:
    run = await proctree.start("/bin/true", ["true"], env={})
    await run.exited.wait()
    await run.finish()


async def _plain_true() -> None:
    process = await asyncio.create_subprocess_exec(
        "/bin/true", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={}
    )
    await process.communicate()


async def _mean_ms(run_once: Callable[[], Awaitable[None]]) -> float:
    times = []
    for _ in range(COST_RUNS):
        started = time.perf_counter()
        await run_once()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.mean(times)


async def test_the_supervisors_cost_per_run(figures: Figures) -> None:
    plain = await _mean_ms(_plain_true)
    supervised = await _mean_ms(_supervised_true)
    figures.record(
        "process_tree_cost",
        {
            "plain_run_ms": round(plain, 2),
            "supervised_run_ms": round(supervised, 2),
            "added_ms": round(supervised - plain, 2),
            "runs": COST_RUNS,
        },
    )
    assert supervised - plain < 500  # a sanity bound; the figure is what matters
