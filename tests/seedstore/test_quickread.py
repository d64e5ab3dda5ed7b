"""`seedstore`'s read commands from the persisted index (quickread.py) answer what cli.py answers, or nothing.

Every comparison runs the same command line through `quickread.run` and through
`cli.main` (which reads the files and refreshes the index), on real files, and
asserts that the quick path either declines (None) or prints exactly cli.main's
bytes; the tests that matter also assert that it did answer, so that no test passes
by declining everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service import cli, indexfile, quickread, walk
from agentsidecar.seedstore_service.model import Evidence, Rank, Risk, Seed
from agentsidecar.seedstore_service.seedfile import dump_seed

PYTHON = sys.executable
SEEDSTORE = str(Path(sys.executable).with_name("seedstore"))

SEEDS = (
    Seed(
        id="say",
        domain="voice",
        kind="cli",
        command="say",
        provides=("text_to_speech",),
        aliases=("speak aloud",),
        evidence=(Evidence("cli_help", "say --help"),),
    ),
    Seed(
        id="piper",
        domain="voice",
        kind="cli",
        command="piper",
        provides=("text_to_speech", "tts"),
        rank=Rank(default_priority=73, preferred_for=("Text-To-Speech",)),
        evidence=(Evidence("cli_help", "piper --help"),),
    ),
    Seed(
        id="cloud-tts",
        domain="voice",
        kind="adapter",
        adapter="cloud",
        provides=("text_to_speech",),
        auth_env=("CLOUD_KEY",),
        risk=Risk(external_service=True, may_cost_money=True),
        rank=Rank(avoid_for=("text_to_speech",)),
    ),
    Seed(
        id="voix",
        domain="voice",
        kind="cli",
        command="voix",
        provides=("speech_synthesis",),
        aliases=("voix française",),
        evidence=(Evidence("cli_help", "voix --aide"),),
    ),
    Seed(
        id="sox",
        domain="audio",
        kind="cli",
        command="sox",
        provides=("audio_convert",),
        aliases=("text to speech helper",),
    ),
    Seed(id="say", domain="audio", kind="cli", command="say2", provides=("audio_play",)),
    Seed(id="loose", domain="misc", kind="script", script="run.sh", provides=("misc_task",)),
)
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("store",),
    ("list",),
    ("list", "--domain", "voice"),
    ("list", "--domain=audio"),
    ("list", "--domain", "nowhere"),
    ("inspect", "piper"),
    ("inspect", "say", "--domain", "audio"),
    ("inspect", "--json", "voix"),
    ("search", "text_to_speech"),
    ("search", "text_to_speech", "--domain", "voice", "--json"),
    ("search", "tts", "--local-only", "--explain"),
    ("search", "text_to_speech", "--preferred-seed", "say", "--domain=voice"),
    ("search", "speech"),
    ("search", "audio_play", "--json-style", "compact"),
    ("list", "--json-style=compact"),
    ("search", "nothing_provides_this"),
)
# What quick path must decline: cli.py alone knows what these print (help, errors, re-spelling...).
DECLINED: tuple[tuple[str, ...], ...] = (
    (),
    ("--help",),
    ("list", "--help"),
    ("list", "-h"),
    ("--json-style", "compact", "list"),
    ("list", "--domain"),
    ("list", "--domain", "-x"),
    ("list", "--domain", "Not_An_Identifier"),
    ("list", "--domain", "voice", "--domain", "audio"),
    ("list", "extra"),
    ("list", "--server", "unix:/nowhere"),
    ("list", "--json"),
    ("inspect",),
    ("inspect", "a", "b"),
    ("search",),
    ("search", "text_to_speech", "--broaden"),
    ("search", "text_to_speech", "--json=yes"),
    ("search", "--", "text_to_speech"),
    ("search", "text_to_speech", "--json-style", "loud"),
    ("search", ".hidden"),
    ("search", "x" * 201),
    ("verify", "say"),
    ("add", "x", "--domain", "d", "--kind", "cli", "--provides", "p"),
)


def write_seed(root: Path, seed: Seed, name: str | None = None) -> Path:
    path = root / seed.domain / f"{name or seed.id}.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_seed(seed), encoding="utf-8")
    return path


def full_streams(argv: Sequence[str]) -> tuple[str, str, int]:
    """What `cli.main(argv)` prints on stdout and stderr, and its exit code (it reads the files and
    refreshes the index)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(argv))
    return stdout.getvalue(), stderr.getvalue(), code


def full(argv: Sequence[str]) -> str:
    return full_streams(argv)[0]


def quick_streams(argv: Sequence[str]) -> tuple[str, str, int] | None:
    """What `quickread.main` prints for an answer on stdout and stderr, and its exit code; None: it
    declines (cli.py answers)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = quickread.run(list(argv), os.environ, stdout, stderr)
    return None if code is None else (stdout.getvalue(), stderr.getvalue(), code)


def quick(argv: Sequence[str]) -> str | None:
    streams = quick_streams(argv)
    return None if streams is None else streams[0]


@contextlib.contextmanager
def no_racy_window() -> Iterator[None]:
    """Entries count as settled at once (the real window is two seconds; one test waits it out)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(indexfile, "RACY_WINDOW_NS", 0)
        yield


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKILLSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("SEEDSTORE_SERVER", raising=False)
    return tmp_path


