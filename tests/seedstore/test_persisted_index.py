"""The persisted index (`<root>/.seedstore-index/`) never makes an answer differ from the files.

Each test compares what a store with the index answers (in-process, and through the CLI)
with what a fresh parse of the files answers (`SeedStore(root, persisted_index=False)`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service import errors, persisted
from agentsidecar.seedstore_service.model import Evidence, Seed
from agentsidecar.seedstore_service.operations import SeedOperations
from agentsidecar.seedstore_service.persisted import INDEX_DIR_NAME
from agentsidecar.seedstore_service.ranking import SearchQuery
from agentsidecar.seedstore_service.seedfile import dump_seed
from agentsidecar.seedstore_service.store import SeedStore

PYTHON = sys.executable
DOMAINS = ["voice", "audio"]
IDS = ["say", "espeak", "piper", "x"]
SEARCHES = ["text_to_speech", "speech", "voice-message", "help", "cli", "-", "s"]


def seed_text(seed_id: str, domain: str, capability: str = "text_to_speech", alias: str = "speech") -> str:
    seed = Seed(
        id=seed_id,
        domain=domain,
        kind="cli",
        command=f"{seed_id}-cli",
        provides=(capability,),
        aliases=(alias,),
        evidence=(Evidence("cli_help", f"{seed_id}-cli --help"),),
    )
    return dump_seed(seed)


def answers(seed_store: SeedStore) -> dict[str, Any]:
    """Everything the read commands answer, as comparable values (errors by type and message)."""
    result: dict[str, Any] = {}
    for domain in [None, *DOMAINS]:
        result[f"load {domain}"] = seed_store.load(domain)
        result[f"listing {domain}"] = seed_store.listing(domain)
        for seed_id in IDS:
            try:
                result[f"locate {seed_id} {domain}"] = seed_store.locate(seed_id, domain)
            except errors.SeedStoreError as error:
                result[f"locate {seed_id} {domain}"] = (type(error).__name__, error.message)
        for capability in SEARCHES:
            query = SearchQuery(capability, domain)
            result[f"search {capability} {domain}"] = SeedOperations(seed_store).search(query)
    return result


def fresh(root: Path) -> dict[str, Any]:
    return answers(SeedStore(root, persisted_index=False))


def indexed(root: Path) -> dict[str, Any]:
    return answers(SeedStore(root))


def index_files(root: Path) -> list[Path]:
    directory = root / INDEX_DIR_NAME
    return sorted(directory.iterdir()) if directory.is_dir() else []


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "capabilities"
    for domain in DOMAINS:
        (root / domain).mkdir(parents=True)
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice"))
    (root / "audio" / "espeak.yml").write_text(seed_text("espeak", "audio"))
    return root


def test_the_index_is_written_where_no_loader_reads_a_seed(root: Path) -> None:
    assert indexed(root) == fresh(root)
    files = index_files(root)
    assert files, "a load saves the index"
    # SkillSpec loads every .yml/.yaml file under the store, hidden directories included.
    assert not [
        path for path in root.rglob("*") if path.suffix in (".yml", ".yaml") and INDEX_DIR_NAME in str(path)
    ]
    assert SeedStore(root).load(None).problems == ()


def test_a_same_size_edit_that_restores_the_mtime_is_seen(root: Path) -> None:
    path = root / "voice" / "say.yml"
    assert indexed(root) == fresh(root)
    before = os.stat(path)
    # Same length, other content, and the mtime put back: only the ctime (and the bytes) differ.
    text = path.read_text().replace("text_to_speech", "text_to_sound_")
    assert len(text) == before.st_size
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(path).st_mtime_ns == before.st_mtime_ns
    assert indexed(root) == fresh(root)
    assert SeedStore(root).locate("say", None)[0].seed.provides == ("text_to_sound_",)


def test_a_racy_entry_is_compared_by_content(root: Path) -> None:
    """A coarse clock can give an edit the signature of the bytes indexed before it.

    Entries read within the racy window of their file's mtime are compared by content.
    """
    path = root / "voice" / "say.yml"
    assert indexed(root) == fresh(root)
    text = path.read_text().replace("text_to_speech", "text_to_sound_")
    path.write_text(text)
    # Forge the collision: the old entry (old content) given the new file's signature, read just now.
    section = index_files(root)
    entry_file = next(p for p in section if p.name == persisted.section_file_name("voice"))
    entries = persisted.decode_section(entry_file.read_bytes(), str(root), "voice")
    assert entries is not None
    entry = entries["say.yml"]
    entry[1:6] = list(persisted.signature_of(os.stat(path)))
    entry[6] = max(entry[2], entry[3])  # checked at the file's mtime: within the racy window
    entry_file.write_bytes(persisted.encode_section(str(root), "voice", entries.values()))
    assert SeedStore(root).locate("say", "voice")[0].seed.provides == ("text_to_sound_",)
    assert indexed(root) == fresh(root)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: b"", id="empty"),
        pytest.param(lambda data: b"\x00\xff garbage", id="garbage"),
        pytest.param(lambda data: b'{"format": "something-else"}\n[]', id="foreign"),
        pytest.param(lambda data: data.replace(b'"text_to_speech"', b'"text_to_sound_"'), id="edited-body"),
        pytest.param(lambda data: data.replace(b'"version":1', b'"version":99'), id="other-version"),
    ],
)
def test_a_damaged_index_file_is_ignored_and_rebuilt(
    root: Path, damage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No racy window: every entry is trusted by its signature alone, as it is once files are older.
    monkeypatch.setattr(persisted, "RACY_WINDOW_NS", -(10**18))
    expected = fresh(root)
    assert indexed(root) == expected
    for path in index_files(root):
        path.write_bytes(damage(path.read_bytes()))
    assert indexed(root) == expected
    for path in index_files(root):
        domain_dir = persisted.section_of_file(path.read_bytes())[1]
        assert persisted.decode_section(path.read_bytes(), str(root), domain_dir) is not None, path


def test_an_index_of_another_store_root_is_not_used(root: Path, tmp_path: Path) -> None:
    assert indexed(root) == fresh(root)
    other = tmp_path / "other" / "capabilities"
    (other / "voice").mkdir(parents=True)
    (other / "voice" / "say.yml").write_text(seed_text("say", "voice", capability="something_else"))
    (other / INDEX_DIR_NAME).mkdir()
    for path in index_files(root):
        (other / INDEX_DIR_NAME / path.name).write_bytes(path.read_bytes())
    assert indexed(other) == fresh(other)


def test_added_and_removed_files_are_seen(root: Path) -> None:
    assert indexed(root) == fresh(root)
    (root / "voice" / "piper.yaml").write_text(seed_text("piper", "voice"))
    (root / "voice" / "nested").mkdir()
    (root / "voice" / "nested" / "x.yml").write_text(seed_text("x", "voice"))
    (root / "audio" / "espeak.yml").unlink()
    assert indexed(root) == fresh(root)
    (root / "voice" / "nested" / "x.yml").write_text("id: x\nunexpected: true\n")
    assert indexed(root) == fresh(root)


def test_writes_through_the_store_keep_the_index_exact(root: Path) -> None:
    from agentsidecar.seedstore_service.patch import UpdatePatch

    seed_store = SeedStore(root)
    seed_store.update("say", None, UpdatePatch(add_provides=("tts",)), expected_revision=None, now_unix=1)
    assert indexed(root) == fresh(root)
    seed_store.remove("espeak", None)
    assert indexed(root) == fresh(root)


# -- random edits by another program ----------------------------------------------

edits = st.lists(
    st.tuples(
        st.sampled_from(["write", "write-same-size", "delete", "break", "move-domain", "touch-back"]),
        st.sampled_from(DOMAINS),
        st.sampled_from(IDS),
        st.sampled_from(["text_to_speech", "speech", "voice_message"]),
    ),
    min_size=1,
    max_size=12,
)


def apply_edit(root: Path, edit: tuple[str, str, str, str]) -> None:
    kind, domain, seed_id, capability = edit
    path = root / domain / f"{seed_id}.yml"
    if kind == "write":
        path.write_text(seed_text(seed_id, domain, capability))
    elif kind == "write-same-size" and path.exists():
        before = os.stat(path)
        data = path.read_bytes()
        flipped = (
            data.replace(b"cli\n", b"clj\n", 1) if b"cli\n" in data else data.replace(b"clj\n", b"cli\n", 1)
        )
        path.write_bytes(flipped)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif kind == "delete" and path.exists():
        path.unlink()
    elif kind == "break":
        path.write_text(f"id: {seed_id}\nunexpected: true\n")
    elif kind == "move-domain":
        other = DOMAINS[1 - DOMAINS.index(domain)]
        path.write_text(seed_text(seed_id, other, capability))  # stored under one domain, declaring another
    elif kind == "touch-back" and path.exists():
        os.utime(path, ns=(0, 0))


# Each example writes a whole store and reads it back both ways.
@pytest.mark.slow
@settings(max_examples=40)
@given(steps=st.lists(edits, min_size=1, max_size=4))
def test_random_edits_never_make_the_index_answer_differently(
    steps: list[list[tuple[str, str, str, str]]],
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory) / "capabilities"
        for domain in DOMAINS:
            (root / domain).mkdir(parents=True)
        for batch in steps:
            for edit in batch:
                apply_edit(root, edit)
            assert indexed(root) == fresh(root)
            assert indexed(root) == fresh(root)  # the index as just saved, now trusted


# -- the CLI ------------------------------------------------------------------------


def run_cli(home: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SKILLSPEC_HOME": str(home)}
    env.pop("SEEDSTORE_SERVER", None)
    return subprocess.run(
        [PYTHON, "-m", "agentsidecar.seedstore_service.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_two_cli_writers_at_once_leave_an_exact_index(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = (
        "import sys\n"
        "from agentsidecar.seedstore_service.cli import main\n"
        "for n in range(15):\n"
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
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        assert writer.returncode == 0, stderr
    root = home / "capabilities"
    assert len(SeedStore(root, persisted_index=False).load(None).seeds) == 30
    assert indexed(root) == fresh(root)
    listed = run_cli(home, "list")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["seeds"]) == 30


def test_cli_output_is_the_same_with_the_index_and_after_an_edit_by_another_program(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = home / "capabilities"
    (root / "voice").mkdir(parents=True)
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice"))
    commands = [["list"], ["search", "text_to_speech", "--domain", "voice", "--json"], ["inspect", "say"]]
    first = [run_cli(home, *argv) for argv in commands]
    assert index_files(root)
    again = [run_cli(home, *argv) for argv in commands]
    assert [(r.returncode, r.stdout, r.stderr) for r in first] == [
        (r.returncode, r.stdout, r.stderr) for r in again
    ]
    path = root / "voice" / "say.yml"
    before = os.stat(path)
    path.write_text(path.read_text().replace("text_to_speech", "text_to_sound_"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    search = run_cli(home, "search", "text_to_speech", "--domain", "voice", "--json")
    assert search.returncode == 0, search.stderr
    (candidate,) = json.loads(search.stdout)["candidates"]
    assert candidate["reasons"][0] == "alias or evidence text match"  # no longer provides it


@pytest.mark.slow
def test_local_read_commands_import_no_grpc_asyncio_yaml_or_server(tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = home / "capabilities"
    (root / "voice").mkdir(parents=True)
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice"))
    time.sleep(persisted.RACY_WINDOW_NS / 1e9 + 0.1)  # past the racy window: the index is trusted as saved
    script = (
        "import contextlib, io, sys\n"
        "from agentsidecar.seedstore_service.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['list'])\n"  # builds the index (parses YAML)
        "heavy = ('grpc', 'asyncio', 'yaml', 'rich', 'jsonschema', 'google.protobuf',"
        " 'agentsidecar.clients', 'prometheus_client', 'filelock',"
        " 'agentsidecar.seedstore_service.server', 'agentsidecar.seedstore_service.seedfile')\n"
        "for argv in (['store'], ['list'], ['search', 'text_to_speech', '--domain', 'voice', '--json'],"
        " ['inspect', 'say'], ['list', '--domain', 'voice']):\n"
        "    for name in [m for m in sys.modules if m.split('.')[0] in heavy or m in heavy"
        " or m.startswith(tuple(h + '.' for h in heavy))]:\n"
        "        del sys.modules[name]\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        assert main(argv) == 0, argv\n"
        "    loaded = sorted(m for m in heavy if m in sys.modules)\n"
        "    assert not loaded, (argv, loaded)\n"
    )
    env = {**os.environ, "SKILLSPEC_HOME": str(home)}
    done = subprocess.run([PYTHON, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_read_only_store_still_answers_from_the_files(root: Path) -> None:
    if os.geteuid() == 0:
        # root writes anyway; make the index directory a file instead, so it cannot be created.
        (root / INDEX_DIR_NAME).write_text("not a directory")
    else:
        for path in [root, *root.iterdir()]:
            path.chmod(0o555)
    try:
        assert indexed(root) == fresh(root)
    finally:
        for path in [root, *root.iterdir()]:
            path.chmod(0o755)


def test_a_stale_index_after_many_edits_costs_no_wrong_answer_in_the_same_second(root: Path) -> None:
    """Edits within one second of the index being written, same size each time."""
    path = root / "voice" / "say.yml"
    for capability in ["aaaaaaaaaaaaaa", "bbbbbbbbbbbbbb", "text_to_speech"]:
        path.write_text(seed_text("say", "voice", capability))
        assert indexed(root) == fresh(root)
        time.sleep(0.01)


# -- the service's in-memory index ---------------------------------------------------


@pytest.mark.slow
def test_the_service_index_starts_from_the_persisted_index_and_still_sees_edits(root: Path) -> None:
    from agentsidecar.seedstore_service.index import SeedIndex

    (root / "voice" / "piper.yml").write_text(seed_text("piper", "voice"))
    (root / "audio" / "x.yml").write_text(seed_text("x", "audio"))
    time.sleep(persisted.RACY_WINDOW_NS / 1e9 + 0.1)  # past the racy window: entries are trusted
    first = SeedIndex(SeedStore(root))
    first.refresh()
    assert first.last_refresh is not None
    assert (first.last_refresh.files, first.last_refresh.read) == (4, 4)

    # Between two starts, another program edits (same size, mtime put back), removes and adds files.
    path = root / "voice" / "say.yml"
    before = os.stat(path)
    path.write_text(path.read_text().replace("text_to_speech", "text_to_sound_"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    (root / "audio" / "x.yml").unlink()
    (root / "audio" / "say.yaml").write_text(seed_text("say", "audio"))

    second = SeedIndex(SeedStore(root))
    second.refresh()
    assert second.last_refresh is not None
    # espeak and piper come from the persisted index; the edited and the new file are read.
    assert (second.last_refresh.files, second.last_refresh.from_persisted, second.last_refresh.read) == (
        4,
        2,
        2,
    )
    reference = SeedStore(root, persisted_index=False)
    for domain in [None, *DOMAINS]:
        assert second.scope(domain) == reference.load(domain)
        for capability in SEARCHES:
            query = SearchQuery(capability, domain)
            outcome = SeedOperations(reference).search(query)
            assert second.search(query) == (outcome.result, outcome.problems)
