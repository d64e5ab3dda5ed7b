"""The disk shell: root resolution, loading with problems, atomic writes, lookups and refusals."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from agentsidecar.seedstore_service import errors, store
from agentsidecar.seedstore_service.model import Outcome, Problem, Seed, Verification, VerificationStatus
from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch, apply_patch, build_seed
from agentsidecar.seedstore_service.persisted import INDEX_DIR_NAME
from agentsidecar.seedstore_service.seedfile import dump_seed, parse_seed, revision_of
from agentsidecar.seedstore_service.store import SeedStore, StoredSeed, resolve_store_root

FULL_SPEC = AddSpec(
    id="remote-voice-cli",
    domain="voice",
    kind="cli",
    command="voice-cli",
    provides=("text_to_speech",),
    aliases=("voice message",),
    preferred_for=("realistic_voice",),
    avoid_for=("offline",),
    ties=("quality=high",),
    auth_env=("VOICE_TOKEN",),
    priority=80,
    external_service=True,
    may_cost_money=True,
    evidence_commands=("voice-cli --help",),
    suggested_skill_id="voice.provider",
)


def simple_seed(seed_id: str, domain: str = "voice", *provides: str) -> Seed:
    return Seed(
        id=seed_id, domain=domain, kind="cli", command=seed_id, provides=provides or ("text_to_speech",)
    )


def put(root: Path, relative: str, content: str | bytes) -> Path:
    """Write a file as another program would (no lock, no temp file)."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def put_seed(root: Path, seed: Seed, file_name: str | None = None, domain_dir: str | None = None) -> Path:
    return put(root, f"{domain_dir or seed.domain}/{file_name or seed.id + '.yml'}", dump_seed(seed))


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` with its bytes, to prove nothing was touched.

    The lock and the persisted index (a cache of what the files parse to) are not the store's content.
    """
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
        and path.name != store.LOCK_FILE_NAME
        and INDEX_DIR_NAME not in path.relative_to(directory).parts
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "home" / "capabilities"


@pytest.fixture
def seed_store(root: Path) -> SeedStore:
    return SeedStore(root)


BROKEN = "id: broken\ndomain: voice\nkind: cli\nsurprise: 1\n"


# --- root resolution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SKILLSPEC_HOME": "/srv/skills", "HOME": "/home/u"}, Path("/srv/skills/capabilities")),
        ({"SKILLSPEC_HOME": "relative/dir"}, Path("relative/dir/capabilities")),
        ({"SKILLSPEC_HOME": "", "HOME": "/home/u"}, Path("capabilities")),
        ({"HOME": "/home/u"}, Path("/home/u/.skillspec/capabilities")),
    ],
)
def test_resolve_store_root(env: dict[str, str], expected: Path) -> None:
    assert resolve_store_root(env) == expected


def test_resolve_store_root_is_not_absolutized() -> None:
    assert str(resolve_store_root({"SKILLSPEC_HOME": ""})) == "capabilities"
    assert str(resolve_store_root({"SKILLSPEC_HOME": "a/../b"})) == "a/../b/capabilities"


def test_resolve_store_root_without_home() -> None:
    with pytest.raises(errors.StoreUnavailable, match=r"^HOME is not set; set SKILLSPEC_HOME or HOME$"):
        resolve_store_root({"PATH": "/usr/bin"})


# --- add ----------------------------------------------------------------------------------------


def test_add_writes_the_dumped_seed_and_creates_directories(seed_store: SeedStore, root: Path) -> None:
    stored = seed_store.add(FULL_SPEC)

    path = root / "voice" / "remote-voice-cli.yml"
    data = path.read_bytes()
    assert stored == StoredSeed(build_seed(FULL_SPEC), str(path), revision_of(data))
    assert data.decode() == dump_seed(build_seed(FULL_SPEC))
    assert parse_seed(data.decode(), str(path)) == build_seed(FULL_SPEC)
    assert sorted(os.listdir(path.parent)) == ["remote-voice-cli.yml"]  # no temp file left behind


def test_add_replaces_a_valid_seed_and_drops_its_verification(seed_store: SeedStore, root: Path) -> None:
    verified = dataclasses.replace(
        simple_seed("remote-voice-cli"),
        verification=Verification(VerificationStatus.VERIFIED, 1_700_000_000),
    )
    put_seed(root, verified)

    stored = seed_store.add(FULL_SPEC)

    assert stored.seed.verification is None
    assert (root / "voice" / "remote-voice-cli.yml").read_text() == dump_seed(build_seed(FULL_SPEC))


def test_add_never_overwrites_a_malformed_file(seed_store: SeedStore, root: Path) -> None:
    broken = put(root, "voice/remote-voice-cli.yml", BROKEN)

    with pytest.raises(errors.SeedMalformed) as caught:
        seed_store.add(FULL_SPEC)

    assert caught.value.path == str(broken)
    assert caught.value.line == 4
    assert broken.read_text() == BROKEN


def test_add_validates_before_touching_disk(seed_store: SeedStore, root: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="missing required field provides"):
        seed_store.add(AddSpec(id="x", domain="voice", kind="cli"))
    assert not root.exists()


# --- load ---------------------------------------------------------------------------------------


def test_load_reports_a_malformed_file_with_path_and_line_and_keeps_the_rest(
    seed_store: SeedStore, root: Path
) -> None:
    good = put_seed(root, simple_seed("say"))
    broken = put(root, "voice/broken.yml", BROKEN)

    scope = seed_store.load(None)

    assert [stored.path for stored in scope.seeds] == [str(good)]
    assert len(scope.problems) == 1
    problem = scope.problems[0]
    assert problem.path == str(broken)
    assert problem.line == 4
    assert problem.reason.startswith(f"failed to parse YAML from {broken}: ")
    assert "surprise" in problem.reason


def test_load_finds_yml_and_yaml_recursively_in_sorted_order(seed_store: SeedStore, root: Path) -> None:
    put_seed(root, simple_seed("b"), "b.yaml")
    put_seed(root, simple_seed("a"))
    put_seed(root, simple_seed("deep"), "nested/deeper/deep.yml")
    put(root, "top.yml", dump_seed(simple_seed("top", "misc")))
    put(root, "voice/ignored.YML", "not: loaded")
    put(root, "voice/notes.txt", "not loaded")

    scope = seed_store.load(None)

    assert [stored.path for stored in scope.seeds] == [
        str(root / "top.yml"),
        str(root / "voice" / "a.yml"),
        str(root / "voice" / "b.yaml"),
        str(root / "voice" / "nested" / "deeper" / "deep.yml"),
    ]
    assert scope.problems == ()
    assert all(stored.revision == revision_of(Path(stored.path).read_bytes()) for stored in scope.seeds)


def test_load_of_a_missing_store_or_domain_is_empty(seed_store: SeedStore, root: Path) -> None:
    assert seed_store.load(None) == store.LoadedScope((), ())
    put_seed(root, simple_seed("say"))
    assert seed_store.load("audio") == store.LoadedScope((), ())


def test_load_with_domain_reports_a_seed_declaring_another_domain(seed_store: SeedStore, root: Path) -> None:
    put_seed(root, simple_seed("say"))
    stray = put_seed(root, simple_seed("mixer", "audio"), domain_dir="voice")

    scope = seed_store.load("voice")

    assert [stored.seed.id for stored in scope.seeds] == ["say"]
    assert scope.problems == (
        Problem(str(stray), 2, f'seed {stray} is stored under domain "voice" but declares domain "audio"'),
    )
    # Without --domain the seed is just a seed, as in SkillSpec.
    assert sorted(stored.seed.id for stored in seed_store.load(None).seeds) == ["mixer", "say"]


def test_load_ignores_temp_files_and_the_lock_file(seed_store: SeedStore, root: Path) -> None:
    put_seed(root, simple_seed("say"))
    put(root, "voice/.say.yml.tmp-0123456789ab", "id: say\ndomain: voi")  # a writer killed mid-write
    seed_store.update(
        "say", None, UpdatePatch(add_provides=("voice_message",)), expected_revision=None, now_unix=1
    )

    scope = seed_store.load(None)

    assert [stored.seed.id for stored in scope.seeds] == ["say"]
    assert scope.problems == ()
    assert (root / store.LOCK_FILE_NAME).exists()


def test_load_survives_a_symlink_loop(seed_store: SeedStore, root: Path) -> None:
    put_seed(root, simple_seed("say"))
    (root / "voice" / "loop").symlink_to(root)

    scope = seed_store.load(None)

    assert [stored.seed.id for stored in scope.seeds] == ["say"]


def test_load_follows_directory_symlinks_like_skillspec(seed_store: SeedStore, root: Path) -> None:
    put_seed(root, simple_seed("say"))
    (root / "speech").symlink_to(root / "voice")

    paths = [stored.path for stored in seed_store.load(None).seeds]

    assert paths == [str(root / "speech" / "say.yml"), str(root / "voice" / "say.yml")]


def test_load_reports_unreadable_and_non_utf8_files(seed_store: SeedStore, root: Path) -> None:
    put(root, "voice/latin1.yml", b"id: caf\xe9\n")
    dangling = root / "voice" / "gone.yml"
    dangling.symlink_to(root / "voice" / "nowhere.yml")

    problems = seed_store.load(None).problems

    assert problems == (
        Problem(str(dangling), 0, f"failed to read {dangling}: No such file or directory (os error 2)"),
        Problem(
            str(root / "voice" / "latin1.yml"),
            0,
            f"failed to read {root / 'voice' / 'latin1.yml'}: stream did not contain valid UTF-8",
        ),
    )


# --- locate -------------------------------------------------------------------------------------


def test_locate_same_id_in_two_domains_is_ambiguous_without_domain(seed_store: SeedStore, root: Path) -> None:
    voice = put_seed(root, simple_seed("say"))
    audio = put_seed(root, simple_seed("say", "audio"))

    with pytest.raises(errors.AmbiguousSeed) as caught:
        seed_store.locate("say", None)

    assert caught.value.paths == [str(audio), str(voice)]
    assert str(caught.value) == 'capability seed "say" exists in multiple domains; pass --domain'
    found, problems = seed_store.locate("say", "audio")
    assert found.path == str(audio)
    assert problems == ()


def test_locate_yml_and_yaml_of_one_id_is_ambiguous_even_with_domain(
    seed_store: SeedStore, root: Path
) -> None:
    put_seed(root, simple_seed("say"))
    put_seed(root, simple_seed("say"), "say.yaml")

    with pytest.raises(errors.AmbiguousSeed):
        seed_store.locate("say", "voice")


def test_locate_unknown_id(seed_store: SeedStore, root: Path) -> None:
    put_seed(root, simple_seed("say"))
    with pytest.raises(errors.SeedNotFound, match=r'^unknown capability seed "espeak"$'):
        seed_store.locate("espeak", None)


def test_locate_finds_a_seed_whose_file_name_differs_from_its_id(seed_store: SeedStore, root: Path) -> None:
    path = put_seed(root, simple_seed("say"), "legacy-name.yml")
    found, _ = seed_store.locate("say", None)
    assert found.path == str(path)


# --- update -------------------------------------------------------------------------------------


def test_update_keeps_unspecified_fields(seed_store: SeedStore, root: Path) -> None:
    original = seed_store.add(FULL_SPEC)
    patch = UpdatePatch(add_provides=("voice_message",), priority=35)

    updated, problems = seed_store.update(
        "remote-voice-cli", "voice", patch, expected_revision=original.revision, now_unix=1_700_000_000
    )

    expected = dataclasses.replace(
        original.seed,
        provides=("text_to_speech", "voice_message"),
        rank=dataclasses.replace(original.seed.rank, default_priority=35),
    )
    assert updated.seed == expected
    assert updated.seed == apply_patch(original.seed, patch, 1_700_000_000)
    assert problems == ()
    data = Path(original.path).read_bytes()
    assert data.decode() == dump_seed(expected)
    assert updated == StoredSeed(expected, original.path, revision_of(data))
    assert updated.revision != original.revision


def test_update_writes_back_to_the_file_it_found(seed_store: SeedStore, root: Path) -> None:
    path = put_seed(root, simple_seed("say"), "legacy-name.yaml")

    updated, _ = seed_store.update(
        "say", None, UpdatePatch(kind="adapter"), expected_revision=None, now_unix=1
    )

    assert updated.path == str(path)
    assert parse_seed(path.read_text(), str(path)).kind == "adapter"
    assert sorted(os.listdir(root / "voice")) == ["legacy-name.yaml"]


def test_update_with_a_stale_revision_is_refused_and_writes_nothing(
    seed_store: SeedStore, root: Path
) -> None:
    first = seed_store.add(FULL_SPEC)
    second, _ = seed_store.update(
        "remote-voice-cli",
        None,
        UpdatePatch(add_aliases=("tts",)),
        expected_revision=first.revision,
        now_unix=1,
    )
    before = tree(root)

    with pytest.raises(errors.RevisionMismatch) as caught:
        seed_store.update(
            "remote-voice-cli", None, UpdatePatch(kind="script"), expected_revision=first.revision, now_unix=2
        )

    assert (caught.value.expected, caught.value.actual) == (first.revision, second.revision)
    assert caught.value.seed_id == "remote-voice-cli"
    assert tree(root) == before


def test_update_with_an_invalid_patch_writes_nothing(seed_store: SeedStore, root: Path) -> None:
    seed_store.add(FULL_SPEC)
    before = tree(root)

    with pytest.raises(errors.InvalidIdentifier, match='"Bad Cap" in add-provides'):
        seed_store.update(
            "remote-voice-cli",
            None,
            UpdatePatch(kind="script", add_provides=("Bad Cap",)),
            expected_revision=None,
            now_unix=1,
        )

    assert tree(root) == before


def test_update_keeps_the_file_mode(seed_store: SeedStore, root: Path) -> None:
    stored = seed_store.add(FULL_SPEC)
    os.chmod(stored.path, 0o600)

    seed_store.update(
        "remote-voice-cli", None, UpdatePatch(kind="script"), expected_revision=None, now_unix=1
    )

    assert stat.S_IMODE(os.stat(stored.path).st_mode) == 0o600


def test_update_in_a_store_that_does_not_exist_creates_nothing(seed_store: SeedStore, root: Path) -> None:
    with pytest.raises(errors.SeedNotFound):
        seed_store.update("say", None, UpdatePatch(kind="cli"), expected_revision=None, now_unix=1)
    assert not root.exists()


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    seed_store: SeedStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = seed_store.add(FULL_SPEC)
    before = tree(root)

    def refuse_rename(source: str | Path, target: str | Path, **dir_fds: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse_rename)
    with pytest.raises(errors.StoreUnavailable) as caught:
        seed_store.update("remote-voice-cli", None, UpdatePatch(kind="x"), expected_revision=None, now_unix=1)

    assert str(caught.value) == f"failed to write {stored.path}: No space left on device (os error 28)"
    assert tree(root) == before


# --- malformed files are never targeted ---------------------------------------------------------


def test_malformed_file_blocks_edits_of_its_id_but_not_of_other_seeds(
    seed_store: SeedStore, root: Path
) -> None:
    put_seed(root, simple_seed("say"))
    broken = put(root, "voice/broken.yml", BROKEN)
    snapshot = broken.read_bytes()

    with pytest.raises(errors.SeedMalformed) as caught:
        seed_store.update("broken", None, UpdatePatch(kind="x"), expected_revision=None, now_unix=1)
    assert caught.value.path == str(broken)
    assert caught.value.line == 4
    assert str(caught.value).startswith(f"failed to parse YAML from {broken}: ")
    with pytest.raises(errors.SeedMalformed):
        seed_store.prefer("broken", "voice", "speech", 50)
    with pytest.raises(errors.SeedMalformed):
        seed_store.remove("broken", None)
    with pytest.raises(errors.SeedMalformed):
        seed_store.add(AddSpec(id="broken", domain="voice", kind="cli", provides=("speech",)))
    assert broken.read_bytes() == snapshot

    updated, problems = seed_store.update(
        "say", None, UpdatePatch(add_aliases=("speak",)), expected_revision=None, now_unix=1
    )
    assert updated.seed.aliases == ("speak",)
    assert [problem.path for problem in problems] == [str(broken)]


def test_unknown_id_next_to_a_malformed_file_is_not_found(seed_store: SeedStore, root: Path) -> None:
    put(root, "voice/broken.yml", BROKEN)
    with pytest.raises(errors.SeedNotFound):
        seed_store.locate("say", None)


# --- prefer, remove, write_verification ---------------------------------------------------------


def test_prefer_appends_preferred_for_and_sets_priority(seed_store: SeedStore) -> None:
    original = seed_store.add(FULL_SPEC)

    updated, _ = seed_store.prefer(
        "remote-voice-cli", None, "narration", 90, expected_revision=original.revision
    )

    assert updated.seed.rank.preferred_for == ("realistic_voice", "narration")
    assert updated.seed.rank.default_priority == 90
    assert parse_seed(Path(updated.path).read_text(), updated.path) == updated.seed
    with pytest.raises(errors.RevisionMismatch):
        seed_store.prefer("remote-voice-cli", None, "calls", None, expected_revision=original.revision)


def test_remove_deletes_the_file_and_keeps_the_domain_directory(seed_store: SeedStore, root: Path) -> None:
    stored = seed_store.add(FULL_SPEC)

    removed, problems = seed_store.remove("remote-voice-cli", "voice")

    assert removed == stored.path
    assert problems == ()
    assert not Path(stored.path).exists()
    assert (root / "voice").is_dir()
    with pytest.raises(errors.SeedNotFound):
        seed_store.remove("remote-voice-cli", "voice")


def test_write_verification_keeps_edits_made_while_checks_ran(seed_store: SeedStore) -> None:
    stored = seed_store.add(FULL_SPEC)
    # Someone edits the seed between the verifier's read and its write.
    seed_store.update(
        "remote-voice-cli", None, UpdatePatch(add_aliases=("tts",)), expected_revision=None, now_unix=1
    )
    verdict = Verification(
        VerificationStatus.VERIFIED, 1_700_000_123, (Outcome("path_lookup:voice-cli", True, "found"),)
    )

    written = seed_store.write_verification(stored.path, "remote-voice-cli", verdict)

    assert written.seed.aliases == ("voice message", "tts")
    assert written.seed.verification == verdict
    on_disk = Path(stored.path).read_bytes()
    assert parse_seed(on_disk.decode(), stored.path) == written.seed
    assert written.revision == revision_of(on_disk)


def test_write_verification_refuses_missing_replaced_malformed_and_foreign_files(
    seed_store: SeedStore, root: Path, tmp_path: Path
) -> None:
    verdict = Verification(VerificationStatus.FAILED, 1)
    seed_store.add(FULL_SPEC)
    with pytest.raises(errors.SeedNotFound):
        seed_store.write_verification(str(root / "voice" / "gone.yml"), "gone", verdict)
    with pytest.raises(errors.SeedNotFound):
        seed_store.write_verification(str(root / "voice" / "remote-voice-cli.yml"), "other-id", verdict)
    broken = put(root, "voice/broken.yml", BROKEN)
    with pytest.raises(errors.SeedMalformed):
        seed_store.write_verification(str(broken), "broken", verdict)
    assert broken.read_text() == BROKEN
    outside = put(tmp_path, "elsewhere/x.yml", dump_seed(simple_seed("x")))
    for path in (str(outside), str(root / ".." / "elsewhere" / "x.yml"), str(root / "voice" / "notes.txt")):
        with pytest.raises(errors.InvalidArgument):
            seed_store.write_verification(path, "x", verdict)
    assert parse_seed(outside.read_text(), str(outside)).verification is None


# --- identifiers --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["..", "../x", "a/b", ".hidden", "a\\b", "", "Upper"])
def test_identifier_traversal_is_rejected_before_touching_disk(
    seed_store: SeedStore, root: Path, tmp_path: Path, bad: str
) -> None:
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    calls: list[Callable[[], object]] = [
        lambda: seed_store.load(bad),
        lambda: seed_store.locate(bad, None),
        lambda: seed_store.locate("say", bad),
        lambda: seed_store.update(bad, None, UpdatePatch(kind="x"), expected_revision=None, now_unix=1),
        lambda: seed_store.update("say", bad, UpdatePatch(kind="x"), expected_revision=None, now_unix=1),
        lambda: seed_store.prefer(bad, None, "speech", None),
        lambda: seed_store.prefer("say", bad, "speech", None),
        lambda: seed_store.remove(bad, None),
        lambda: seed_store.remove("say", bad),
        lambda: seed_store.add(AddSpec(id=bad, domain="voice", kind="cli", provides=("speech",))),
        lambda: seed_store.add(AddSpec(id="say", domain=bad, kind="cli", provides=("speech",))),
        lambda: seed_store.write_verification(
            str(root / "voice" / "say.yml"), bad, Verification(VerificationStatus.FAILED, 1)
        ),
    ]
    for call in calls:
        with pytest.raises(errors.InvalidIdentifier):
            call()
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before


def test_identifier_errors_use_skillspec_labels(seed_store: SeedStore) -> None:
    with pytest.raises(errors.InvalidIdentifier, match=r'^invalid identifier "\.\." in capability id$'):
        seed_store.remove("..", None)
    with pytest.raises(errors.InvalidIdentifier, match=r'^invalid identifier "a/b" in domain$'):
        seed_store.remove("say", "a/b")
