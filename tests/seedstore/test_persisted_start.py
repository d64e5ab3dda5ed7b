"""The service starts from the persisted index without a Seed per file, and still answers as the files do."""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentsidecar.clients.seedstore import SeedStoreClient
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import indexfile, paging, persisted, seedtext
from agentsidecar.seedstore_service.index import SeedIndex
from agentsidecar.seedstore_service.operations import SeedOperations
from agentsidecar.seedstore_service.ranking import SearchQuery
from agentsidecar.seedstore_service.store import SeedStore, listed_seed

from .conftest import ServerThread
from .test_persisted_index import DOMAINS, SEARCHES, seed_text

pytestmark = pytest.mark.slow


def write_store(root: Path) -> None:
    for domain in DOMAINS:
        (root / domain).mkdir(parents=True, exist_ok=True)
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice"))
    (root / "voice" / "piper.yml").write_text(seed_text("piper", "voice"))
    (root / "audio" / "espeak.yml").write_text(seed_text("espeak", "audio"))
    (root / "audio" / "x.yml").write_text(seed_text("x", "audio"))
    (root / "audio" / "broken.yml").write_text("id: [unclosed\n")
    time.sleep(persisted.RACY_WINDOW_NS / 1e9 + 0.1)  # past the racy window: entries are trusted
    SeedStore(root).load(None)  # writes the persisted index


def edit_keeping_size_and_mtime(path: Path, old: str, new: str) -> None:
    before = os.stat(path)
    path.write_text(path.read_text().replace(old, new))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def assert_answers_as_the_files(
    index: SeedIndex, root: Path, domains: list[str] = DOMAINS, ids: tuple[str, ...] = ()
) -> None:
    reference = SeedStore(root, persisted_index=False)
    for domain in [None, *domains]:
        for capability in SEARCHES:
            query = SearchQuery(capability, domain)
            outcome = SeedOperations(reference).search(query)
            assert index.search(query) == (outcome.result, outcome.problems), (capability, domain)
        assert index.scope(domain) == reference.load(domain)
        assert index.listing(domain) == _listing_of(reference, domain)
    for seed_id in ["say", "espeak", "x", "broken", *ids]:
        assert index.lookup(seed_id, None) == _lookup_of(reference, seed_id)