@pytest.fixture
def store(home: Path) -> Iterator[Path]:
    root = home / "capabilities"
    for seed in SEEDS:
        write_seed(root, seed)
    (root / "root-seed.yml").write_text(
        dump_seed(Seed(id="top", domain="misc", kind="cli", command="top", provides=("misc_task",))),
        encoding="utf-8",
    )
    with no_racy_window():
        full(["list"])  # builds the index
        yield root


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_a_vouched_store_is_answered_exactly_as_cli_answers(store: Path, argv: tuple[str, ...]) -> None:
    answered = quick(argv)
    assert answered is not None, "the quick path declined a plain command on a vouched store"
    assert answered == full(argv)


@pytest.mark.parametrize("argv", DECLINED, ids=lambda argv: " ".join(argv) or "nothing")
def test_other_command_lines_are_left_to_cli(store: Path, argv: tuple[str, ...]) -> None:
    assert quick(argv) is None


def test_a_service_target_is_left_to_cli(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEEDSTORE_SERVER", "unix:/nowhere")
    assert quick(["list"]) is None


def test_a_root_pathlib_would_respell_is_left_to_cli(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKILLSPEC_HOME", str(store.parent) + "//")
    assert quick(["list"]) is None
    monkeypatch.setenv("SKILLSPEC_HOME", str(store.parent) + "/.")
    assert quick(["store"]) is None
    assert "/./capabilities" in full(["store"])


def test_without_an_index_nothing_is_answered_until_cli_builds_it(home: Path) -> None:
    root = home / "capabilities"
    write_seed(root, SEEDS[0])
    with no_racy_window():
        assert quick(["list"]) is None
        listed = full(["list"])
        assert quick(["list"]) == listed


def test_an_edit_in_place_of_the_same_size_is_seen(store: Path) -> None:
    path = store / "voice" / "say.yml"
    text = path.read_text(encoding="utf-8")
    edited = text.replace("say --help", "say --hElp")
    assert len(edited) == len(text)
    assert edited != text
    path.write_text(edited, encoding="utf-8")
    assert quick(["inspect", "say", "--domain", "voice"]) is None
    shown = full(["inspect", "say", "--domain", "voice"])
    assert "say --hElp" in shown
    assert quick(["inspect", "say", "--domain", "voice"]) == shown


def test_a_new_file_is_seen(store: Path) -> None:
    write_seed(
        store, Seed(id="espeak", domain="voice", kind="cli", command="espeak", provides=("text_to_speech",))
    )
    assert quick(["search", "text_to_speech"]) is None
    found = full(["search", "text_to_speech"])
    assert "espeak" in found
    assert quick(["search", "text_to_speech"]) == found


def test_a_removed_file_is_left_out(store: Path) -> None:
    (store / "voice" / "piper.yml").unlink()
    answered = quick(["list", "--domain", "voice"])
    assert answered is not None
    assert "piper" not in answered
    assert answered == full(["list", "--domain", "voice"])


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],
        lambda data: data[:-1],
        lambda data: data + b"\n",
        lambda data: b"not an index\n" + data,
        lambda data: b"",
        lambda data: data.replace(b'"version":5', b'"version":4', 1),
        lambda data: data.replace(b'"count":4', b'"count":3', 1),
    ],
    ids=["half", "one byte short", "one byte more", "foreign", "empty", "other version", "other count"],
)
def test_a_damaged_index_file_is_never_used(store: Path, damage: object) -> None:
    section = store / indexfile.INDEX_DIR_NAME / indexfile.section_file_name("voice")
    data = section.read_bytes()
    damaged = damage(data)  # type: ignore[operator]
    assert damaged != data
    for argv in (["inspect", "piper"], ["list", "--domain", "voice"], ["list"], ["search", "tts"]):
        section.write_bytes(damaged)
        assert quick(argv) is None, argv


_COMMON_BLOCKS = frozenset(
    {
        0,
        *(
            1 + indexfile.COLUMN_POSITIONS.index(p)
            for p in (indexfile.NAME, indexfile.PROBLEM, indexfile.NOTES)
        ),
    }
    | {indexfile.SIGNATURES_BLOCK}
)


def _column_blocks(*positions: int) -> frozenset[int]:
    return frozenset(1 + indexfile.COLUMN_POSITIONS.index(position) for position in positions)


# Each quick command, and the blocks of a section in its scope that it reads (and so checks).
_READS: tuple[tuple[tuple[str, ...], frozenset[int]], ...] = (
    (
        ("inspect", "piper"),
        _COMMON_BLOCKS | _column_blocks(indexfile.ID, indexfile.REVISION) | {indexfile.SEEDS_BLOCK},
    ),
    (
        ("list", "--domain", "voice"),
        _COMMON_BLOCKS | _column_blocks(indexfile.DOMAIN) | {indexfile.LISTING_BLOCK},
    ),
    (("list",), _COMMON_BLOCKS | {indexfile.LISTING_BLOCK}),
    (
        ("list", "--json-style=compact"),
        _COMMON_BLOCKS | _column_blocks(indexfile.ID, indexfile.DOMAIN, indexfile.ROW, indexfile.REVISION),
    ),
    (
        ("search", "tts"),
        _COMMON_BLOCKS
        | _column_blocks(indexfile.KEYS, indexfile.ID, indexfile.RANK, indexfile.ROW, indexfile.DOMAIN),
    ),
)


