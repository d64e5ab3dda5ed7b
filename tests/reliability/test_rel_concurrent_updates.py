"""No update lost, no file torn: N processes updating shared seeds through the CLI and the service.

Each of N worker processes makes M updates, each adding its own provides value
(`w<worker>_<n>`) to one of a few shared seeds, mixing the local CLI path
(`python -m agentsidecar.seedstore_service.cli update`, one process per update, straight
on the files; every third update) and the RPC path (clients/seedstore.py against a real
`seedstore serve` process on the same store). Meanwhile this process keeps
reading every seed file and listing through the service. At the end every
value is in its seed's file and in the service's view, every read parsed,
and no temporary file is left.

Sizes (environment):
    RELIABILITY_PROCESSES     N worker processes (CI 4, full 8)
    RELIABILITY_UPDATES       M updates per process (CI 25, full 200)
    RELIABILITY_SHARED_SEEDS  how many seeds they share (3)
    RELIABILITY_FULL=1        every default at full size
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service.errors import SeedMalformed
from agentsidecar.seedstore_service.patch import AddSpec
from agentsidecar.seedstore_service.seedfile import parse_seed
from agentsidecar.seedstore_service.store import SeedStore
from tests.reliability.rel_support import (
    PYTHON,
    WORKER,
    Figures,
    Sidecar,
    Sizes,
    latency_summary,
    start_seedstore,
    wait_until,
)

DOMAIN = "shared"
BASE_CAPABILITY = "base_capability"


class Watcher:
    """Reads every seed file and lists through the service, over and over, until stopped."""

    def __init__(self, paths: list[Path], target: str) -> None:
        self._paths = paths
        self._target = target
        self._stop = threading.Event()
        self.file_reads = 0
        self.list_calls = 0
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, name="rel-watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        with SeedStoreClient(self._target, timeout=30) as client:
            while not self._stop.is_set():
                for path in self._paths:
                    try:
                        parse_seed(path.read_text(encoding="utf-8"), str(path))
                    except (OSError, SeedMalformed) as error:
                        self.failures.append(f"read {path}: {error}")
                    self.file_reads += 1
                try:
                    listing = client.list_seeds(pb.ListSeedsRequest(domain=DOMAIN))
                except SidecarError as error:
                    self.failures.append(f"ListSeeds: {error!r}")
                else:
                    self.failures.extend(f"ListSeeds problem: {problem}" for problem in listing.problems)
                    self.failures.extend(
                        f"ListSeeds listed {entry.path}" for entry in listing.seeds if ".tmp-" in entry.path
                    )
                self.list_calls += 1
                self._stop.wait(0.05)


def test_concurrent_cli_and_rpc_updates_on_shared_seeds_lose_nothing_and_tear_nothing(
    tmp_path: Path,
    short_dir: Path,
    sizes: Sizes,
    figures: Figures,
    sidecars: Callable[[Sidecar], Sidecar],
) -> None:
    home = tmp_path / "home"
    root = home / "capabilities"
    seed_ids = [f"shared-{number}" for number in range(sizes.shared_seeds)]
    store = SeedStore(root)
    for seed_id in seed_ids:
        store.add(AddSpec(id=seed_id, domain=DOMAIN, kind="cli", command="true", provides=(BASE_CAPABILITY,)))
    paths = [root / DOMAIN / f"{seed_id}.yml" for seed_id in seed_ids]
    server = sidecars(start_seedstore(home, short_dir / "ss.sock", tmp_path / "seedstore.log"))

    started = time.monotonic()
    with Watcher(paths, server.target) as watcher:
        workers = [
            subprocess.Popen(
                [
                    PYTHON,
                    str(WORKER),
                    "updates",
                    server.target,
                    str(home),
                    str(worker),
                    str(sizes.updates),
                    ",".join(seed_ids),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={key: value for key, value in os.environ.items() if not key.startswith("SKILLSPEC_")},
            )
            for worker in range(sizes.processes)
        ]
        reports = []
        for worker_process in workers:
            stdout, stderr = worker_process.communicate(timeout=60 + 3 * sizes.updates * sizes.processes)
            assert worker_process.returncode == 0, stderr
            reports.append(json.loads(stdout))
    elapsed = time.monotonic() - started

    # Every value is in the file of the seed it was written to: no update lost.
    expected: dict[str, set[str]] = {seed_id: {BASE_CAPABILITY} for seed_id in seed_ids}
    for report in reports:
        for seed_id, values in report["written"].items():
            expected[seed_id].update(values)
    for seed_id, path in zip(seed_ids, paths, strict=True):
        seed = parse_seed(path.read_text(encoding="utf-8"), str(path))
        assert set(seed.provides) == expected[seed_id], seed_id
        assert len(seed.provides) == len(expected[seed_id])
    total = sum(len(values) for values in expected.values()) - len(seed_ids)
    assert total == sizes.processes * sizes.updates

    # No reader ever saw a torn file, and the service never listed a problem or a temp file.
    assert watcher.failures == []
    assert watcher.file_reads > 0
    assert watcher.list_calls > 0
    assert sorted(os.listdir(root / DOMAIN)) == sorted(path.name for path in paths)

    # The service's index catches up with the CLI writes made behind its back.
    with SeedStoreClient(server.target) as client:

        def service_sees_everything() -> bool:
            try:
                return all(
                    set(client.inspect_seed(pb.InspectSeedRequest(id=seed_id)).seed.provides)
                    == expected[seed_id]
                    for seed_id in seed_ids
                )
            except SidecarError as error:
                if error.code is grpc.StatusCode.INTERNAL:
                    raise AssertionError(f"InspectSeed failed: {error!r}") from None
                return False

        assert wait_until(service_sees_everything, timeout=10)
    assert server.alive()

    cli_latencies = [value for report in reports for value in report["latencies"]["cli"]]
    rpc_latencies = [value for report in reports for value in report["latencies"]["rpc"]]
    figures.record(
        "concurrent_updates",
        {
            "processes": sizes.processes,
            "updates_per_process": sizes.updates,
            "shared_seeds": len(seed_ids),
            "updates_total": total,
            "cli_updates": len(cli_latencies),
            "rpc_updates": len(rpc_latencies),
            "duration_s": round(elapsed, 2),
            "updates_per_s": round(total / elapsed, 1),
            "concurrent_file_reads": watcher.file_reads,
            "concurrent_list_calls": watcher.list_calls,
            "lost_updates": 0,
            "torn_reads": 0,
            **latency_summary(cli_latencies, "cli_update"),
            **latency_summary(rpc_latencies, "rpc_update"),
        },
    )
