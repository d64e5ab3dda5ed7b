"""A writer killed with SIGKILL mid-write, K times, while the service keeps serving the same store.

The writer (`rel_worker.py churn`) rewrites one seed through SeedStore forever,
alternating a short and a long version, with every os.write cut into slow
256-byte pieces so a kill at a random moment often lands inside a write. After
each kill every seed file must parse (seedfile.parse_seed) and a fresh load
must report no problem. Meanwhile a prober thread calls the running
`seedstore serve` (list, inspect, search, and updates of another seed, which
contend for the same lock): it must never see a problem, never list a
temporary file, and never get an error outside the documented taxonomy.

Sizes (environment):
    RELIABILITY_KILLS   K kills (CI 20, full 50)
    RELIABILITY_FULL=1  every default at full size
"""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agentsidecar.clients.errors import SidecarError
from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service.patch import AddSpec
from agentsidecar.seedstore_service.seedfile import parse_seed
from agentsidecar.seedstore_service.store import SeedStore
from tests.reliability.rel_support import (
    PYTHON,
    WORKER,
    Figures,
    Sidecar,
    Sizes,
    clean_env,
    latency_summary,
    seedstore_error_problem,
    start_seedstore,
)
from tests.reliability.rel_worker import BULK_SIZE

DOMAIN = "voice"
CHURNED = "churned"
STEADY = "steady"
CAPABILITY = "text_to_speech"


class Prober:
    """Calls the service in a loop and keeps everything that looks wrong."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._stop = threading.Event()
        self.calls = 0
        self.documented_errors: list[str] = []
        self.violations: list[str] = []
        self.latencies: list[float] = []
        self._thread = threading.Thread(target=self._run, name="rel-prober", daemon=True)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _check_paths(self, what: str, paths: list[str]) -> None:
        self.violations.extend(f"{what} returned temp file {path}" for path in paths if ".tmp-" in path)

    def _run(self) -> None:
        turn = 0
        with SeedStoreClient(self._target, timeout=60) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    if turn % 4 == 0:
                        listing = client.list_seeds(pb.ListSeedsRequest())
                        self.violations.extend(f"ListSeeds problem {p}" for p in listing.problems)
                        self._check_paths("ListSeeds", [entry.path for entry in listing.seeds])
                    elif turn % 4 == 1:
                        inspected = client.inspect_seed(pb.InspectSeedRequest(id=CHURNED))
                        self.violations.extend(f"InspectSeed problem {p}" for p in inspected.problems)
                        self._check_paths("InspectSeed", [inspected.path])
                    elif turn % 4 == 2:
                        found = client.search_seeds(pb.SearchSeedsRequest(capability=CAPABILITY))
                        self.violations.extend(f"SearchSeeds problem {p}" for p in found.problems)
                        if {candidate.id for candidate in found.candidates} != {CHURNED, STEADY}:
                            self.violations.append(f"SearchSeeds found {[c.id for c in found.candidates]}")
                    else:
                        value = f"probe_{turn}"
                        client.update_seed(pb.UpdateSeedRequest(id=STEADY, add_provides=[value]))
                        client.update_seed(pb.UpdateSeedRequest(id=STEADY, remove_provides=[value]))
                except SidecarError as error:
                    problem = seedstore_error_problem(error.decoded)
                    if problem is None:
                        self.documented_errors.append(f"{error.code.name} {error.reason}")
                    else:
                        self.violations.append(problem)
                self.latencies.append(time.monotonic() - started)
                self.calls += 1
                turn += 1


def start_churn(root: Path) -> subprocess.Popen[str]:
    writer = subprocess.Popen(
        [PYTHON, str(WORKER), "churn", str(root), CHURNED],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert writer.stdout is not None
    ready, _, _ = select.select([writer.stdout], [], [], 30)
    assert ready, "the writer never became ready"
    assert writer.stdout.readline().strip() == "ready"
    return writer


def test_a_writer_killed_mid_write_never_leaves_a_torn_or_visible_temp_file(
    tmp_path: Path,
    short_dir: Path,
    sizes: Sizes,
    figures: Figures,
    sidecars: Callable[[Sidecar], Sidecar],
) -> None:
    root = tmp_path / "home" / "capabilities"
    store = SeedStore(root)
    for seed_id in (CHURNED, STEADY):
        store.add(AddSpec(id=seed_id, domain=DOMAIN, kind="cli", command="say", provides=(CAPABILITY,)))
    expected_paths = [str(root / DOMAIN / f"{CHURNED}.yml"), str(root / DOMAIN / f"{STEADY}.yml")]
    server = sidecars(
        start_seedstore(root.parent, short_dir / "ss.sock", tmp_path / "seedstore.log", refresh_interval=0.05)
    )
    chooser = random.Random(20_261_104)
    provides_counts_seen: set[int] = set()

    started = time.monotonic()
    with Prober(server.target) as prober:
        for _ in range(sizes.kills):
            writer = start_churn(root)
            # Let it rewrite for a random while, then kill it wherever it is (often mid-write).
            time.sleep(chooser.uniform(0.0, 0.04))
            os.kill(writer.pid, signal.SIGKILL)
            writer.communicate(timeout=10)
            assert writer.returncode == -signal.SIGKILL

            for path in root.rglob("*"):
                if path.name.endswith((".yml", ".yaml")):
                    parse_seed(path.read_text(encoding="utf-8"), str(path))  # SeedMalformed if torn
            scope = store.load(None)
            assert scope.problems == ()
            assert [stored.path for stored in scope.seeds] == expected_paths
            churned = next(stored for stored in scope.seeds if stored.seed.id == CHURNED)
            provides_counts_seen.add(len(churned.seed.provides))
        time.sleep(0.2)  # a last refresh of the index over the final state
    elapsed = time.monotonic() - started

    # Kills did land mid-write: their temp files are left over, and nothing ever loaded them.
    leftovers = sorted(name for name in os.listdir(root / DOMAIN) if not name.endswith(".yml"))
    assert leftovers, "no kill landed mid-write; the test proved nothing"
    assert all(name.startswith(f".{CHURNED}.yml.tmp-") for name in leftovers), leftovers
    assert prober.violations == []
    assert prober.calls > 0
    assert provides_counts_seen <= {1, 1 + BULK_SIZE}

    # A killed lock holder leaves no stale lock: the service writes the churned seed at once.
    with SeedStoreClient(server.target, timeout=10) as client:
        try:
            updated = client.update_seed(pb.UpdateSeedRequest(id=CHURNED, kind="adapter"))
        except SidecarError as error:
            raise AssertionError(f"update after the kills failed: {error!r}") from None
        assert updated.seed.kind == "adapter"
        assert client.list_seeds(pb.ListSeedsRequest()).problems == []
    assert server.alive()

    figures.record(
        "sigkill_writer",
        {
            "kills": sizes.kills,
            "temp_files_left_by_kills_mid_write": len(leftovers),
            "versions_seen_after_kills": sorted(provides_counts_seen),
            "torn_files": 0,
            "service_calls_during_kills": prober.calls,
            "service_documented_errors": len(prober.documented_errors),
            "service_undocumented_errors_or_problems": len(prober.violations),
            "duration_s": round(elapsed, 2),
            **latency_summary(prober.latencies, "service_call"),
        },
    )
