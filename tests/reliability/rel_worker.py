"""Worker processes of the reliability suite, run by path (`python rel_worker.py MODE ...`).

rel_worker.py updates TARGET HOME WORKER COUNT SEED[,SEED...]
    COUNT updates, each adding the provides value `w<WORKER>_<n>` to one of the
    shared seeds (round robin, offset by WORKER). Every third update (offset
    by WORKER) runs the local CLI path, `python -m agentsidecar.seedstore_service.cli update`
    in its own process against the files under HOME; the others go through the
    RPC path, clients/seedstore.py against the service at TARGET. (A CLI
    process costs half a second of CPU at start-up; a third keeps the CI size
    within its time budget while both paths contend all along.) Prints one
    JSON object: the values written per seed and each path's latencies.

rel_worker.py churn ROOT SEED_ID
    Rewrite the seed forever with slow disk writes, alternating a short and a
    long version, through SeedStore (the locked, atomic path). Prints "ready"
    once the first rewrite is on disk, so the caller kills a busy writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service.patch import UpdatePatch
from agentsidecar.seedstore_service.store import SeedStore

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

CLI_EVERY = 3
BULK_SIZE = 100
_BULK = tuple(f"bulk_capability_{number:04d}" for number in range(BULK_SIZE))
_LONG_ALIAS = "a long alias " * 50


def cli_update(home: str, seed_id: str, value: str) -> None:
    env = {key: val for key, val in os.environ.items() if not key.startswith(("SEEDSTORE_", "SKILLSPEC_"))}
    env["SKILLSPEC_HOME"] = home
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentsidecar.seedstore_service.cli",
            "update",
            seed_id,
            "--add-provides",
            value,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode != 0:
        raise SystemExit(f"cli update {seed_id} +{value} failed ({completed.returncode}): {completed.stderr}")
    written = json.loads(completed.stdout)
    if value not in written["seed"]["provides"]:
        raise SystemExit(f"cli update {seed_id} +{value} printed a seed without it: {completed.stdout}")


def rpc_update(client: SeedStoreClient, seed_id: str, value: str) -> None:
    response = client.update_seed(pb.UpdateSeedRequest(id=seed_id, add_provides=[value]))
    if value not in response.seed.provides:
        raise SystemExit(f"rpc update {seed_id} +{value} answered a seed without it")


def updates(target: str, home: str, worker: int, count: int, seeds: list[str]) -> None:
    written: dict[str, list[str]] = {seed: [] for seed in seeds}
    latencies: dict[str, list[float]] = {"cli": [], "rpc": []}
    with SeedStoreClient(target, timeout=60) as client:
        for number in range(count):
            seed_id = seeds[(worker + number) % len(seeds)]
            value = f"w{worker}_{number}"
            path = "cli" if (worker + number) % CLI_EVERY == 0 else "rpc"
            started = time.monotonic()
            if path == "cli":
                cli_update(home, seed_id, value)
            else:
                rpc_update(client, seed_id, value)
            latencies[path].append(time.monotonic() - started)
            written[seed_id].append(value)
    print(json.dumps({"worker": worker, "written": written, "latencies": latencies}), flush=True)


def slow_down_disk_writes(chunk: int = 256, pause: float = 0.001) -> None:
    """Make every os.write short and slow, so a kill at a random moment often lands mid-write."""
    real_write = os.write

    def slow_write(fd: int, data: ReadableBuffer) -> int:
        written = real_write(fd, memoryview(data)[:chunk])
        time.sleep(pause)
        return written

    os.write = slow_write


def churn(root: Path, seed_id: str) -> None:
    slow_down_disk_writes()
    seed_store = SeedStore(root)
    grow = UpdatePatch(add_provides=_BULK, add_aliases=(_LONG_ALIAS,))
    shrink = UpdatePatch(remove_provides=_BULK, remove_aliases=(_LONG_ALIAS,))
    turn = 0
    while True:
        patch = grow if turn % 2 == 0 else shrink
        seed_store.update(seed_id, None, patch, expected_revision=None, now_unix=turn)
        if turn == 0:
            print("ready", flush=True)
        turn += 1


def main(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "updates":
        target, home, worker, count, seeds = rest
        updates(target, home, int(worker), int(count), seeds.split(","))
    elif mode == "churn":
        root, seed_id = rest
        churn(Path(root), seed_id)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