@pytest.mark.parametrize("block", range(indexfile.BLOCK_COUNT))
def test_a_damaged_block_is_never_used(store: Path, block: int) -> None:
    """One byte of one block changed: a command that reads the block declines, any other answers
    exactly as cli.py does (a block it does not read cannot change its answer)."""
    section = store / indexfile.INDEX_DIR_NAME / indexfile.section_file_name("voice")
    data = section.read_bytes()
    head = data.partition(b"\n")[0]
    lengths = json.loads(head)["blocks"][0::2]  # each block's length and CRC-32, flat
    start = len(head) + 1 + sum(lengths[:block])
    length = lengths[block]
    if not length:
        pytest.skip("the block is empty in this section")
    middle = start + length // 2
    damaged = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
    for argv, reads in _READS:
        section.write_bytes(damaged)
        answered = quick(argv)
        if block in reads:
            assert answered is None, argv
        else:
            assert answered is None or answered == full(argv), argv


def test_another_stores_index_is_never_used(store: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = home / "other"
    shutil.copytree(store, other / "capabilities", copy_function=shutil.copy2)
    monkeypatch.setenv("SKILLSPEC_HOME", str(other))
    assert quick(["list"]) is None  # the copied index names the first store's root
    listed = full(["list"])
    assert str(other) in listed
    assert quick(["list"]) == listed


# The read commands over a scope with a file that does not parse and a seed with a note.
_REPORTING = (
    ("list",),
    ("list", "--domain", "voice"),
    ("list", "--json-style", "compact"),
    ("list", "--domain", "voice", "--json-style", "compact"),
    ("search", "text_to_speech"),
    ("search", "text_to_speech", "--domain", "voice", "--json"),
    ("inspect", "piper"),
    ("inspect", "say", "--domain", "voice"),
    ("inspect", "noted", "--json-style", "compact"),
)


def test_files_that_report_problems_are_answered_as_cli_answers(store: Path) -> None:
    """A file that does not parse and a seed's notes are reported, in the answer and as warnings
    before it, as cli.py reports them; only what cli.py words itself is left to it."""
    (store / "voice" / "broken.yml").write_text("id: [unclosed\n", encoding="utf-8")
    (store / "voice" / "aaa-broken.yml").write_text("id: x\nkind: [\n", encoding="utf-8")
    noted = Seed(id="noted", domain="voice", kind="cli", command="n", provides=("p",), aliases=("---", "!!"))
    write_seed(store, noted)
    with no_racy_window():
        full(["list"])
        for argv in _REPORTING:
            answered = quick_streams(argv)
            assert answered is not None, f"the quick path declined {argv}"
            assert answered == full_streams(argv), argv
            assert "warning: " in answered[1], argv
            assert '"problems"' in answered[0], argv
        # The pretty listing is still written from listing blocks, the broken file's section's
        # rows from its columns.
        listing = quickread._answer(["list"], os.environ)
        assert isinstance(listing, tuple)
        assert isinstance(listing[0], quickread._Listing)
        # Maybe the broken file: cli.py words it.
        assert quick_streams(["inspect", "broken"]) is None
        assert full_streams(["inspect", "broken"])[2] != 0
        # Unknown: the failure cli.py prints.
        for argv in (("inspect", "nowhere"), ("inspect", "nowhere", "--domain", "voice", "--json")):
            failed = quick_streams(argv)
            assert failed is not None, argv
            assert failed == full_streams(argv), argv
            assert failed[0] == "", argv
            assert failed[2] == 1, argv
            assert '"reason":"SEED_NOT_FOUND"' in failed[1], argv


def test_an_unknown_id_is_reported_as_cli_reports_it(store: Path) -> None:
    for argv in (("inspect", "nowhere"), ("inspect", "piper", "--domain", "audio")):
        failed = quick_streams(argv)
        assert failed is not None, argv
        assert failed == full_streams(argv), argv
        assert failed[2] == 1, argv
        assert quick(["list", "--domain", "audio"]) == full(["list", "--domain", "audio"])


def test_an_ambiguous_id_is_reported_as_cli_reports_it(store: Path) -> None:
    # `say` is in voice and audio; another in a nested directory and one in the root file sort
    # among them by path, not by section.
    nested = store / "audio" / "more"
    nested.mkdir()
    (nested / "say.yml").write_text(dump_seed(SEEDS[5]), encoding="utf-8")
    (store / "say.yml").write_text(dump_seed(SEEDS[0]), encoding="utf-8")
    with no_racy_window():
        full(["list"])
        for argv in (
            ("inspect", "say"),
            ("inspect", "say", "--domain", "audio"),
            ("inspect", "--json", "say"),
        ):
            failed = quick_streams(argv)
            assert failed is not None, argv
            assert failed == full_streams(argv), argv
            assert (failed[0], failed[2]) == ("", 1), argv
            assert '"reason":"SEED_AMBIGUOUS"' in failed[1], argv
        stderr = full_streams(["inspect", "say"])[1]
        (failure,) = (line for line in stderr.splitlines() if line.startswith("{"))
        violations = json.loads(failure)["error"]["precondition_violations"]
        names = ("audio/more/say.yml", "audio/say.yml", "say.yml", "voice/say.yml")
        assert [violation["subject"] for violation in violations] == [str(store / name) for name in names]


def test_a_seed_declaring_another_domain_is_reported_for_that_domain(store: Path) -> None:
    write_seed(store, Seed(id="stray", domain="audio", kind="cli", command="stray", provides=("p",)), "stray")
    (store / "audio" / "stray.yml").rename(store / "voice" / "stray.yml")
    with no_racy_window():
        full(["list"])
        for argv in (
            ("list", "--domain", "voice"),
            ("list", "--domain", "voice", "--json-style", "compact"),
            ("search", "text_to_speech", "--domain", "voice", "--json"),
            ("inspect", "piper", "--domain", "voice"),
        ):
            answered = quick_streams(argv)
            assert answered is not None, argv
            assert answered == full_streams(argv), argv
            assert 'is stored under domain "voice" but declares domain "audio"' in answered[1], argv
        # Named after the id: cli.py reports the file instead.
        assert quick_streams(["inspect", "stray", "--domain", "voice"]) is None
        listed = quick(["list"])  # a whole-store list shows it, no problem reported
        assert listed is not None
        assert listed == full(["list"])


@pytest.mark.slow
def test_a_directory_the_walk_cannot_read_is_left_to_cli(store: Path) -> None:
    """The walk's own problems (a directory whose path is past PATH_MAX) are cli.py's to report."""
    fd = os.open(store / "voice", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _level in range(24):  # 24 * 201 characters: past PATH_MAX (4,096) from the store root
            os.mkdir("d" * 200, dir_fd=fd)
            inner = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        cli.main(["list", "--domain", "voice"])
    assert "failed to read" in stderr.getvalue()
    assert quick(["list", "--domain", "voice"]) is None
    assert quick(["list", "--domain", "audio"]) == full(["list", "--domain", "audio"])


@pytest.mark.slow
def test_a_file_changed_within_the_racy_window_is_read_again(home: Path) -> None:
    """The real window: a file written just now is never trusted, and is once the window has passed."""
    root = home / "capabilities"
    write_seed(root, SEEDS[0])
    full(["list"])
    assert quick(["list"]) is None
    time.sleep(indexfile.RACY_WINDOW_NS / 1e9 + 0.1)
    listed = full(["list"])  # reads the file again, now settled, and saves its entry
    assert quick(["list"]) == listed


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["rewrite", "remove", "add", "break", "note", "damage-index", "read"]),
        st.integers(min_value=0, max_value=len(SEEDS) - 1),
        st.sampled_from(COMMANDS),
    ),
    min_size=1,
    max_size=12,
)


