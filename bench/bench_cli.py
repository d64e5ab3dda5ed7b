"""The `seedstore` CLI as agents call it: one process per command, whole-process figures.

* the CLI table: `store`, `search CAP --domain D --json`, `list`, `inspect ID` at
  100 / 1,000 / 10,000 seeds, and `add` one seed, each paired run by run (A B A B ...)
  against SkillSpec's CLI (`$SKILLSPEC_BIN capability ...`) when SKILLSPEC_BIN is
  set, else against the bare interpreter (`python -c pass`, the same interpreter);
  the goal: every local read at most 4 times the baseline at 1,000 and 10,000 seeds, `list`
  at 10,000 seeds under SkillSpec's 268 ms;
* the stat floor: the bare interpreter listing the store's domain directories and
  stat'ing every seed file, and nothing else (`STAT_FLOOR_CODE`), paired against the
  same baseline, recorded for context: what every whole-store read pays before it reads
  an index;
* the same commands through `--server` (a `seedstore serve` on the same store);
* the persisted index: the first `list` of a store without one (it builds it);
* `seedstore serve` on the store: spawn to READY and settled RSS, the first start
  (no persisted index) and the next one (with it), at 10,000 seeds, and at
  100,000 with `--with-100k` (the 100k store takes minutes to write the first time).

Every figure is a median over `--runs` runs after one warm-up; wall and CPU
(user + sys of the child, from wait4) are both reported. Stores are the bench's
(`bench_seedstore.cached_store`: 50 domains, five seeds providing `bench_target`).

Run: `python -m bench.bench_cli [--runs N] [--with-100k] [--no-server] [--sizes 1000,10000]
[--copy-stores] [--reads-only]`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentsidecar.seedstore_service.persisted import INDEX_DIR_NAME, RACY_WINDOW_NS
from bench.bench_seedstore import (
    SEARCHED_CAPABILITY,
    cached_store,
    seedstore_argv,
    seedstore_env,
    seedstore_executable,
    settled_rss_mib,
    write_store,
)
from bench.harness import ServerProcess, Settings, compile_sources, start_server_process
from bench.report import Row, absolute_row, info_row, ratio_row, render_table

READ_GOAL = 4.0  # times the baseline, for every local read command at 1,000 and 10,000 seeds
# The floor under a whole-store read that checks every seed file's signature: the bare interpreter
# listing each domain directory of the store and stat'ing every name in it, as walk.walk_stats does,
# and nothing else (no index, no output). Its row says how much of the 4x a read has left.
STAT_FLOOR_CODE = (
    "import os, sys\n"
    "root = sys.argv[1]\n"
    "with os.scandir(root) as entries:\n"
    "    directories = [e.path for e in entries if e.is_dir() and not e.name.startswith('.')]\n"
    "for directory in directories:\n"
    "    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)\n"
    "    names = os.listdir(fd)\n"
    "    names.sort()\n"
    "    stats = [os.stat(name, dir_fd=fd) for name in names]\n"
    "    os.close(fd)\n"
)
LIST_10K_GOAL_MS = 268.0  # SkillSpec's own `list` at 10,000 seeds
READY_GOAL_S = 1.0  # at 100,000 seeds, after the first start
RSS_GOAL_MIB = 300.0  # at 100,000 seeds


@dataclass(frozen=True, slots=True)
class Run:
    wall_s: float
    cpu_s: float


@dataclass(frozen=True, slots=True)
class Paired:
    subject: Run  # medians
    baseline: Run
    wall_ratio: float  # median of the per-pair ratios
    cpu_ratio: float


def run_once(argv: Sequence[str], env: dict[str, str], exit_code: int = 0) -> Run:
    """One run of `argv`, which must exit with `exit_code`."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != exit_code:
        raise RuntimeError(f"{' '.join(argv)} exited {process.returncode}, not {exit_code}")
    return Run(wall, usage.ru_utime + usage.ru_stime)


