"""One licence: the LICENSE file, the Python package's metadata and the Node client's package.json agree."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_one_licence_everywhere() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    node = json.loads((REPO / "clients" / "node" / "package.json").read_text(encoding="utf-8"))
    assert pyproject["license"] == node["license"] == "Apache-2.0"
    assert pyproject["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