# Each example writes a store and runs up to a dozen edits through both paths: fewer than the default.
@settings(max_examples=40)
@given(edits=_EDITS)
def test_random_edits_never_make_the_quick_path_differ(edits: list[tuple[str, int, tuple[str, ...]]]) -> None:
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        patch.setenv("SKILLSPEC_HOME", str(home))
        patch.delenv("SEEDSTORE_SERVER", raising=False)
        patch.setattr(indexfile, "RACY_WINDOW_NS", 0)
        root = home / "capabilities"
        for seed in SEEDS:
            write_seed(root, seed)
        full(["list"])
        for action, which, argv in edits:
            seed = SEEDS[which]
            path = root / seed.domain / f"{seed.id}.yml"
            if action == "rewrite" and path.exists():
                path.write_text(dump_seed(_renamed(seed)), encoding="utf-8")
            elif action == "remove" and path.exists():
                path.unlink()
            elif action == "add":
                write_seed(root, _renamed(seed), f"{seed.id}-copy")
            elif action == "break":
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("provides: [\n", encoding="utf-8")
            elif action == "note":  # an alias with no canonical form: read, and noted
                write_seed(root, dataclasses.replace(seed, aliases=("---",)))
            elif action == "damage-index":
                section = root / indexfile.INDEX_DIR_NAME / indexfile.section_file_name(seed.domain)
                if section.exists():
                    section.write_bytes(section.read_bytes()[:-3])
            got = quick_streams(argv)
            assert got is None or got == full_streams(argv), (action, argv)
            again = quick_streams(argv)  # after cli.main refreshed the index
            assert again is None or again == full_streams(argv), (action, argv)


def _renamed(seed: Seed) -> Seed:
    return dataclasses.replace(seed, aliases=(*seed.aliases, "renamed alias"))


