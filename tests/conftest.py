"""Rules for the whole suite: no state in the real home, the `slow` marker by directory, and
the one Hypothesis profile.

Every test session runs with XDG_STATE_HOME in its own temporary directory,
inherited by every server a test starts, so a negotiator's runtime
registrations and conversations (default: $XDG_STATE_HOME/agentsidecar) never
come from, or land in, the home of whoever runs the tests.
tests/negotiator/conftest.py gives each of its tests a directory of its own.

`pytest -m "not slow"` is the quick run (about a minute on a busy two-core
machine); the full run (`pytest`, scripts/test.sh, CI) runs everything.
A test is `slow` when it takes more than about half a second on its own on
such a machine (or its parameters do together): it starts several
processes, waits out a deadline, or generates many examples.
Everything under reliability/ (soak, fuzz, kill and size suites), peers/
(third-party servers) and smoke/ (the README's commands, whole-pair
launches) is slow as a directory; elsewhere a test carries
`@pytest.mark.slow` itself.

Hypothesis runs every property with the `agentsidecar` profile below; a
test sets `max_examples` itself only where its own docstring or comment
says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "agentsidecar",
    # The same examples on every run, so a failure in CI reproduces locally.
    derandomize=True,
    # No .hypothesis/ example database left in the tree.
    database=None,
    # Properties here drive real servers and processes on a shared machine:
    # how long an example takes is no property of the code.
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        # Servers are started once per test, not per example, on purpose.
        HealthCheck.function_scoped_fixture,
    ],
    max_examples=100,
)
settings.load_profile("agentsidecar")


@pytest.fixture(scope="session", autouse=True)
def session_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """XDG_STATE_HOME for the session, set before any module- or session-scoped server starts."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("state-home")
        patch.setenv("XDG_STATE_HOME", str(path))
        yield path


_SLOW_DIRECTORIES = ("reliability", "peers", "smoke")
_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow = [_TESTS / name for name in _SLOW_DIRECTORIES]
    for item in items:
        if any(item.path.is_relative_to(directory) for directory in slow):
            item.add_marker(pytest.mark.slow)
