"""The v1 protos stay wire- and source-compatible with what was published (`buf breaking`).

Clients in any language compile these files; a v1 package may gain fields,
messages and RPCs, but never lose, renumber or retype one. The baseline is
the repository's protos at BASELINE (the first published v1); `buf breaking`
with the FILE rules of protos/buf.yaml compares the
working tree against it. An intended break is a new version (`…v2`), not an
edit of v1.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import REPO

BASELINE = "e4c22051b44a5bec10e30f23ded6e838d99e9144"
BUF = Path(sys.executable).parent / "buf"


def _baseline_present() -> bool:
    probe = subprocess.run(
        ["git", "cat-file", "-e", f"{BASELINE}^{{commit}}"], cwd=REPO, capture_output=True, check=False
    )
    return probe.returncode == 0


def _breaking(protos: Path) -> subprocess.CompletedProcess[str]:
    if not BUF.exists():
        pytest.fail(f"buf is not installed next to {sys.executable} (PyPI buf-bin, in the test extras)")
    if not _baseline_present():
        pytest.skip(f"this clone has no commit {BASELINE[:12]} to compare with (a shallow clone)")
    against = f"{REPO / '.git'}#ref={BASELINE},subdir=protos"
    return subprocess.run(
        [str(BUF), "breaking", "--against", against],
        cwd=protos,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_v1_protos_are_compatible_with_the_published_baseline() -> None:
    result = _breaking(REPO / "protos")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_removed_field_is_caught(tmp_path: Path) -> None:
    protos = tmp_path / "protos"
    shutil.copytree(REPO / "protos", protos, ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    adapter = protos / "agentsidecar" / "adapter" / "v1" / "adapter.proto"
    text = adapter.read_text()
    removed = "  // This field is OPTIONAL.\n  optional string persona = 5;\n"
    assert removed in text
    adapter.write_text(text.replace(removed, ""))
    result = _breaking(protos)
    assert result.returncode != 0
    assert "persona" in result.stdout + result.stderr