def run_seedstore(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKILLSPEC_HOME": str(home)}
    env.pop("SEEDSTORE_SERVER", None)
    return subprocess.run(
        [SEEDSTORE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def settled(home: Path) -> Path:
    """A store whose files are past the real racy window, indexed by the console command."""
    root = home / "capabilities"
    for seed in SEEDS:
        write_seed(root, seed)
    for number in range(300):
        write_seed(root, Seed(id=f"s{number}", domain="many", kind="cli", command="c", provides=("p",)))
    time.sleep(indexfile.RACY_WINDOW_NS / 1e9 + 0.1)
    assert run_seedstore(home, "list").returncode == 0  # builds the index
    return home


@pytest.mark.slow
def test_an_unknown_id_is_reported_without_importing_grpc(settled: Path) -> None:
    """`seedstore inspect <unknown>`: the failure cli.py prints, from the status table, no gRPC."""
    script = (
        "import sys\n"
        "from agentsidecar.seedstore_service import quickread\n"
        "sys.argv = ['seedstore', 'inspect', 'nowhere']\n"
        "code = quickread.main()\n"
        "sys.stdout.write(repr((code, sorted(sys.modules))))\n"
    )
    env = {**os.environ, "SKILLSPEC_HOME": str(settled)}
    result = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    code, loaded = eval(result.stdout)
    assert code == 1
    assert {"grpc", "agentsidecar.seedstore_service.cli", "yaml"}.isdisjoint(loaded)
    reference = subprocess.run(
        [PYTHON, "-m", "agentsidecar.seedstore_service.cli", "inspect", "nowhere"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (result.stderr, code) == (reference.stderr, reference.returncode)
    assert "SEED_NOT_FOUND" in result.stderr


@pytest.mark.slow
def test_the_console_command_answers_without_importing_the_rest(settled: Path) -> None:
    """`seedstore search CAP --domain D --json`, the agents' template, imports none of the heavy modules."""
    script = (
        "import sys\n"
        "from agentsidecar.seedstore_service import quickread\n"
        "sys.argv = ['seedstore', 'search', 'text_to_speech', '--domain', 'voice', '--json']\n"
        "code = quickread.main()\n"
        "loaded = sorted(sys.modules)\n"
        "sys.stderr.write(repr((code, loaded)))\n"
    )
    env = {**os.environ, "SKILLSPEC_HOME": str(settled)}
    result = subprocess.run(
        [PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    code, loaded = eval(result.stderr)
    assert code == 0
    assert '"selected"' in result.stdout
    heavy = {
        "agentsidecar.seedstore_service.cli",
        "agentsidecar.seedstore_service.model",
        "agentsidecar.seedstore_service.store",
        "dataclasses",
        "typing",
        "json",
        "re",
        "pathlib",
        "enum",
        "grpc",
        "yaml",
    }
    assert heavy.isdisjoint(loaded), sorted(heavy.intersection(loaded))
    reference = subprocess.run(
        [
            PYTHON,
            "-m",
            "agentsidecar.seedstore_service.cli",
            "search",
            "text_to_speech",
            "--domain",
            "voice",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout == reference.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "quick_path"), [(["list"], True), (["--json-style", "pretty", "list"], False)]
)
def test_a_reader_that_has_gone_gets_no_traceback(settled: Path, argv: list[str], quick_path: bool) -> None:
    """`seedstore list | head -c 1` once head has exited: both paths end quietly, exit 1.

    The pipe's read end is closed before the command starts, so its first write fails
    as a write after the reader left does.
    """
    assert (quick(argv) is not None) is quick_path
    env = {**os.environ, "SKILLSPEC_HOME": str(settled)}
    env.pop("SEEDSTORE_SERVER", None)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [SEEDSTORE, *argv], env=env, stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False
        )
    finally:
        os.close(write_end)
    assert result.stderr == b""
    assert result.returncode == 1  # the output could not be written; nothing else went wrong


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv", [["list"], ["inspect", "say", "--domain", "voice", "--json"], ["inspect", "nowhere"]]
)
def test_the_console_script_ends_an_answer_with_its_output_whole(
    settled: Path, tmp_path: Path, argv: list[str]
) -> None:
    """The console script ends the process at once after an answer from the index: into files
    (block-buffered, unlike a terminal) its output, errors and exit code are cli.py's, byte for byte."""
    assert quick(argv) is not None  # answered from the index
    env = {**os.environ, "SKILLSPEC_HOME": str(settled)}
    env.pop("SEEDSTORE_SERVER", None)
    ended = []
    for name, command in (
        ("console", [SEEDSTORE, *argv]),
        ("cli", [PYTHON, "-m", "agentsidecar.seedstore_service.cli", *argv]),
    ):
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            code = subprocess.run(command, env=env, stdout=stdout, stderr=stderr, timeout=60).returncode
        ended.append((code, out.read_bytes(), err.read_bytes()))
    assert ended[0] == ended[1]
    assert len(ended[0][1]) + len(ended[0][2]) > 100  # the answer or the error, in full


@pytest.mark.slow
def test_warnings_to_a_reader_that_has_gone_end_as_cli_ends(settled: Path) -> None:
    """`seedstore list 2>&1 | head -c 1` on a store with a file that does not parse: the warning
    cannot be written; the quick path ends as cli.py does (exit 1, no traceback, no answer)."""
    (settled / "capabilities" / "many" / "zz-broken.yml").write_text("id: [unclosed\n", encoding="utf-8")
    time.sleep(indexfile.RACY_WINDOW_NS / 1e9 + 0.1)
    assert run_seedstore(settled, "list").returncode == 0  # indexes the file
    assert quick(["list"]) is not None
    env = {**os.environ, "SKILLSPEC_HOME": str(settled)}
    env.pop("SEEDSTORE_SERVER", None)
    ended = []
    for command in ([SEEDSTORE, "list"], [PYTHON, "-m", "agentsidecar.seedstore_service.cli", "list"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            result = subprocess.run(
                command, env=env, stdout=subprocess.PIPE, stderr=write_end, timeout=60, check=False
            )
        finally:
            os.close(write_end)
        ended.append((result.returncode, result.stdout))
    assert ended[0] == ended[1]
    assert ended[0] == (1, b"")


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("shared")
    root = home / "capabilities"
    for seed in SEEDS:
        write_seed(root, seed)
    # What answers report too: a file that does not parse, named after no seed, and a seed's note.
    (root / "audio" / "hand-edit.yml").write_text("id: [unclosed\n", encoding="utf-8")
    write_seed(
        root, Seed(id="noted", domain="voice", kind="cli", command="n", provides=("p",), aliases=("--",))
    )
    # And a seed stored under voice that declares audio.
    write_seed(root, Seed(id="stray", domain="audio", kind="cli", command="s", provides=("text_to_speech",)))
    (root / "audio" / "stray.yml").rename(root / "voice" / "stray.yml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SKILLSPEC_HOME", str(home))
        patch.delenv("SEEDSTORE_SERVER", raising=False)
        patch.setattr(indexfile, "RACY_WINDOW_NS", 0)
        full(["list"])
    return home


_TOKENS = st.sampled_from(
    [
        "list", "search", "inspect", "store", "verify", "--domain", "--domain=voice", "--domain=",
        "voice", "audio", "text_to_speech", "say", "piper", "--json", "--json=", "--explain",
        "--local-only", "--preferred-seed", "--preferred-seed=say", "--json-style", "compact",
        "pretty", "--json-style=compact", "-x", "-", "--", "--broaden", "--server", "-h", "", "noted",
        "hand-edit", "nowhere", "stray",
    ]
)  # fmt: skip


_COMMAND_LINES = st.one_of(
    st.lists(_TOKENS, min_size=1, max_size=7),
    st.builds(
        lambda command, rest: [command, *rest],
        st.sampled_from(["list", "search", "inspect", "store"]),
        st.lists(_TOKENS, max_size=5),
    ),
)


def test_the_shared_store_is_answered_with_its_problems(shared_store: Path) -> None:
    """The random command lines below meet answers that report problems, not only declines."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SKILLSPEC_HOME", str(shared_store))
        patch.delenv("SEEDSTORE_SERVER", raising=False)
        patch.setattr(indexfile, "RACY_WINDOW_NS", 0)
        for argv in (["list"], ["search", "text_to_speech"], ["inspect", "noted"], ["inspect", "nowhere"]):
            answered = quick_streams(argv)
            assert answered is not None, argv
            assert answered == full_streams(argv), argv
            assert "hand-edit.yml" in answered[1] or "SEED_NOT_FOUND" in answered[1], argv


# Most random command lines are declined at once (no file is read): more than the default, cheaply.
@settings(max_examples=300)
@given(argv=_COMMAND_LINES)
def test_any_command_line_the_quick_path_answers_is_answered_as_cli(
    shared_store: Path, argv: list[str]
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SKILLSPEC_HOME", str(shared_store))
        patch.delenv("SEEDSTORE_SERVER", raising=False)
        patch.setattr(indexfile, "RACY_WINDOW_NS", 0)
        answered = quick_streams(argv)
        if answered is not None:
            assert answered == full_streams(argv)


@pytest.mark.slow
def test_while_two_writers_add_seeds_every_answer_matches_the_files(home: Path) -> None:
    """Two `cli.main` writers add seeds and rewrite the index; the quick path, answering all the
    while, never lists a seed its file does not hold now (each file is written once)."""
    import hashlib

    script = (
        "import sys\n"
        "from agentsidecar.seedstore_service import indexfile\n"
        "from agentsidecar.seedstore_service.cli import main\n"
        "indexfile.RACY_WINDOW_NS = 0\n"
        "for n in range(25):\n"
        "    assert main(['add', f'{sys.argv[1]}-{n}', '--domain', 'voice', '--kind', 'cli',"
        " '--provides', 'text_to_speech']) == 0\n"
        "    assert main(['list']) == 0\n"
    )
    env = {**os.environ, "SKILLSPEC_HOME": str(home)}
    writers = [
        subprocess.Popen(
            [PYTHON, "-c", script, name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        for name in ("a", "b")
    ]
    answered = 0
    with no_racy_window():
        while any(writer.poll() is None for writer in writers):
            text = quick(["list", "--domain", "voice"])
            if text is None:
                continue
            answered += 1
            for row in json.loads(text)["seeds"]:
                data = Path(row["path"]).read_bytes()
                assert hashlib.sha256(data).hexdigest()[:16] == row["revision"]
        for writer in writers:
            _, stderr = writer.communicate(timeout=120)
            assert writer.returncode == 0, stderr
        final = full(["list", "--domain", "voice"])
        assert len(json.loads(final)["seeds"]) == 50
        assert quick(["list", "--domain", "voice"]) == final
    assert answered > 0


def test_an_edit_that_puts_the_mtime_back_is_seen(store: Path) -> None:
    """Same size, mtime restored (`touch -r` after an edit): only the ctime tells, and it does."""
    path = store / "voice" / "piper.yml"
    before = path.stat()
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("piper --help", "piper --hElp"), encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert after.st_ctime_ns != before.st_ctime_ns
    for argv in (["list"], ["inspect", "piper"], ["list", "--domain", "voice"]):
        assert quick(argv) is None, argv
    shown = full(["inspect", "piper"])
    assert "piper --hElp" in shown
    assert quick(["inspect", "piper"]) == shown


def test_rows_of_sections_that_interleave_are_sorted_as_cli_sorts_them(store: Path) -> None:
    """A file in the root declaring `voice` and an id between the voice directory's: the whole-store
    list cannot join the sections' rows as they are, and sorts them instead."""
    (store / "middle.yml").write_text(
        dump_seed(Seed(id="q", domain="voice", kind="cli", command="q", provides=("p",))), encoding="utf-8"
    )
    listed = full(["list"])
    answered = quick(["list"])
    assert answered is not None
    assert answered == listed
    ids = [row["id"] for row in json.loads(listed)["seeds"] if row["domain"] == "voice"]
    assert ids == sorted(ids)
    assert ids.index("q") not in (0, len(ids) - 1)


@pytest.mark.parametrize(
    "name",
    ['quote".yml', "back\\slash.yml", "new\nline.yml", "tab\there.yml", "été.yml", "sp ace.yml"],
    ids=["quote", "backslash", "newline", "tab", "non-ascii", "space"],
)
def test_odd_file_names_are_answered_as_cli_answers(store: Path, name: str) -> None:
    write_seed(
        store, Seed(id="odd", domain="voice", kind="cli", command="odd", provides=("odd_cap",)), name[:-4]
    )
    full(["list"])
    for argv in (["list"], ["list", "--domain", "voice"], ["inspect", "odd"], ["search", "odd_cap"]):
        answered = quick(argv)
        assert answered is not None, argv
        assert answered == full(argv), argv


def _section_of(entries: list[list[object]]) -> indexfile.Section:
    data = indexfile.encode_section("/r", "d", entries)
    section = indexfile.open_section(data, "/r", "d")
    assert section is not None
    return section


def _entry(name: str, seed_id: str | None) -> list[object]:
    entry: list[object] = [None] * indexfile.ENTRY_LENGTH
    entry[indexfile.NAME], entry[indexfile.ID] = name, seed_id
    entry[indexfile.SIZE : indexfile.CHECKED + 1] = [1, 2, 3, 4, 5, 6]
    entry[indexfile.SEED] = b""
    if seed_id is None:  # a file that is not a seed: the index holds its problem and no id
        entry[indexfile.PROBLEM] = [1, "not a seed"]
    return entry


def test_names_are_compared_as_written_only_when_that_is_exact() -> None:
    """`names_are` says yes only for the names the section holds: a name holding a newline is
    written `\\n`, which a name holding a backslash and an `n` would spell as it is."""
    for held, other in (
        (["x\ny.yml"], ["x\\ny.yml"]),
        (['a","b.yml'], ["a", "b.yml"]),
        (["plain.yml", "été.yml"], ["plain.yml", "ete.yml"]),
    ):
        section = _section_of([_entry(name, "a") for name in held])
        assert not section.names_are(other), (held, other)
        assert section.names_are(held) or section.column(indexfile.NAME) == held
    assert _section_of([_entry("plain.yml", "a"), _entry("été.yml", "b")]).names_are(["plain.yml", "été.yml"])


def test_an_id_is_counted_as_a_whole_value_of_the_column() -> None:
    section = _section_of(
        [
            _entry(f"{k}.yml", seed_id)
            for k, seed_id in enumerate(['a","seed-1', "seed-1", "xseed-1", None, "seed-10"])
        ]
    )
    assert section.count_of(indexfile.ID, "seed-1") == 1
    assert section.count_of(indexfile.ID, "xseed-1") == 1
    assert section.count_of(indexfile.ID, "seed") == 0
    assert section.count_of(indexfile.ID, 'a","seed-1') == 1  # decoded: it needs escaping


def test_a_value_is_checked_alone_and_a_column_whole() -> None:
    entries = [_entry(f"{k}.yml", seed_id) for k, seed_id in enumerate(["a", "b", None])]
    entries[1][indexfile.DOMAIN] = 7  # not a string: never one the index writes
    for entry in entries:
        entry[indexfile.DOMAIN] = "d" if entry[indexfile.DOMAIN] is None else entry[indexfile.DOMAIN]
    entries[1][indexfile.ID] = None  # a seed's entry (no problem) without an id
    section = _section_of(entries)
    assert section.value(indexfile.DOMAIN, 0) == "d"
    assert section.value(indexfile.ID, 0) == "a"
    assert section.value(indexfile.ID, 2) is None  # the problem's entry: null, as written
    with pytest.raises(ValueError, match="holds a value the index never writes"):
        section.value(indexfile.DOMAIN, 1)
    with pytest.raises(ValueError, match="is null for another entry than a problem"):
        section.value(indexfile.ID, 1)
    with pytest.raises(ValueError, match="holds a value the index never writes"):
        section.column(indexfile.DOMAIN)
    with pytest.raises(ValueError, match="is null for another entry than a problem"):
        section.column(indexfile.ID)


_ROW_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)


# Pure string work per example: more than the default, cheaply.
@settings(max_examples=300)
@given(
    seed_id=_ROW_TEXT,
    domain=_ROW_TEXT,
    kind=_ROW_TEXT,
    path=_ROW_TEXT,
    provides=st.lists(_ROW_TEXT, max_size=3),
    status=_ROW_TEXT,
    risks=st.lists(_ROW_TEXT, max_size=2),
    revision=_ROW_TEXT,
)
def test_a_stored_list_row_is_the_row_the_cli_prints(
    seed_id: str,
    domain: str,
    kind: str,
    path: str,
    provides: list[str],
    status: str,
    risks: list[str],
    revision: str,
) -> None:
    from agentsidecar.seedstore_service import render
    from agentsidecar.sidecar_runtime import cli_common

    row = render.list_row_json(seed_id, domain, kind, path, provides, status, risks, revision)
    # The generic printer, key by key: what the template must write.
    printed = cli_common.dumps(render.listing_json("/r", None, [row], ()), "pretty")
    stored = indexfile.list_row_text(seed_id, domain, kind, path, provides, status, risks, revision)
    assert printed == '{\n  "seed_store": "/r",\n  "domain": null,\n  "seeds": [\n' + stored + "\n  ]\n}"


def _stat_count(stats: list[os.stat_result], by_field: list[tuple[int, ...]]) -> int:
    assert by_field == list(zip(*stats, strict=True))
    return len(stats)


def _walk_files(root: str, domain: str | None) -> list[str] | None:
    stated = walk.walk_stats(root, domain, _stat_count)
    if stated is None:
        return None
    paths: list[str] = []
    for domain_dir, parts in stated:
        prefix = indexfile.section_prefix(root, domain_dir)
        for names, count in parts:
            assert count == len(names)
            paths.extend(prefix + name for name in names)
    return sorted(paths)


_TREE = st.lists(
    st.tuples(
        st.sampled_from(["voice", "audio", "voice/sub", "voice/sub/deeper", "", "audio/x.yml"]),
        st.sampled_from(["a.yml", "b.yaml", "c.txt", "d.yml", "link.yml", "dirlink", "loop", "gone.yml"]),
        st.sampled_from(["file", "dir", "link-file", "link-dir", "link-up", "link-nowhere"]),
    ),
    max_size=10,
)


# Each example builds a small tree of files, directories and links: fewer than the default.
@pytest.mark.slow
@settings(max_examples=60)
@given(tree=_TREE)
def test_walk_stats_finds_what_walk_finds_or_gives_up(tree: list[tuple[str, str, str]]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "capabilities"
        root.mkdir()
        for directory, name, kind in tree:
            parent = root / directory
            with contextlib.suppress(OSError):
                parent.mkdir(parents=True, exist_ok=True)
                target = parent / name
                if kind == "file":
                    target.write_text("id: x\n")
                elif kind == "dir":
                    target.mkdir()
                elif kind == "link-file":
                    (parent / f"{name}.target").write_text("id: y\n")
                    target.symlink_to(parent / f"{name}.target")
                elif kind == "link-dir":
                    target.symlink_to(root / "voice", target_is_directory=True)
                elif kind == "link-up":
                    target.symlink_to(root, target_is_directory=True)
                else:
                    target.symlink_to(parent / "nowhere")
        for domain in (None, "voice", "audio"):
            refs, problems = walk.walk(str(root), domain)
            found = _walk_files(str(root), domain)
            if found is not None:
                assert not problems
                assert found == sorted(path for path, _domain_dir in refs), domain
            elif not problems:
                # It gave up where walk reports nothing: only for a name it could not stat.
                assert any(kind == "link-nowhere" for _directory, _name, kind in tree)


@pytest.mark.slow
def test_the_console_command_prints_a_list_as_cli_prints_it(settled: Path) -> None:
    """The quick path writes a pretty list as bytes; the console command's output is cli.main's."""
    assert quick(["list"]) is not None
    for argv in (["list"], ["list", "--domain", "many"]):
        result = run_seedstore(settled, *argv)
        assert result.returncode == 0, result.stderr
        assert result.stdout == full(argv), argv


def _forged_rows(count: int) -> list[Any]:
    shapes: list[Any] = [["cli", "not a list", "unverified", []], "row", ["cli", [1], "unverified", []]]
    return [shapes[number % len(shapes)] for number in range(count)]


# Columns of the voice section replaced with values the index never writes, each checksum valid.
_FORGERIES: dict[str, tuple[int, Any]] = {
    "list rows": (indexfile.ROW, _forged_rows),
    "search keys": (indexfile.KEYS, lambda count: [["tts", 7]] * count),
    "ranks": (indexfile.RANK, lambda count: ["high"] * count),
    "ids": (indexfile.ID, lambda count: [None] * count),
    "notes": (indexfile.NOTES, lambda count: [[["line", 1]]] * count),
}


@pytest.mark.parametrize("forgery", sorted(_FORGERIES))
def test_a_forged_column_never_changes_an_answer(store: Path, forgery: str) -> None:
    """A section file another program wrote, every checksum valid, its values not ones the index
    writes: the quick path declines or answers as the files do, and the full CLI answers as the
    files do (and makes the entries again from them)."""
    from .test_persisted_start import replace_column

    expected = {argv: full(argv) for argv in COMMANDS}
    position, values = _FORGERIES[forgery]
    section = store / indexfile.INDEX_DIR_NAME / indexfile.section_file_name("voice")
    count = json.loads(section.read_bytes().partition(b"\n")[0])["count"]
    for argv in COMMANDS:
        replace_column(store, "voice", position, values(count))
        answered = quick(argv)
        assert answered is None or answered == expected[argv], argv
        replace_column(store, "voice", position, values(count))
        assert full(argv) == expected[argv], argv
