"""The wheel as an agent process installs it: one `agentsidecar` package, typed, licensed.

Built from this checkout by pip (the build hook compiles the protos in pip's
isolated build environment), then read as a zip and imported from an unpacked
copy, away from the checkout.
"""

from __future__ import annotations

import email
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    [built] = out.glob("agentsidecar-*.whl")
    return built


def test_everything_installs_under_one_package_with_types_and_licence(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    dist_info = {top for top in tops if top.endswith(".dist-info")}
    assert tops - dist_info == {"agentsidecar"}
    assert "agentsidecar/py.typed" in names
    [info] = dist_info
    assert f"{info}/licenses/LICENSE" in names
    assert not [name for name in names if name.endswith((".js", ".ts", "package.json"))]
    for member in ("clients", "negotiator_service", "seedstore_service", "sidecar_runtime"):
        assert f"agentsidecar/{member}/__init__.py" in names
    assert "agentsidecar/pair.py" in names
    assert "agentsidecar/negotiator/v1/negotiator_pb2.py" in names


def test_runtime_dependencies_are_ranges_an_agent_can_share(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        message = email.message_from_bytes(archive.read(metadata))
    required = [r for r in message.get_all("Requires-Dist") or [] if "extra ==" not in r]
    pinned = [r for r in required if "==" in r]
    assert pinned == []
    grpcio = [r for r in required if r.split(">")[0].split("<")[0].strip() == "grpcio"]
    assert grpcio
    assert "<2" in grpcio[0]


def test_the_unpacked_wheel_imports_and_runs_without_the_checkout(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import agentsidecar.clients, agentsidecar.negotiator_service.cli, agentsidecar.pair;"
        "import agentsidecar.seedstore_service.cli as s;"
        "assert s.__file__.startswith(sys.argv[1]), s.__file__;"
        "assert agentsidecar.clients.__file__.startswith(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", probe, str(tmp_path)], check=True, cwd=tmp_path, timeout=60)