def paired(
    subject: Sequence[str],
    baseline: Sequence[str],
    env: dict[str, str],
    runs: int,
    exit_codes: tuple[int, int] = (0, 0),
) -> Paired:
    """`runs` pairs of a subject run and a baseline run; `exit_codes`: what each must exit with."""
    subject_exit, baseline_exit = exit_codes
    run_once(subject, env, subject_exit)
    run_once(baseline, env, baseline_exit)
    pairs = [
        (run_once(subject, env, subject_exit), run_once(baseline, env, baseline_exit)) for _ in range(runs)
    ]

    def median(values: Sequence[float]) -> float:
        return statistics.median(values)

    return Paired(
        subject=Run(median([s.wall_s for s, _ in pairs]), median([s.cpu_s for s, _ in pairs])),
        baseline=Run(median([b.wall_s for _, b in pairs]), median([b.cpu_s for _, b in pairs])),
        wall_ratio=median([s.wall_s / b.wall_s for s, b in pairs]),
        cpu_ratio=median([s.cpu_s / max(b.cpu_s, 1e-6) for s, b in pairs]),
    )


def cli_row(label: str, result: Paired, goal: float | None) -> Row:
    row = ratio_row(label, result.subject.wall_s * 1000, result.baseline.wall_s * 1000, "ms", goal or 0)
    rounds = (
        f"cpu {result.subject.cpu_s * 1000:.1f}/{result.baseline.cpu_s * 1000:.1f} ms "
        f"({result.cpu_ratio:.2f}×); wall ratio, median of pairs: {result.wall_ratio:.2f}×"
    )
    if goal is None:
        return Row(row.benchmark, row.subject, row.baseline, f"{result.wall_ratio:.2f}×", "—", None, rounds)
    met = result.wall_ratio <= goal
    return Row(
        row.benchmark, row.subject, row.baseline, f"{result.wall_ratio:.2f}×", f"≤ {goal:g}×", met, rounds
    )


def baseline_argv(skillspec: str | None, command: Sequence[str]) -> list[str]:
    if skillspec:
        return [skillspec, "capability", *command]
    return [sys.executable, "-c", "pass"]


def store_home(count: int, scratch: Path, copy: bool = False) -> Path:
    """A SKILLSPEC_HOME with `count` bench seeds (the 10k and 100k stores are kept between runs;
    with `copy`, a copy of the kept store in `scratch` is used, so the kept one is left alone)."""
    if count >= 10_000:
        kept = cached_store(count)[0]
        if not copy:
            return kept
        home = scratch / f"seeds-{count}"
        if not home.is_dir():
            shutil.copytree(kept, home, symlinks=True, ignore=shutil.ignore_patterns(INDEX_DIR_NAME))
        return home
    home = scratch / f"seeds-{count}"
    if not (home / "capabilities").is_dir():
        write_store(home, count)
    return home


def settle_index(home: Path, env: dict[str, str]) -> None:
    """Build the persisted index, then wait out its racy window so the runs measure the steady state."""
    run_once([str(seedstore_executable()), "list"], env)
    time.sleep(RACY_WINDOW_NS / 1e9 + 0.2)
    run_once([str(seedstore_executable()), "list"], env)


AMBIGUOUS_ID = "seed-000011"  # in d11, where the broken-file copy holds a twin of it


def broken_file_rows(home: Path, scratch: Path, skillspec: str | None, runs: int) -> list[Row]:
    """`list` and `inspect ID` on a copy of the store (its index too) with one file that does not
    parse, as a hand edit leaves one: the reads report it and answer from the index all the same;
    and `inspect` of an id two files of the copy hold (a seed copied under another name in its
    directory, so that the sections' `list` rows still follow each other), the failure naming both."""
    broken_home = scratch / "broken-file"
    shutil.copytree(home, broken_home, symlinks=True)
    capabilities = broken_home / "capabilities"
    (capabilities / "d03" / "zz-hand-edit.yml").write_text("id: [unclosed\n", encoding="utf-8")
    shutil.copyfile(capabilities / "d11" / f"{AMBIGUOUS_ID}.yml", capabilities / "d11" / "zz-twin.yml")
    env = {**os.environ, "SKILLSPEC_HOME": str(broken_home)}
    env.pop("SEEDSTORE_SERVER", None)
    settle_index(broken_home, env)
    rows = []
    exe = str(seedstore_executable())
    for name, command in read_commands():
        if name in ("list", "inspect ID"):
            result = paired([exe, *command], baseline_argv(skillspec, command), env, runs)
            goal = None if skillspec else READ_GOAL
            rows.append(cli_row(f"`{name}`, 10,000 seeds, one file that does not parse, local", result, goal))
    ambiguous = ["inspect", AMBIGUOUS_ID]
    result = paired(
        [exe, *ambiguous], baseline_argv(skillspec, ambiguous), env, runs, (1, 1 if skillspec else 0)
    )
    label = (
        "`inspect AMBIGUOUS` (two files hold the id: the failure), 10,000 seeds, one file that does not parse"
    )
    rows.append(cli_row(f"{label}, local", result, None if skillspec else READ_GOAL))
    shutil.rmtree(broken_home, ignore_errors=True)
    return rows


