"""Durability across real processes: no lost update under contention, no torn file after SIGKILL."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agentsidecar.seedstore_service.model import Seed
from agentsidecar.seedstore_service.patch import UpdatePatch
from agentsidecar.seedstore_service.seedfile import dump_seed, parse_seed
from agentsidecar.seedstore_service.store import SeedStore

WRITER = Path(__file__).with_name("writer_process.py")
# Loaded by path: it is also run as a script, and this test directory may or may not be a package.
_WRITER_SPEC = importlib.util.spec_from_file_location("seedstore_writer_process", WRITER)
assert _WRITER_SPEC is not None
assert _WRITER_SPEC.loader is not None
writer_process = importlib.util.module_from_spec(_WRITER_SPEC)
_WRITER_SPEC.loader.exec_module(writer_process)
WORKERS = 4
UPDATES_PER_WORKER = 50
KILLS = 30
# Where a kill lands depends on the scheduler: on a loaded machine the first KILLS may all land
# on one side of the alternation, so the test goes on killing (up to this many) until the kills
# have covered what it asserts they cover.
MAX_KILLS = 200


def start_writer(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WRITER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "capabilities"
    (root / "voice").mkdir(parents=True)
    (root / "voice" / "say.yml").write_text(
        dump_seed(Seed("say", "voice", "cli", command="say", provides=("text_to_speech",)))
    )
    return root


@pytest.mark.slow
def test_concurrent_updates_from_four_processes_lose_nothing(root: Path) -> None:
    writers = [
        start_writer("add-provides", str(root), "say", str(worker), str(UPDATES_PER_WORKER))
        for worker in range(WORKERS)
    ]
    for writer in writers:
        _, stderr = writer.communicate(timeout=60)
        assert writer.returncode == 0, stderr

    stored, problems = SeedStore(root).locate("say", "voice")

    expected = {f"w{worker}_{number}" for worker in range(WORKERS) for number in range(UPDATES_PER_WORKER)}
    assert set(stored.seed.provides) == expected | {"text_to_speech"}
    assert len(stored.seed.provides) == WORKERS * UPDATES_PER_WORKER + 1
    assert problems == ()
    assert sorted(os.listdir(root / "voice")) == ["say.yml"]


def churn_on_a_slow_disk(root: Path, on_ready: Callable[[], None]) -> None:
    writer_process.slow_down_disk_writes()
    writer_process.churn(root, "say", on_ready)


@pytest.mark.slow
def test_a_writer_killed_at_random_moments_never_leaves_a_torn_seed(root: Path) -> None:
    seed_store = SeedStore(root)
    chooser = random.Random(20_260_907)
    forking = multiprocessing.get_context("fork")
    seen_provides_counts: set[int] = set()
    both_sides = {1, 1 + writer_process.BULK_SIZE}
    kills = 0

    def leftovers() -> list[str]:
        return [name for name in os.listdir(root / "voice") if name != "say.yml"]

    while kills < KILLS or (kills < MAX_KILLS and (seen_provides_counts != both_sides or not leftovers())):
        kills += 1
        ready = forking.Event()
        writer = forking.Process(target=churn_on_a_slow_disk, args=(root, ready.set), daemon=True)
        writer.start()
        assert ready.wait(timeout=30)
        # Let it rewrite for a random while, then kill it wherever it is (maybe mid-write).
        writer.join(timeout=chooser.uniform(0.0, 0.03))
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGKILL)
        writer.join(timeout=10)
        assert writer.exitcode == -signal.SIGKILL

        for path in root.rglob("*"):
            if path.name.endswith((".yml", ".yaml")):
                parse_seed(path.read_text(), str(path))  # raises SeedMalformed on a torn file
        scope = seed_store.load(None)
        assert scope.problems == ()
        assert [stored.path for stored in scope.seeds] == [str(root / "voice" / "say.yml")]
        seen_provides_counts.add(len(scope.seeds[0].seed.provides))

    # Kills did land mid-write: their temp files are left over, never named *.yml, never loaded.
    left = leftovers()
    assert left
    assert all(name.startswith(".say.yml.tmp-") for name in left), left
    # The kills landed on both sides of the short/long alternation.
    assert seen_provides_counts == both_sides
    # A killed holder does not leave the lock taken.
    updated, _ = SeedStore(root, lock_timeout=5).update(
        "say", None, UpdatePatch(kind="adapter"), expected_revision=None, now_unix=1
    )
    assert updated.seed.kind == "adapter"
