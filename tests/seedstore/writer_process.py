"""A separate writer process for test_durability.py.

    writer_process.py add-provides ROOT SEED_ID WORKER COUNT
        COUNT locked updates of one seed, each adding the provides value `w<WORKER>_<n>`.
    writer_process.py churn ROOT SEED_ID
        Rewrite the seed forever, alternating a short and a long version; prints
        "ready" once the first rewrite is on disk, so the test kills a busy writer.

The kill test forks `churn` instead of starting this script: 30 interpreter
start-ups would take most of the time budget.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agentsidecar.seedstore_service.patch import UpdatePatch
from agentsidecar.seedstore_service.store import SeedStore

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# Long enough that a write spans several syscalls' worth of bytes.
BULK_SIZE = 100
_BULK = tuple(f"bulk_capability_{number:04d}" for number in range(BULK_SIZE))


def add_provides(root: Path, seed_id: str, worker: int, count: int) -> None:
    seed_store = SeedStore(root)
    for number in range(count):
        patch = UpdatePatch(add_provides=(f"w{worker}_{number}",))
        seed_store.update(seed_id, None, patch, expected_revision=None, now_unix=number)


def slow_down_disk_writes(chunk: int = 256, pause: float = 0.001) -> None:
    """Make every os.write in this process short and slow, as on a busy disk.

    A write then spans many milliseconds, so a kill at a random moment often lands
    in the middle of one: a writer that wrote seed files in place would leave torn files.
    """
    real_write = os.write

    def slow_write(fd: int, data: ReadableBuffer) -> int:
        written = real_write(fd, memoryview(data)[:chunk])
        time.sleep(pause)
        return written

    os.write = slow_write


def churn(root: Path, seed_id: str, on_ready: Callable[[], None]) -> None:
    seed_store = SeedStore(root)
    grow = UpdatePatch(add_provides=_BULK, add_aliases=("a long alias " * 50,))
    shrink = UpdatePatch(remove_provides=_BULK, remove_aliases=("a long alias " * 50,))
    turn = 0
    while True:
        patch = grow if turn % 2 == 0 else shrink
        seed_store.update(seed_id, None, patch, expected_revision=None, now_unix=turn)
        if turn == 0:
            on_ready()
        turn += 1


def main(argv: list[str]) -> None:
    mode, root, seed_id, *rest = argv
    if mode == "add-provides":
        add_provides(Path(root), seed_id, int(rest[0]), int(rest[1]))
    elif mode == "churn":
        churn(Path(root), seed_id, lambda: print("ready", flush=True))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