def read_commands() -> list[tuple[str, list[str]]]:
    return [
        ("store", ["store"]),
        ("search CAP --domain D --json", ["search", SEARCHED_CAPABILITY, "--domain", "d07", "--json"]),
        ("list", ["list"]),
        ("inspect ID", ["inspect", "seed-000007"]),
    ]


async def serving(home: Path, workdir: Path, label: str) -> tuple[float, float, str, ServerProcess]:
    server = await start_server_process(
        seedstore_argv(f"unix:{workdir / f'{label}.sock'}"),
        log_path=workdir / f"{label}.log",
        env=seedstore_env(home),
        ready_timeout_s=900.0,
    )
    rss = await settled_rss_mib(server.pid)
    return server.seconds_to_ready, rss, server.target, server


def index_log_line(log_path: Path) -> str:
    lines = [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if "seed index built" in line or "seed index loaded" in line
    ]
    return lines[-1] if lines else ""


async def startup_rows(count: int, workdir: Path, rows: list[Row]) -> None:
    home = store_home(count, workdir)
    shutil.rmtree(home / "capabilities" / INDEX_DIR_NAME, ignore_errors=True)
    label = f"{count:,} seeds"
    for attempt in ("first start, no persisted index", "next start, with the index"):
        tag = f"serve-{count}-{'first' if attempt.startswith('first') else 'next'}"
        ready, rss, _target, server = await serving(home, workdir, tag)
        await server.stop()
        note = index_log_line(workdir / f"{tag}.log")
        if attempt.startswith("first") or count < 100_000:
            rows.append(info_row(f"seedstore serve, spawn → READY, {label}, {attempt}", f"{ready:.2f} s"))
        else:
            rows.append(
                absolute_row(f"seedstore serve, spawn → READY, {label}, {attempt}", ready, "s", READY_GOAL_S)
            )
        goal = RSS_GOAL_MIB if count >= 100_000 else None
        rss_label = f"seedstore serve, RSS after start-up, {label}, {attempt}"
        rows.append(
            absolute_row(rss_label, rss, "MiB", goal) if goal else info_row(rss_label, f"{rss:.1f} MiB")
        )
        if note:
            rows[-1] = dataclasses.replace(rows[-1], rounds=note)
        await asyncio.sleep(RACY_WINDOW_NS / 1e9 + 0.2)  # the next start finds entries past their racy window


