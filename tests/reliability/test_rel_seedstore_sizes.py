"""Size cases against a real `seedstore serve` process: stores, files and watchers too big for one message.

* listing: a store whose unpaged ListSeeds reply would exceed the message
  limit lists completely, page by page, each reply under the limit;
* oversized files: a valid 5 MB seed and an alias bomb are problems; the
  server's memory barely moves and every other seed still lists;
* idle watchers: three WatchSeeds streams that never read while the store
  changes by tens of MB are each ended (ABORTED, WATCH_BACKLOG_EXCEEDED)
  once their backlog passes --watch-backlog-bytes; a watcher that reads gets everything.

Sizes (environment):
    RELIABILITY_LIST_SEEDS   seeds in the listed store (CI 10000 under a 1 MiB limit, full 40000 under 4 MiB)
    RELIABILITY_FULL=1       every default at full size
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore.v1 import seedstore_pb2_grpc
from tests.reliability.rel_support import Figures, Sidecar, Sizes, decoded, start_seedstore

FULL = Sizes.from_env(os.environ).full
LIST_SEEDS = int(os.environ.get("RELIABILITY_LIST_SEEDS", "40000" if FULL else "10000"))
LIMIT_BYTES = 4 * 1024 * 1024 if FULL else 1024 * 1024
MIB = 1024 * 1024


def write_store(store: Path, count: int) -> None:
    for number in range(count):
        domain = f"domain-{number % 20:02d}"
        directory = store / domain
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"seed-{number:06d}.yml").write_text(
            f"id: seed-{number:06d}\ndomain: {domain}\nkind: cli\ncommand: tool-{number}\n"
            f"provides:\n- text_to_speech\n- capability_{number:06d}\n"
        )


def test_a_store_too_big_for_one_reply_lists_page_by_page(
    tmp_path: Path,
    short_dir: Path,
    sidecars: Callable[[Sidecar], Sidecar],
    figures: Figures,
) -> None:
    home = tmp_path / "home"
    write_store(home / "capabilities", LIST_SEEDS)
    started = time.monotonic()
    seedstore = sidecars(
        start_seedstore(
            home,
            short_dir / "ss.sock",
            tmp_path / "seedstore.log",
            refresh_interval=30.0,
            extra_args=("--max-message-bytes", str(LIMIT_BYTES)),
        )
    )
    ready_s = time.monotonic() - started
    with SeedStoreClient(seedstore.target) as client:
        started = time.monotonic()
        pages = list(client.list_pages(page_size=10_000, timeout=60))
        list_s = time.monotonic() - started
        found = client.search_seeds(capability="text_to_speech", timeout=60)
    seeds = [entry.id for page in pages for entry in page.seeds]
    unpaged_bytes = sum(page.ByteSize() for page in pages)
    assert len(seeds) == len(set(seeds)) == LIST_SEEDS
    assert unpaged_bytes > LIMIT_BYTES  # one reply could not have held the listing
    assert max(page.ByteSize() for page in pages) <= LIMIT_BYTES
    assert found.total_candidates == LIST_SEEDS
    assert 0 < len(found.candidates) <= 1000
    figures.record(
        "seedstore_paging",
        {
            "seeds": LIST_SEEDS,
            "limit_bytes": LIMIT_BYTES,
            "listing_bytes": unpaged_bytes,
            "pages": len(pages),
            "largest_page_bytes": max(page.ByteSize() for page in pages),
            "start_s": round(ready_s, 2),
            "list_all_s": round(list_s, 2),
            "search_candidates_sent": len(found.candidates),
        },
    )


def test_oversized_files_are_problems_and_cost_no_memory(
    tmp_path: Path,
    short_dir: Path,
    sidecars: Callable[[Sidecar], Sidecar],
    figures: Figures,
) -> None:
    home = tmp_path / "home"
    write_store(home / "capabilities", 50)
    seedstore = sidecars(start_seedstore(home, short_dir / "ss.sock", tmp_path / "seedstore.log"))
    before_kib = seedstore.rss_kib()
    domain = home / "capabilities" / "domain-00"
    entry = "- text_to_speech_" + "x" * 100 + "\n"
    (domain / "big.yml").write_text(
        "id: big\ndomain: domain-00\nkind: cli\nprovides:\n" + entry * (15 * MIB // len(entry))
    )
    (domain / "bomb.yml").write_text(
        "id: bomb\ndomain: domain-00\nkind: cli\nprovides: [text_to_speech]\naliases:\n"
        "- &s '" + "voice " * 1000 + "'\n" + "- *s\n" * 200_000
    )
    with SeedStoreClient(seedstore.target) as client:
        deadline = time.monotonic() + 30
        while True:
            listed = client.list_all_seeds(timeout=30)
            if len(listed.problems) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    after_kib = seedstore.rss_kib()
    reasons = {Path(problem.path).name: problem.reason for problem in listed.problems}
    assert "more than the 1048576 a seed file may hold" in reasons["big.yml"]
    assert "expands to more than 1048576 bytes" in reasons["bomb.yml"]
    assert len(listed.seeds) == 50
    growth_mib = (after_kib - before_kib) / 1024
    assert growth_mib < 50
    figures.record(
        "seedstore_oversized_files",
        {"file_mib": 15, "alias_bomb_expanded_mib": 1200, "rss_growth_mib": round(growth_mib, 1)},
    )


def test_idle_watchers_pin_a_bounded_number_of_bytes(
    tmp_path: Path,
    short_dir: Path,
    sidecars: Callable[[Sidecar], Sidecar],
    figures: Figures,
) -> None:
    budget = 2 * MIB
    home = tmp_path / "home"
    seedstore = sidecars(
        start_seedstore(
            home,
            short_dir / "ss.sock",
            tmp_path / "seedstore.log",
            extra_args=("--watch-backlog-bytes", str(budget)),
        )
    )
    channel = grpc.insecure_channel(seedstore.target)
    stub = seedstore_pb2_grpc.SeedStoreServiceStub(channel)
    idle = [stub.WatchSeeds(pb.WatchSeedsRequest(), timeout=120) for _ in range(3)]
    for call in idle:
        call.initial_metadata()
    received: list[str] = []
    reading = stub.WatchSeeds(pb.WatchSeedsRequest(), timeout=120)
    reading.initial_metadata()

    def read() -> None:
        try:
            for event in reading:
                received.append(event.id)
        except grpc.RpcError:
            pass  # cancelled at the end of the test

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    before_kib = seedstore.rss_kib()
    provides = [f"capability_{number:05d}_" + "x" * 80 for number in range(4000)]  # ~400 KB a seed
    seeds = 40
    peak_kib = before_kib
    try:
        with SeedStoreClient(seedstore.target) as client:
            for number in range(seeds):
                client.add_seed(
                    pb.AddSeedRequest(id=f"big-{number}", domain="voice", kind="cli", provides=provides),
                    timeout=30,
                )
                peak_kib = max(peak_kib, seedstore.rss_kib())
        codes = []
        reasons = []
        for call in idle:
            try:
                for _ in call:
                    pass
            except grpc.RpcError as error:
                codes.append(error.code())
                reasons.append(decoded(error).reason)
        deadline = time.monotonic() + 30
        while len(received) < seeds and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for call in [*idle, reading]:
            call.cancel()  # type: ignore[no-untyped-call]
        reader.join(10)
        channel.close()
    assert codes == [grpc.StatusCode.ABORTED] * 3
    assert reasons == ["WATCH_BACKLOG_EXCEEDED"] * 3
    assert received == [f"big-{number}" for number in range(seeds)]
    figures.record(
        "seedstore_idle_watchers",
        {
            "idle_watchers": 3,
            "changes_mib": round(seeds * sum(len(p) for p in provides) / MIB, 1),
            "backlog_budget_mib": budget / MIB,
            "rss_growth_mib": round((peak_kib - before_kib) / 1024, 1),
        },
    )
