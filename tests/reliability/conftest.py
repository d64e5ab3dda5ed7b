"""Fixtures of the reliability suite: real processes, kills, fuzzing and soak against both services.

    pytest -s tests/reliability                    # CI size
    RELIABILITY_FULL=1 pytest -s tests/reliability # full size (the defaults below)

Sizes come from the environment; each test module's docstring names its own.
    RELIABILITY_FULL=1          every default below at full size
    RELIABILITY_PROCESSES       concurrent updater processes (CI 4, full 8)
    RELIABILITY_UPDATES         updates per process (CI 25, full 200)
    RELIABILITY_SHARED_SEEDS    seeds the updaters share (3)
    RELIABILITY_KILLS           SIGKILLs of a writer mid-write (CI 20, full 50)
    RELIABILITY_FUZZ_EXAMPLES   Hypothesis examples per property / RPC (CI 100, full 500)
    RELIABILITY_CLIENTS         soak client threads (CI 8, full 16)
    RELIABILITY_SOAK_SECONDS    soak duration (CI 15, full 60)
    RELIABILITY_FIGURES         where the figures JSON goes (default below)

* `sizes`, `figures`: session-wide; figures are printed as each test records
  them (`pytest -s tests/reliability` shows them) and written to
  `$RELIABILITY_FIGURES`, else `<pytest base temp>/reliability-figures.json`.
* `short_dir`: a directory under /tmp with a short name, for Unix sockets
  (sun_path holds ~107 bytes; pytest's tmp_path may not fit).
* `sidecars`: starts sidecar processes and stops every one at teardown.

tests/negotiator is put on sys.path so `mock_openai` can be reused.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.reliability.rel_support import REPO, Figures, Sidecar, Sizes, make_short_dir

_NEGOTIATOR_TESTS = str(REPO / "tests" / "negotiator")
if _NEGOTIATOR_TESTS not in sys.path:
    sys.path.append(_NEGOTIATOR_TESTS)


@pytest.fixture(scope="session")
def sizes() -> Sizes:
    return Sizes.from_env(os.environ)


@pytest.fixture(scope="session")
def figures(sizes: Sizes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Figures]:
    explicit = os.environ.get("RELIABILITY_FIGURES", "").strip()
    path = Path(explicit) if explicit else tmp_path_factory.getbasetemp() / "reliability-figures.json"
    recorder = Figures(path=path, sizes=sizes)
    print(f"\n[reliability] sizes: {sizes}", flush=True)
    yield recorder
    recorder.write()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = make_short_dir("rel-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sidecars() -> Iterator[Callable[[Sidecar], Sidecar]]:
    """`sidecars(start_seedstore(...))` registers a started process for teardown and returns it."""
    started: list[Sidecar] = []

    def track(sidecar: Sidecar) -> Sidecar:
        started.append(sidecar)
        return sidecar

    yield track
    for sidecar in reversed(started):
        sidecar.stop()
