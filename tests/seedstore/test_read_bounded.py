"""A seed file is read up to its end or one byte past the limit, whatever size fstat told."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentsidecar.seedstore_service.seedtext import MAX_SEED_FILE_BYTES, revision_of
from agentsidecar.seedstore_service.store import read_seed_file

from .test_persisted_index import seed_text

# A regular file whose size is told as 0 though it holds bytes: it reads like one that grew.
UNTOLD = Path("/proc/sys/kernel/ostype")


@pytest.mark.skipif(not UNTOLD.is_file() or os.stat(UNTOLD).st_size != 0, reason="needs a /proc file")
def test_a_file_holding_more_than_fstat_told_is_read_to_its_end(tmp_path: Path) -> None:
    link = tmp_path / "voice" / "ostype.yml"
    link.parent.mkdir()
    link.symlink_to(UNTOLD)
    parsed = read_seed_file(str(link), "voice")
    assert parsed.revision == revision_of(UNTOLD.read_bytes())
    assert parsed.problem is not None
    assert "expected a mapping at the top level" in parsed.problem.reason


def test_a_file_is_read_whole_up_to_the_limit_and_refused_past_it(tmp_path: Path) -> None:
    directory = tmp_path / "voice"
    directory.mkdir()
    text = seed_text("say", "voice")
    whole = directory / "say.yml"
    whole.write_text(text)
    parsed = read_seed_file(str(whole), "voice")
    assert parsed.revision == revision_of(text.encode())
    assert parsed.stored is not None
    assert parsed.stored.seed.id == "say"
    body = seed_text("full", "voice")
    at_limit = directory / "full.yml"
    at_limit.write_text(body + "#" * (MAX_SEED_FILE_BYTES - len(body) - 1) + "\n")  # a comment line
    assert os.stat(at_limit).st_size == MAX_SEED_FILE_BYTES
    parsed = read_seed_file(str(at_limit), "voice")
    assert parsed.stored is not None
    assert parsed.revision == revision_of(at_limit.read_bytes())
    past = directory / "past.yml"
    past.write_bytes(at_limit.read_bytes() + b"\n")
    parsed = read_seed_file(str(past), "voice")
    assert parsed.problem is not None
    assert f"more than the {MAX_SEED_FILE_BYTES} a seed file may hold" in parsed.problem.reason


# Another, holding more than the limit.
LARGE_UNTOLD = Path("/proc/kallsyms")


@pytest.mark.skipif(
    not LARGE_UNTOLD.is_file() or os.stat(LARGE_UNTOLD).st_size != 0, reason="needs a large /proc file"
)
def test_a_file_holding_more_than_fstat_told_and_the_limit_is_refused(tmp_path: Path) -> None:
    if len(LARGE_UNTOLD.read_bytes()) <= MAX_SEED_FILE_BYTES:
        pytest.skip("the /proc file is not larger than the limit here")
    link = tmp_path / "voice" / "symbols.yml"
    link.parent.mkdir()
    link.symlink_to(LARGE_UNTOLD)
    parsed = read_seed_file(str(link), "voice")
    assert parsed.problem is not None
    assert parsed.problem.reason == (
        f"failed to read {link}: the file holds {MAX_SEED_FILE_BYTES + 1} bytes, "
        f"more than the {MAX_SEED_FILE_BYTES} a seed file may hold"
    )
