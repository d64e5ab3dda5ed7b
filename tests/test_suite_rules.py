"""The suite's own rules (tests/conftest.py): the slow directories, and the one Hypothesis profile."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from hypothesis import settings

TESTS = Path(__file__).resolve().parent
SLOW_DIRECTORIES = ("reliability", "peers", "smoke")


def test_every_collected_test_under_a_slow_directory_is_marked_slow(request: pytest.FixtureRequest) -> None:
    """Checked over whatever this session collected: the whole suite in a full run."""
    unmarked = [
        item.nodeid
        for item in request.session.items
        if any(item.path.is_relative_to(TESTS / name) for name in SLOW_DIRECTORIES)
        and item.get_closest_marker("slow") is None
    ]
    assert unmarked == []


def test_every_test_runs_under_the_suites_hypothesis_profile() -> None:
    assert settings.get_current_profile_name() == "agentsidecar"
    current = settings()
    assert (current.derandomize, current.database, current.deadline) == (True, None, None)


def _settings_calls(tree: ast.Module) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "settings")
            or (
                isinstance(node.func, ast.Attribute)
                and node.func.attr in ("register_profile", "load_profile")
            )
        )
    ]


def test_no_test_module_defines_hypothesis_settings_of_its_own() -> None:
    """Outside tests/conftest.py a test may set max_examples only, with a comment saying why."""
    problems = []
    for source in sorted(TESTS.rglob("*.py")):
        if "node_modules" in source.parts or source in (TESTS / "conftest.py", Path(__file__).resolve()):
            continue
        text = source.read_text()
        if "hypothesis" not in text:
            continue
        lines = text.splitlines()
        for call in _settings_calls(ast.parse(text)):
            where = f"{source.relative_to(TESTS)}:{call.lineno}"
            if isinstance(call.func, ast.Attribute):
                problems.append(f"{where}: {call.func.attr} outside tests/conftest.py")
                continue
            keywords = [keyword.arg for keyword in call.keywords]
            if keywords != ["max_examples"] or call.args:
                problems.append(f"{where}: settings({', '.join(map(str, keywords))}); only max_examples")
            nearby = lines[max(0, call.lineno - 3) : call.lineno]
            if not any("#" in line for line in nearby):
                problems.append(f"{where}: max_examples without a comment saying why")
    assert problems == []


def test_the_session_keeps_state_out_of_the_real_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    state_home = Path(os.environ["XDG_STATE_HOME"])
    assert state_home.is_relative_to(tmp_path_factory.getbasetemp())
