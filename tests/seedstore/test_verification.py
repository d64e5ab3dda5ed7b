"""The pure verification core: plans, PATH lookup decisions, messages, verdicts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentsidecar.seedstore_service.model import Evidence, Outcome, Seed, Verification, VerificationStatus
from agentsidecar.seedstore_service.verification import (
    EvidenceCommand,
    Exited,
    FileState,
    LookupResult,
    NoEvidence,
    PathLookup,
    SpawnFailed,
    TimedOut,
    UnrunnableEvidence,
    build_verification,
    evidence_outcome,
    format_seconds,
    lookup_on_path,
    path_lookup_outcome,
    plan_checks,
    verdict,
)


def seed(command: str | None = None, *evidence_commands: str | None) -> Seed:
    return Seed(
        id="tool",
        domain="dev",
        kind="cli",
        command=command,
        evidence=tuple(Evidence(source="test", command=c) for c in evidence_commands),
    )


# --- plans -------------------------------------------------------------------


def test_plan_is_path_lookup_then_evidence_in_file_order() -> None:
    checks = plan_checks(seed("git status --short", "git --version", None, "git help"))
    assert checks == (
        PathLookup("git"),
        EvidenceCommand("git --version", ("git", "--version")),
        EvidenceCommand("git help", ("git", "help")),
    )
    assert [c.name for c in checks] == [
        "path_lookup:git",
        "evidence_command:git --version",
        "evidence_command:git help",
    ]


def test_path_lookup_takes_the_first_whitespace_token_not_shell_words() -> None:
    # SkillSpec splits the lookup token on whitespace; quotes stay part of it.
    assert plan_checks(seed("'my tool' --x")) == (PathLookup("'my"),)
    assert plan_checks(seed("\tgit\n status")) == (PathLookup("git"),)


def test_blank_command_is_looked_up_as_itself() -> None:
    assert plan_checks(seed("   ")) == (PathLookup("   "),)


def test_seed_with_nothing_to_check_gets_the_no_evidence_check() -> None:
    checks = plan_checks(seed(None, None))
    assert checks == (NoEvidence(),)
    assert checks[0].name == "evidence"
    assert NoEvidence().outcome() == Outcome("evidence", False, "no verification evidence declared")


def test_evidence_argv_follows_posix_quoting() -> None:
    (check,) = plan_checks(seed(None, "printf '%s' 'a b'"))
    assert check == EvidenceCommand("printf '%s' 'a b'", ("printf", "%s", "a b"))


@pytest.mark.parametrize(
    ("raw", "argv"),
    [
        ("echo hi; touch /tmp/pwned", ("echo", "hi;", "touch", "/tmp/pwned")),
        ("echo $(touch /tmp/pwned2)", ("echo", "$(touch", "/tmp/pwned2)")),
        ("echo a && rm -rf x | cat > out", ("echo", "a", "&&", "rm", "-rf", "x", "|", "cat", ">", "out")),
        ('grep "a # b" # not a comment', ("grep", "a # b", "#", "not", "a", "comment")),
        (r"echo a\ b", ("echo", "a b")),
    ],
)
def test_shell_metacharacters_are_plain_argument_text(raw: str, argv: tuple[str, ...]) -> None:
    assert plan_checks(seed(None, raw)) == (EvidenceCommand(raw, argv),)


@pytest.mark.parametrize(
    ("raw", "error"),
    [("echo 'unclosed", "No closing quotation"), ("echo trailing\\", "No escaped character")],
)
def test_bad_quoting_fails_before_running(raw: str, error: str) -> None:
    (check,) = plan_checks(seed(None, raw))
    assert isinstance(check, UnrunnableEvidence)
    assert check.outcome() == Outcome(
        f"evidence_command:{raw}", False, f"evidence command is not valid shell quoting: {error}"
    )


@pytest.mark.parametrize("raw", ["", "   ", "\t\n"])
def test_empty_evidence_command_has_skillspec_check_name(raw: str) -> None:
    (check,) = plan_checks(seed(None, raw))
    assert isinstance(check, UnrunnableEvidence)
    assert check.outcome() == Outcome("evidence_command", False, "empty evidence command")


@pytest.mark.slow
@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=8), min_size=1))
def test_quoted_argv_round_trips(argv: list[str]) -> None:
    raw = shlex.join(argv)
    assert plan_checks(seed(None, raw)) == (EvidenceCommand(raw, tuple(argv)),)


# --- PATH lookup decisions -----------------------------------------------------


class FakeFilesystem:
    """A probe over a fixed table; records what was probed, in order."""

    def __init__(self, files: dict[str, FileState]) -> None:
        self.files = files
        self.probed: list[str] = []

    def __call__(self, candidate: str) -> FileState:
        self.probed.append(candidate)
        return self.files.get(candidate, FileState.MISSING)


CWD = Path("/srv/work")


def test_executable_on_path_is_found() -> None:
    fs = FakeFilesystem({"/opt/bin/tool": FileState.EXECUTABLE})
    assert lookup_on_path("tool", "/usr/bin:/opt/bin", CWD, fs) == LookupResult(
        FileState.EXECUTABLE, Path("/opt/bin/tool")
    )
    assert fs.probed == ["/usr/bin/tool", "/opt/bin/tool"]


def test_a_later_executable_beats_an_earlier_non_executable() -> None:
    fs = FakeFilesystem({"/a/tool": FileState.NOT_EXECUTABLE, "/b/tool": FileState.EXECUTABLE})
    assert lookup_on_path("tool", "/a:/b", CWD, fs) == LookupResult(FileState.EXECUTABLE, Path("/b/tool"))


def test_only_non_executable_copies_report_the_first() -> None:
    fs = FakeFilesystem({"/a/tool": FileState.NOT_EXECUTABLE, "/b/tool": FileState.NOT_EXECUTABLE})
    assert lookup_on_path("tool", "/a:/b", CWD, fs) == LookupResult(FileState.NOT_EXECUTABLE, Path("/a/tool"))


@pytest.mark.parametrize("path_env", [None, ""])
def test_unset_or_empty_path_finds_nothing(path_env: str | None) -> None:
    fs = FakeFilesystem({str(CWD / "tool"): FileState.EXECUTABLE})
    assert lookup_on_path("tool", path_env, CWD, fs) == LookupResult(FileState.MISSING)
    assert fs.probed == []


def test_empty_path_entries_do_not_mean_the_working_directory() -> None:
    fs = FakeFilesystem({str(CWD / "tool"): FileState.EXECUTABLE})
    assert lookup_on_path("tool", ":/usr/bin::", CWD, fs).state is FileState.MISSING
    assert fs.probed == ["/usr/bin/tool"]


def test_relative_path_entries_are_relative_to_cwd() -> None:
    fs = FakeFilesystem({"/srv/work/bin/tool": FileState.EXECUTABLE})
    assert lookup_on_path("tool", "bin", CWD, fs).state is FileState.EXECUTABLE


@pytest.mark.parametrize(
    ("program", "probed"),
    [
        ("./tool", "/srv/work/tool"),
        ("sub/tool", "/srv/work/sub/tool"),
        ("/usr/bin/tool", "/usr/bin/tool"),
    ],
)
def test_names_with_several_components_skip_path(program: str, probed: str) -> None:
    fs = FakeFilesystem({probed: FileState.EXECUTABLE})
    assert lookup_on_path(program, "/usr/bin:/bin", CWD, fs) == LookupResult(
        FileState.EXECUTABLE, Path(probed)
    )
    assert fs.probed == [probed]


@pytest.mark.parametrize("program", ["tool/", ".", "./"])
def test_names_with_one_component_go_through_path(program: str) -> None:
    fs = FakeFilesystem({})
    lookup_on_path(program, "/usr/bin", CWD, fs)
    assert len(fs.probed) == 1
    assert fs.probed[0].startswith("/usr/bin")


@pytest.mark.parametrize(
    ("state", "ok", "message"),
    [
        (FileState.EXECUTABLE, True, "tool found on PATH"),
        (FileState.NOT_EXECUTABLE, False, "tool found on PATH but is not executable"),
        (FileState.MISSING, False, "tool not found on PATH"),
    ],
)
def test_path_lookup_outcomes(state: FileState, ok: bool, message: str) -> None:
    assert path_lookup_outcome(PathLookup("tool"), LookupResult(state)) == Outcome(
        "path_lookup:tool", ok, message
    )


# --- evidence outcomes ---------------------------------------------------------

CHECK = EvidenceCommand("tool --version", ("tool", "--version"))


@pytest.mark.parametrize(
    ("end", "ok", "message"),
    [
        (Exited(0), True, "evidence command exited successfully"),
        (Exited(3), False, "evidence command exited with 3"),
        (Exited(255), False, "evidence command exited with 255"),
        (Exited(-9), False, "evidence command exited with -1"),
        (Exited(-15), False, "evidence command exited with -1"),
        (SpawnFailed(2, "No such file or directory"), False, "No such file or directory (os error 2)"),
        (SpawnFailed(13, "Permission denied"), False, "Permission denied (os error 13)"),
        (TimedOut(10.0), False, "evidence command timed out after 10s"),
        (TimedOut(0.5), False, "evidence command timed out after 0.5s"),
    ],
)
def test_evidence_outcome_messages(end: Exited | SpawnFailed | TimedOut, ok: bool, message: str) -> None:
    assert evidence_outcome(CHECK, end) == Outcome("evidence_command:tool --version", ok, message)


def test_signal_death_is_recorded_as_minus_one() -> None:
    assert Exited(-9).exit_code == -1
    assert Exited(7).exit_code == 7


@pytest.mark.parametrize(
    ("seconds", "text"), [(10.0, "10"), (10, "10"), (0.5, "0.5"), (2.25, "2.25"), (120.0, "120")]
)
def test_format_seconds_drops_trailing_zeros(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


# --- verdicts ----------------------------------------------------------------

PASS = Outcome("path_lookup:tool", True, "tool found on PATH")
FAIL = Outcome("evidence_command:tool", False, "evidence command exited with 1")


@pytest.mark.parametrize(
    ("outcomes", "status"),
    [
        ([PASS], VerificationStatus.VERIFIED),
        ([FAIL, PASS], VerificationStatus.VERIFIED),
        ([FAIL], VerificationStatus.FAILED),
        ([NoEvidence().outcome()], VerificationStatus.FAILED),
        ([], VerificationStatus.FAILED),
    ],
)
def test_any_passing_outcome_verifies(outcomes: list[Outcome], status: VerificationStatus) -> None:
    assert verdict(outcomes) is status


def test_build_verification_keeps_outcomes_in_order() -> None:
    assert build_verification(iter([FAIL, PASS]), 1_700_000_000) == Verification(
        status=VerificationStatus.VERIFIED, verified_at_unix=1_700_000_000, outcomes=(FAIL, PASS)
    )