def count_decoded_seeds(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The seeds the persisted index decodes from now on, one item each."""
    decoded: list[object] = []
    real_seed_from_json = seedtext.seed_from_json

    def counting(value: Any) -> Any:
        decoded.append(value)
        return real_seed_from_json(value)

    monkeypatch.setattr(persisted, "seed_from_json", counting)
    return decoded


def _listing_of(reference: SeedStore, domain: str | None) -> Any:
    """The listing as `list_seeds` orders it, every row made from a decoded seed."""
    scope = reference.load(domain)
    rows = [listed_seed(stored.seed, stored.path, stored.revision) for stored in scope.seeds]
    return (tuple(sorted(rows, key=paging.seed_key)), tuple(sorted(scope.problems, key=paging.problem_key)))


def _lookup_of(reference: SeedStore, seed_id: str) -> Any:
    index = SeedIndex(reference)
    index.refresh()
    return index.lookup(seed_id, None)


def test_the_index_starts_from_the_persisted_index_without_a_seed_and_checks_what_it_answers_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "capabilities"
    write_store(root)
    # While the service was stopped: a same-size edit with the mtime put back, and a removal.
    edit_keeping_size_and_mtime(root / "voice" / "say.yml", "text_to_speech", "text_to_sound_")
    (root / "audio" / "x.yml").unlink()

    decoded = count_decoded_seeds(monkeypatch)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    assert decoded == []  # no seed is built to start
    assert index.last_refresh is not None
    # The broken file is read again at the start (problems are in every answer); nothing else is.
    assert (index.last_refresh.files, index.last_refresh.read) == (4, 1)

    assert_answers_as_the_files(index, root)
    assert len(decoded) < 20  # only the seeds the answers needed

    # A file added while the service was stopped is found by the sweep, the first whole refresh.
    (root / "audio" / "say.yaml").write_text(seed_text("say", "audio"))
    events = index.refresh()
    assert {(event.kind, Path(event.path).name) for event in events} >= {
        ("added", "say.yaml"),
        ("removed", "x.yml"),
        ("updated", "say.yml"),
    }
    assert_answers_as_the_files(index, root)


def test_a_store_without_a_persisted_index_is_not_started_from_it(tmp_path: Path) -> None:
    root = tmp_path / "capabilities"
    (root / "voice").mkdir(parents=True)
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice"))
    assert not SeedIndex(SeedStore(root)).start_from_persisted()
    assert not SeedIndex(SeedStore(root, persisted_index=False)).start_from_persisted()


def test_the_service_started_from_the_persisted_index_answers_as_the_files(
    home: Path, start_server: Callable[..., ServerThread]
) -> None:
    root = home / "capabilities"
    write_store(root)
    edit_keeping_size_and_mtime(root / "voice" / "say.yml", "text_to_speech", "text_to_sound_")
    server = start_server(refresh_interval=60.0)
    with SeedStoreClient(server.unix_target) as client:
        found = client.search_seeds(pb.SearchSeedsRequest(capability="text_to_speech", local_only=True))
        direct = {
            candidate.id
            for candidate in found.candidates
            if "direct provides match" in " ".join(candidate.reasons)
        }
        assert direct == {"espeak", "piper", "x"}  # say no longer provides it (it matches by its alias)
        found = client.search_seeds(pb.SearchSeedsRequest(capability="text_to_sound_", local_only=True))
        assert [candidate.id for candidate in found.candidates] == ["say"]
        assert [problem.path for problem in found.problems] == [str(root / "audio" / "broken.yml")]


@pytest.mark.parametrize("saved_by", ["a load", "the service's sweep"])
def test_files_added_and_removed_while_stopped_are_seen_at_the_start_before_any_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved_by: str
) -> None:
    # A shorter racy window keeps the test fast; the rule is the same.
    monkeypatch.setattr(persisted, "RACY_WINDOW_NS", 300_000_000)
    root = tmp_path / "capabilities"
    write_store(root)
    if saved_by == "the service's sweep":
        # The load above made the index directory: wait until the root is past its racy window.
        time.sleep(persisted.RACY_WINDOW_NS / 1e9 + 0.1)
        SeedIndex(SeedStore(root)).refresh()
    # While the service was stopped: a seed added to a domain, one in a new domain, one removed.
    (root / "audio" / "festival.yml").write_text(seed_text("festival", "audio"))
    (root / "video").mkdir()
    (root / "video" / "clip.yml").write_text(seed_text("clip", "video", "speech_to_video"))
    (root / "voice" / "piper.yml").unlink()

    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    # No refresh: every answer comes from the start alone.
    assert_answers_as_the_files(index, root, [*DOMAINS, "video"], ("festival", "clip", "piper"))
    reference = SeedStore(root, persisted_index=False)
    assert index.scope(None) == reference.load(None)
    found = index.search(SearchQuery("text_to_speech", None))[0]
    assert {candidate.id for candidate in found.candidates} >= {"festival"}
    assert "piper" not in {candidate.id for candidate in found.candidates}
    assert [stored.seed.id for stored in index.scope("video").seeds] == ["clip"]
    # The changes found at the start reach watchers with the next refresh.
    events = index.refresh()
    assert {(event.kind, event.id) for event in events} >= {
        ("added", "festival"),
        ("added", "clip"),
        ("removed", "piper"),
    }
    assert_answers_as_the_files(index, root, [*DOMAINS, "video"], ("festival", "clip", "piper"))


def test_the_start_splits_no_seed_text_and_a_seed_decoded_later_answers_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "capabilities"
    write_store(root)
    split: list[int] = []
    real_seeds = indexfile.Section.seeds

    def counting(section: indexfile.Section) -> list[bytes]:
        split.append(section.count)
        return real_seeds(section)

    monkeypatch.setattr(indexfile.Section, "seeds", counting)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    assert split == []  # the start takes the keys from their columns; no seed text is split
    assert_answers_as_the_files(index, root)
    assert split  # the answers decoded seeds from the persisted index, and answered as the files


def _rewrite_section(root: Path, section: str, change: Callable[[list[Any]], None]) -> Path:
    """Rewrite a section file whole (valid checksums) with each entry changed by `change`."""
    path = root / persisted.INDEX_DIR_NAME / indexfile.section_file_name(section)
    decoded = indexfile.decode_section(path.read_bytes(), str(root), section)
    assert decoded is not None
    entries, record = decoded
    for entry in entries.values():
        change(entry)
    rows = sorted(entries.values(), key=lambda entry: entry[indexfile.NAME])
    path.write_bytes(indexfile.encode_section(str(root), section, rows, record))
    return path


def test_a_seed_text_that_is_not_a_seed_is_never_answered_from(tmp_path: Path) -> None:
    root = tmp_path / "capabilities"
    write_store(root)

    def unseeded(entry: list[Any]) -> None:
        if entry[indexfile.PROBLEM] is None:
            entry[indexfile.SEED] = b'{"kind":"cli"}'

    path = _rewrite_section(root, "voice", unseeded)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    assert_answers_as_the_files(index, root)  # the files are read for the seeds the section cannot give
    index.refresh()
    assert_answers_as_the_files(index, root)
    assert path.is_file()


def test_a_damaged_seed_block_makes_the_start_read_the_section_files(tmp_path: Path) -> None:
    root = tmp_path / "capabilities"
    write_store(root)
    path = root / persisted.INDEX_DIR_NAME / indexfile.section_file_name("voice")
    data = path.read_bytes()
    # One byte of the last seed text changed, the length kept: only the seeds' checksum tells.
    position = data.rindex(b'"voice"') + 1
    path.write_bytes(data[:position] + b"V" + data[position + 1 :])
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    assert index.last_refresh is not None
    # The voice section's two files are read, and the broken file (a problem) as at every start.
    assert (index.last_refresh.files, index.last_refresh.read) == (5, 3)
    assert_answers_as_the_files(index, root)
    index.refresh()  # the sweep saves the section again from the files
    section = indexfile.open_section(path.read_bytes(), str(root), "voice")
    assert section is not None
    assert section.seeds_intact()
    assert_answers_as_the_files(index, root)


def test_lookups_after_the_start_and_after_writes_before_the_first_lookup_answer_as_the_files(
    tmp_path: Path,
) -> None:
    root = tmp_path / "capabilities"
    write_store(root)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    # The start leaves the lookup postings (by id, by file name) to the first lookup or the sweep.
    assert index._paths_by_id is None
    assert index._paths_by_stem is None

    # Writes the index is told of before any lookup: one more file holding an id already held,
    # a file named after another id than it holds, and a removal.
    added = root / "voice" / "espeak.yml"
    added.write_text(seed_text("espeak", "voice"))
    misnamed = root / "audio" / "speaker.yml"
    misnamed.write_text(seed_text("x", "audio"))
    (root / "voice" / "piper.yml").unlink()
    index.refresh_paths([str(added), str(misnamed), str(root / "voice" / "piper.yml")])
    assert_answers_as_the_files(index, root, ids=("piper", "speaker"))

    swept = SeedIndex(SeedStore(root))
    assert swept.start_from_persisted()
    swept.refresh()
    assert swept._paths_by_id is not None  # the sweep builds them, so no answer waits for them
    assert_answers_as_the_files(swept, root, ids=("piper", "speaker"))


def test_a_listing_after_the_start_decodes_no_seed_and_follows_every_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "capabilities"
    write_store(root)
    decoded = count_decoded_seeds(monkeypatch)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    reference = SeedStore(root, persisted_index=False)
    for domain in [None, *DOMAINS]:
        assert index.listing(domain) == _listing_of(reference, domain)
    assert decoded == []  # every row came from the section's list rows
    # The rows stay out of the section's decoded columns: a listing keeps only its answer.
    section = next(entry.section for entry in index._entries.values() if entry.section is not None)
    assert indexfile.ROW not in section._columns

    # Each kind of change is in the next listing: an edit, a new file, a removal, a file that
    # stops being a seed.
    (root / "voice" / "say.yml").write_text(seed_text("say", "voice", "speech_to_text"))
    (root / "audio" / "festival.yml").write_text(seed_text("festival", "audio"))
    (root / "voice" / "piper.yml").unlink()
    (root / "audio" / "espeak.yml").write_text("id: espeak\nkind: [\n")
    index.refresh()
    for domain in [None, *DOMAINS]:
        assert index.listing(domain) == _listing_of(reference, domain)
    assert_answers_as_the_files(index, root, ids=("festival", "piper"))


def replace_column(root: Path, section: str, position: int, values: Any) -> None:
    """Put `values` as the section file's column at `position`, every checksum made to match:
    a file no check can tell from one the index wrote, holding what it never writes."""
    path = root / persisted.INDEX_DIR_NAME / indexfile.section_file_name(section)
    head, _newline, body = path.read_bytes().partition(b"\n")
    header = json.loads(head)
    lengths = header["blocks"][0::2]
    blocks, offset = [], 0
    for length in lengths:
        blocks.append(body[offset : offset + length])
        offset += length
    blocks[1 + indexfile.COLUMN_POSITIONS.index(position)] = json.dumps(values).encode()
    header["blocks"] = [number for block in blocks for number in (len(block), zlib.crc32(block))]
    path.write_bytes(json.dumps(header, separators=(",", ":")).encode() + b"\n" + b"".join(blocks))
    assert indexfile.open_section(path.read_bytes(), str(root), section) is not None


def test_list_rows_that_are_not_the_ones_the_index_writes_are_made_from_the_seeds(tmp_path: Path) -> None:
    root = tmp_path / "capabilities"
    write_store(root)
    # Rows of the wrong shape or types, one per entry: each such seed is decoded instead.
    replace_column(root, "voice", indexfile.ROW, [["cli", "not a list", "unverified", []], "row"])
    # A column that is not one value per entry: the whole section's rows come from its seeds.
    replace_column(root, "audio", indexfile.ROW, {"k": 1})
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    assert_answers_as_the_files(index, root)


def test_the_service_lists_a_store_started_from_the_persisted_index_as_the_files_in_any_page_size(
    home: Path, start_server: Callable[..., ServerThread]
) -> None:
    root = home / "capabilities"
    write_store(root)
    for number in range(30):
        (root / "audio" / f"extra{number:02}.yml").write_text(seed_text(f"extra{number:02}", "audio"))
    time.sleep(persisted.RACY_WINDOW_NS / 1e9 + 0.1)
    SeedStore(root).load(None)
    reference = SeedStore(root, persisted_index=False)
    server = start_server(refresh_interval=60.0)
    with SeedStoreClient(server.unix_target) as client:
        for domain in [None, "audio"]:
            expected_rows, expected_problems = _listing_of(reference, domain)
            for page_size in (1, 7, 10_000):
                listing = client.list_all_seeds(pb.ListSeedsRequest(domain=domain, page_size=page_size))
                assert [(seed.id, seed.path, seed.kind, seed.revision) for seed in listing.seeds] == [
                    (row.id, row.path, row.kind, row.revision) for row in expected_rows
                ]
                assert [(problem.path, problem.reason) for problem in listing.problems] == [
                    (problem.path, problem.reason) for problem in expected_problems
                ]


@pytest.mark.parametrize("forged", [False, True], ids=["as written", "rank inputs forged"])
def test_a_search_matching_many_seeds_scores_them_from_the_columns_as_the_files_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forged: bool
) -> None:
    """A search matching more seeds than the decoded cache holds scores those not decoded from
    their sections' rank inputs and `list` rows: the same answer, and no seed decoded for it."""
    import agentsidecar.seedstore_service.index as index_module

    monkeypatch.setattr(index_module, "_COLUMN_SCORING_MIN", 0)
    root = tmp_path / "capabilities"
    write_store(root)
    if forged:
        section = root / persisted.INDEX_DIR_NAME / indexfile.section_file_name("voice")
        count = json.loads(section.read_bytes().partition(b"\n")[0])["count"]
        replace_column(root, "voice", indexfile.RANK, [["high"]] * count)
    decoded = count_decoded_seeds(monkeypatch)
    index = SeedIndex(SeedStore(root))
    assert index.start_from_persisted()
    reference = SeedStore(root, persisted_index=False)
    for capability in SEARCHES:
        for domain in [None, *DOMAINS]:
            query = SearchQuery(capability, domain)
            outcome = SeedOperations(reference).search(query)
            assert index.search(query) == (outcome.result, outcome.problems), (capability, domain)
    # Forged rank inputs are never scored: the voice seeds are decoded instead.
    assert bool(decoded) == forged
    assert_answers_as_the_files(index, root)