async def run(args: argparse.Namespace, rows: list[Row]) -> None:
    skillspec = os.environ.get("SKILLSPEC_BIN") or None
    baseline_name = "SkillSpec CLI" if skillspec else "python -c pass"
    rows.append(info_row("CLI baseline", baseline_name))
    exe = str(seedstore_executable())
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch_text:
        scratch = Path(scratch_text)
        for count in args.sizes:
            home = store_home(count, scratch, args.copy_stores)
            env = {**os.environ, "SKILLSPEC_HOME": str(home)}
            env.pop("SEEDSTORE_SERVER", None)
            shutil.rmtree(home / "capabilities" / INDEX_DIR_NAME, ignore_errors=True)
            first = run_once([exe, "list"], env)
            rows.append(
                info_row(
                    f"`list`, {count:,} seeds, first run (builds the persisted index)",
                    f"{first.wall_s * 1000:.0f} ms",
                )
            )
            settle_index(home, env)
            for name, command in read_commands():
                if name == "store" and count != 100:
                    continue
                goal = READ_GOAL if count >= 1_000 and not skillspec else None
                result = paired([exe, *command], baseline_argv(skillspec, command), env, args.runs)
                rows.append(cli_row(f"`{name}`, {count:,} seeds, local", result, goal))
                if name == "list" and count == 10_000:
                    rows.append(
                        absolute_row(
                            "`list`, 10,000 seeds, local (SkillSpec: 268 ms)",
                            result.subject.wall_s * 1000,
                            "ms",
                            LIST_10K_GOAL_MS,
                        )
                    )
            if count == 10_000:
                rows += broken_file_rows(home, scratch, skillspec, args.runs)
                unknown = ["inspect", "no-such-seed"]
                result = paired(
                    [exe, *unknown],
                    baseline_argv(skillspec, unknown),
                    env,
                    args.runs,
                    (1, 1 if skillspec else 0),
                )
                rows.append(
                    cli_row(
                        "`inspect UNKNOWN` (no seed has the id: the failure), 10,000 seeds, local",
                        result,
                        None if skillspec else READ_GOAL,
                    )
                )
            floor = [sys.executable, "-c", STAT_FLOOR_CODE, str(home / "capabilities")]
            result = paired(floor, baseline_argv(skillspec, ["list"]), env, args.runs)
            rows.append(
                cli_row(f"stat floor: list and stat every seed file, {count:,} seeds (no goal)", result, None)
            )
            if not args.no_server:
                _ready, _rss, target, server = await serving(home, scratch, f"cli-{count}")
                try:
                    for name, command in read_commands():
                        if name == "store" and count != 100:
                            continue
                        remote = [exe, "--server", target, *command]
                        result = paired(remote, baseline_argv(skillspec, command), env, args.runs)
                        rows.append(cli_row(f"`{name}`, {count:,} seeds, --server", result, None))
                finally:
                    await server.stop()
        if args.reads_only:
            return
        add_home = scratch / "add-home"
        env = {**os.environ, "SKILLSPEC_HOME": str(add_home)}
        counter = iter(range(10_000))

        def add_argv() -> list[str]:
            return [
                exe,
                "add",
                f"bench-add-{next(counter)}",
                "--domain",
                "bench",
                "--kind",
                "cli",
                "--provides",
                "x",
            ]

        run_once(add_argv(), env)
        results = []
        for _ in range(args.runs):
            results.append(
                (
                    run_once(add_argv(), env),
                    run_once(
                        baseline_argv(
                            skillspec, ["add", "y", "--domain", "bench", "--kind", "cli", "--provides", "x"]
                        ),
                        env,
                    ),
                )
            )
        wall = statistics.median(s.wall_s / b.wall_s for s, b in results)
        rows.append(
            Row(
                "`add` one seed, local",
                f"{statistics.median(s.wall_s for s, _ in results) * 1000:.1f} ms",
                f"{statistics.median(b.wall_s for _, b in results) * 1000:.1f} ms",
                f"{wall:.2f}×",
                "—",
                None,
            )
        )
        for count in (10_000, *((100_000,) if args.with_100k else ())):
            await startup_rows(count, scratch, rows)


async def run_suite(settings: Settings, rows: list[Row]) -> None:
    """`run_all`'s entry: 9 runs a figure (3 with --quick), the 100k serve rows unless --quick."""
    quick = settings.quick
    await run(
        argparse.Namespace(
            runs=3 if quick else 9,
            with_100k=not quick,
            no_server=False,
            sizes=(100, 1_000, 10_000),
            copy_stores=False,
            reads_only=False,
        ),
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="counted runs per figure (after one warm-up)")
    parser.add_argument("--with-100k", action="store_true", help="also start the service on 100,000 seeds")
    parser.add_argument("--no-server", action="store_true", help="skip the --server rows")
    parser.add_argument(
        "--sizes",
        type=lambda text: tuple(int(size) for size in text.split(",")),
        default=(100, 1_000, 10_000),
        help="store sizes of the CLI table, comma-separated (default 100,1000,10000)",
    )
    parser.add_argument(
        "--copy-stores", action="store_true", help="measure copies of the kept stores, leaving those alone"
    )
    parser.add_argument(
        "--reads-only", action="store_true", help="only the CLI table: no `add`, no serve rows"
    )
    args = parser.parse_args()
    rows: list[Row] = []
    compile_sources()
    try:
        asyncio.run(run(args, rows))
    finally:
        print(render_table(rows))
        print(f"\ncommand: python -m bench.bench_cli {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()
