# ruff: noqa: E501 - the table below quotes clap's error lines whole
"""The `seedstore` CLI accepts and refuses command lines as SkillSpec's clap parser does.

Expected `error:` lines are clap_builder 4.6's texts (`error/format.rs`; the
parser rules in `parser/parser.rs`), SkillSpec's flags from its
`cli/args/capability.rs`. Most cases run `main()` in-process (fast); a few run
real subprocesses to show the same holds for the installed entry point.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentsidecar.seedstore_service.cli import main

from .conftest import PYTHON, Cli

ADD = ["add", "x", "--domain", "misc", "--kind", "cli", "--provides", "cap"]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKILLSPEC_HOME", str(tmp_path))
    monkeypatch.delenv("SEEDSTORE_SERVER", raising=False)
    return tmp_path / "capabilities"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def files(root: Path) -> list[str]:
    return (
        sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
        if root.exists()
        else []
    )


REFUSED = [
    # (argv, clap's first line)
    (["add", "x", "--dom", "misc", "--kind", "cli", "--provides", "cap"], "error: unexpected argument '--dom' found"),
    (["add", "x", "--dom=misc", "--kind", "cli", "--provides", "cap"], "error: unexpected argument '--dom' found"),
    ([*ADD, "--domain", "b"], "error: the argument '--domain <DOMAIN>' cannot be used multiple times"),
    ([*ADD, "--kind=flow"], "error: the argument '--kind <KIND>' cannot be used multiple times"),
    ([*ADD, "--external-service", "--external-service"], "error: the argument '--external-service' cannot be used multiple times"),
    (["add", "x", "--domain", "misc", "--kind", "-1", "--provides", "cap"], "error: unexpected argument '-1' found"),
    ([*ADD, "--alias", "- x"], "error: unexpected argument '- ' found"),
    ([*ADD, "--priority", "5_0"], "error: invalid value '5_0' for '--priority <PRIORITY>': invalid digit found in string"),
    ([*ADD, "--priority", " 5"], "error: invalid value ' 5' for '--priority <PRIORITY>': invalid digit found in string"),
    ([*ADD, "--priority", "٥"], "error: invalid value '٥' for '--priority <PRIORITY>': invalid digit found in string"),
    ([*ADD, "--priority=-1"], "error: invalid value '-1' for '--priority <PRIORITY>': -1 is not in 0..=255"),
    ([*ADD, "--priority", "256"], "error: invalid value '256' for '--priority <PRIORITY>': 256 is not in 0..=255"),
    ([*ADD, "--priority="], "error: invalid value '' for '--priority <PRIORITY>': cannot parse integer from empty string"),
    ([*ADD, "--priority", "99999999999999999999"], "error: invalid value '99999999999999999999' for '--priority <PRIORITY>': number too large to fit in target type"),
    ([*ADD, "--kind"], "error: the argument '--kind <KIND>' cannot be used multiple times"),
    (["add", "x", "--domain", "misc", "--provides", "cap", "--kind"], "error: a value is required for '--kind <KIND>' but none was supplied"),
    (["add", "x", "--domain", "misc", "--kind", "--provides", "cap"], "error: a value is required for '--kind <KIND>' but none was supplied"),
    (["add", "x", "--domain", "misc", "--kind", "cli", "--provides", "cap", "y"], "error: unexpected argument 'y' found"),
    ([*ADD, "--json"], "error: unexpected argument '--json' found"),
    ([*ADD, "--external-service=true"], "error: unexpected value 'true' for '--external-service' found; no more were expected"),
    (["add", "x", "--kind", "cli"], "error: the following required arguments were not provided:"),
    (["update", "x", "--mark-failed", "--mark-unverified"], "error: the argument '--mark-failed' cannot be used with '--mark-unverified'"),
    (["update", "x", "--external-service", "yes"], "error: invalid value 'yes' for '--external-service <EXTERNAL_SERVICE>'"),
    (["update", "x", "--external-service="], "error: a value is required for '--external-service <EXTERNAL_SERVICE>' but none was supplied"),
    (["update", "x", "--add-alias", "--"], "error: a value is required for '--add-alias <ADD_ALIAS>' but none was supplied"),
    (["prefer", "x", "--for", "a", "--for", "b"], "error: the argument '--for <FOR_CAPABILITY>' cannot be used multiple times"),
    (["search", "cap", "--loc"], "error: unexpected argument '--loc' found"),
    (["inspect", "x", "--domain", "a", "--domain", "a"], "error: the argument '--domain <DOMAIN>' cannot be used multiple times"),
    (["list", "--domain", "-x"], "error: unexpected argument '-x' found"),
    (["nope"], "error: unrecognized subcommand 'nope'"),
    (["--serv", "x", "list"], "error: unexpected argument '--serv' found"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "first_line"), REFUSED, ids=[" ".join(argv) for argv, _ in REFUSED])
def test_clap_refusals_exit_2_and_write_nothing(store: Path, argv: list[str], first_line: str) -> None:
    code, out, err = run(*argv)
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == first_line
    assert err.endswith("For more information, try '--help'.\n")
    assert files(store) == []


def test_an_abbreviation_suggests_the_full_flag(store: Path) -> None:
    err = run("add", "x", "--dom", "misc")[2]
    assert "\n\n  tip: a similar argument exists: '--domain'\n\n" in err
    assert "Usage: seedstore add [OPTIONS] --domain <DOMAIN> --kind <KIND> <ID>" in err


def test_a_hyphen_value_is_accepted_attached_or_after_double_dash(store: Path) -> None:
    code, _, err = run("add", "--domain=misc", "--kind=-1", "--alias=- x", "--provides", "cap", "--", "-x")
    assert (code, err) == (0, "")  # `--` ends the flags: `-x` is the ID
    assert (store / "misc" / "-x.yml").is_file()
    code, _, err = run("add", "x", "--domain=misc", "--kind=-1", "--alias=- x", "--provides", "cap")
    assert (code, err) == (0, "")
    text = (store / "misc" / "x.yml").read_text()
    assert "kind: '-1'\n" in text
    assert "- '- x'\n" in text


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--command=--"], "command: --\n"),
        (["--command=-"], "command: '-'\n"),
        (["--evidence-command="], "evidence:\n- source: cli_help\n  command: ''\n"),
        (["--adapter="], "adapter: ''\n"),
    ],
)
def test_literal_values_that_once_crashed_are_stored(store: Path, flags: list[str], expected: str) -> None:
    code, _, err = run(*ADD, *flags)
    assert (code, err) == (0, ""), err
    assert expected in (store / "misc" / "x.yml").read_text()
    code, _out, err = run("add", "y", "--domain", "misc", "--kind=--", "--provides", "cap")
    assert (code, err) == (0, ""), err
    assert "kind: --\n" in (store / "misc" / "y.yml").read_text()


def test_help_is_printed_with_exit_0(store: Path) -> None:
    code, out, _ = run("add", "--help")
    assert code == 0
    assert out.startswith("Create or overwrite a capability seed")
    assert "      --priority <PRIORITY>" in out
    code, out, _ = run("--help")
    assert code == 0
    assert "Exit codes:" in out
    assert "verify" in out


# --- hostile argv: never a traceback ----------------------------------------------------------

SUBCOMMANDS = ("store", "add", "update", "list", "search", "inspect", "verify", "prefer", "remove", "scan")
# Every subcommand's long flags (SkillSpec's and the additions).
_FLAGS = [
    f"--{name}"
    for name in (
        "adapter", "add-alias", "add-auth-env", "add-avoid-for", "add-evidence-command",
        "add-preferred-for", "add-provides", "add-tie", "alias", "all", "auth-env", "avoid-for",
        "broaden", "clear-adapter", "clear-command", "clear-priority", "clear-script",
        "clear-suggested-skill-id", "command", "concurrency", "domain", "equivalents",
        "evidence-command", "expected-revision", "explain", "external-service", "for", "json", "kind",
        "local-only", "mark-failed", "mark-unverified", "may-cost-money", "preferred-for",
        "preferred-seed", "priority", "progress", "provides", "remove-alias", "remove-auth-env",
        "remove-avoid-for", "remove-evidence-command", "remove-preferred-for", "remove-provides",
        "remove-tie", "script", "server", "strict", "suggested-skill-id", "tie", "timeout",
    )
]  # fmt: skip
_TOKENS = st.one_of(
    st.sampled_from([*_FLAGS, "--", "-", "-1", "- x", "--=", "-h", "--help=x", "=", "x", "a=b", "", "\x00"]),
    st.builds(
        lambda flag, value: f"{flag}={value}",
        st.sampled_from(_FLAGS),
        st.one_of(st.sampled_from(["--", "-", "", "-1", "- x", "=", "true"]), st.text(max_size=6)),
    ),
    st.text(max_size=8),
)


# A command line each subcommand accepts, so hostile tokens also reach the code past parsing.
_VALID = {
    "store": [],
    "add": ["x", "--domain", "misc", "--provides", "cap"],  # --kind left for the tokens to give
    "update": ["x"],
    "list": [],
    "search": ["cap"],
    "inspect": ["x"],
    "verify": ["x"],
    "prefer": ["x", "--for", "cap"],
    "remove": ["x"],
    "scan": [],
}


@pytest.mark.slow
# More than the profile's examples: the argv space (subcommand x tokens x --kind forms) is wide,
# and each example is an in-process parse.
@settings(max_examples=400)
@given(
    subcommand=st.sampled_from(SUBCOMMANDS),
    valid=st.booleans(),
    rest=st.lists(_TOKENS, max_size=6),
    kind=st.sampled_from(["--kind=--", "--kind=cli", "--kind", ""]),
)
def test_hostile_argv_never_crashes(
    store: Path, subcommand: str, valid: bool, rest: list[str], kind: str
) -> None:
    if subcommand == "verify":
        rest = [token for token in rest if token not in ("--all",)]  # never run whole domains' checks
    argv = [*_VALID[subcommand], *([kind] if kind and subcommand == "add" else []), *rest] if valid else rest
    code, _, err = run(subcommand, *argv)
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        [
            "add",
            "x",
            "--domain",
            "misc",
            "--kind=--",
            "--command=--",
            "--evidence-command=",
            "--provides",
            "c",
        ],
        ["add", "x", "--dom", "misc"],
        ["update", "x", "--add-alias", "\udcff"],
        ["verify", "--progress", "bogus"],
        ["search", "--", "--"],
    ],
)
def test_hostile_argv_in_a_real_process(tmp_path: Path, argv: list[str]) -> None:
    env = {**os.environ, "SKILLSPEC_HOME": str(tmp_path)}
    env.pop("SEEDSTORE_SERVER", None)
    result = subprocess.run(
        [PYTHON, "-m", "agentsidecar.seedstore_service.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode in (0, 1, 2)
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_arguments_that_are_not_utf8_are_refused_as_clap_does(tmp_path: Path) -> None:
    env = {**os.environ, "SKILLSPEC_HOME": str(tmp_path)}
    env.pop("SEEDSTORE_SERVER", None)
    argv = [
        PYTHON.encode(),
        b"-m",
        b"agentsidecar.seedstore_service.cli",
        *(arg.encode() for arg in ADD),
        b"--command",
        b"\xff",
    ]
    result = subprocess.run(argv, env=env, capture_output=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(b"error: invalid UTF-8 was detected in one or more arguments\n")
    assert not (tmp_path / "capabilities").exists()


# --- verify --strict --------------------------------------------------------------------------


@pytest.fixture
def two_seeds(store: Path, tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "good-tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    assert (
        run("add", "good", "--domain", "misc", "--kind", "cli", "--provides", "c", "--command", str(tool))[0]
        == 0
    )
    assert run("add", "bad", "--domain", "misc", "--kind", "cli", "--provides", "c")[0] == 0


def test_verify_strict_exits_1_unless_every_seed_verified(two_seeds: None) -> None:
    code, out, err = run("verify", "bad")
    assert (code, err) == (0, "")  # SkillSpec's default: a failed seed is not an error
    code, out, err = run("verify", "bad", "--strict")
    assert code == 1
    assert '"status": "failed"' in out
    first, _, rest = err.partition("\n")
    assert first == "error: not verified: misc/bad"
    error = json.loads(rest)["error"]
    assert (error["code"], error["reason"], error["metadata"]) == (
        "FAILED_PRECONDITION",
        "SEED_NOT_VERIFIED",
        {"seeds": "misc/bad"},
    )
    code, _, err = run("verify", "good", "--strict")
    assert (code, err) == (0, "")
    code, _, err = run("verify", "--all", "--domain", "misc", "--strict")
    assert (code, err.partition("\n")[0]) == (1, "error: not verified: misc/bad")


# --- seeds SkillSpec writes are read ----------------------------------------------------------

# serde_yaml's output for a seed added with `--alias '!!' --alias -- --alias 日本語 --alias 'say it'`
# (`!` opens a tag, so libyaml single-quotes it; `--` and the CJK letters are plain).
INERT_ALIASES_YAML = """\
id: jp
domain: voice
kind: cli
provides:
- text_to_speech
aliases:
- '!!'
- --
- 日本語
- say it
"""


@pytest.mark.slow
def test_a_seed_with_aliases_that_normalise_to_nothing_is_read(cli: Cli, home: Path) -> None:
    path = home / "capabilities" / "voice" / "jp.yml"
    path.parent.mkdir(parents=True)
    path.write_text(INERT_ALIASES_YAML)
    cli.sync()
    listing = cli.run("list")
    assert listing.code == 0
    assert [row["id"] for row in listing.json["seeds"]] == ["jp"]
    reasons = [problem["reason"] for problem in listing.json["problems"]]
    assert reasons == [
        'alias "!!" has no letters or digits, so it never matches at aliases[0] (line 7, column 3)',
        'alias "--" has no letters or digits, so it never matches at aliases[1] (line 8, column 3)',
        'alias "日本語" has no letters or digits, so it never matches at aliases[2] (line 9, column 3)',
    ]
    assert [problem["line"] for problem in listing.json["problems"]] == [7, 8, 9]
    assert f"warning: {path}:8: alias" in listing.stderr
    # Inert: a search it has nothing to do with finds nothing; its real alias still matches.
    assert cli.run("search", "music").json["candidates"] == []
    assert [c["id"] for c in cli.run("search", "say_it").json["candidates"]] == ["jp"]
    assert cli.run("inspect", "jp").json["seed"]["aliases"] == ["!!", "--", "日本語", "say it"]
    # An edit keeps the file's other bytes as SkillSpec wrote them.
    assert cli.run("update", "jp", "--kind", "flow").code == 0
    assert path.read_text() == INERT_ALIASES_YAML.replace("kind: cli", "kind: flow")


# --- byte-identical writes --------------------------------------------------------------------
# Each expectation follows serde_yaml 0.9.34 (`ser.rs`: a string with "\n" asks for a literal
# block, others for any style; `to_string` never emits the stream end) and the libyaml emitter
# it drives (unsafe-libyaml 0.2.11, `emitter.rs` / `macros.rs`):
# * IS_PRINTABLE counts U+10000..U+10FFFF printable, so inside double quotes (chosen because a
#   tab is not printable) the emoji is written raw, not as \U0001F389;
# * U+2028 / U+2029 are printable line breaks: plain is refused, single quotes are allowed;
#   after the break the writer indents to the scalar's indent (the mapping's plus 2);
# * `|+` (a value ending in two newlines) sets open_ended, which only the stream end, never
#   emitted by to_string, would close with `...`.

WRITES = [
    (["--kind", "tab\there 🎉"], 'kind: "tab\\there 🎉"\n'),
    (["--evidence-command", "echo\t🎉\U0001f600"], '  command: "echo\\t🎉\U0001f600"\n'),
    (["--kind", "line\u2028sep"], "kind: 'line\u2028  sep'\n"),
    (["--alias", "para\u2029graph"], "aliases:\n- 'para\u2029  graph'\n"),
    (["--evidence-command", "a\u2028b"], "evidence:\n- source: cli_help\n  command: 'a\u2028    b'\n"),
]


@pytest.mark.parametrize(("flags", "expected"), WRITES)
def test_unicode_values_are_written_as_serde_yaml_writes_them(
    store: Path, flags: list[str], expected: str
) -> None:
    code, _, err = (
        run(*ADD, *flags)
        if "--kind" not in flags
        else run("add", "x", "--domain", "misc", "--provides", "cap", *flags)
    )
    assert (code, err) == (0, "")
    data = (store / "misc" / "x.yml").read_bytes()
    assert expected.encode() in data
    # Read back as written, and a rewrite by an update keeps every byte.
    assert run("update", "x", "--priority", "5")[0] == 0
    assert run("update", "x", "--clear-priority")[0] == 0
    assert (store / "misc" / "x.yml").read_bytes() == data


def test_a_last_value_ending_in_two_newlines_gets_no_document_end_marker(store: Path) -> None:
    code, _, err = run(*ADD, "--suggested-skill-id", "x\n\n")
    assert (code, err) == (0, "")
    expected = (
        "id: x\ndomain: misc\nkind: cli\nprovides:\n- cap\npromotion:\n  suggested_skill_id: |+\n    x\n\n"
    )
    assert (store / "misc" / "x.yml").read_text() == expected
    assert run("inspect", "x")[1].count('"suggested_skill_id": "x\\n\\n"') == 1


@pytest.mark.slow
def test_update_reports_an_unknown_seed_before_its_flag_values(cli: Cli, home: Path) -> None:
    # SkillSpec's update (`capability.rs` `update`): id, domain, priority and ties are checked,
    # then the seed is loaded, then each add-/remove- value as the patch reaches it.
    (home / "capabilities" / "misc").mkdir(parents=True)
    cli.sync()

    # The `error:` line is SkillSpec's; the JSON error line after it is this CLI's addition.
    def first_line(*argv: str) -> str:
        return cli.run(*argv).stderr.partition("\n")[0]

    assert first_line("update", "nope", "--add-provides", "BAD") == 'error: unknown capability seed "nope"'
    assert first_line("update", "nope", "--priority", "101") == "error: priority must be between 0 and 100"
    assert first_line("update", "nope", "--add-tie", "x") == 'error: tie breaker "x" must use key=value'


def test_store_and_paths_are_printed_as_spelled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rust's PathBuf keeps `.` components and doubled separators; SkillSpec prints
    # `$SKILLSPEC_HOME` joined with `capabilities` as it is.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKILLSPEC_HOME", "a/./b//c")
    monkeypatch.delenv("SEEDSTORE_SERVER", raising=False)
    assert run("store")[1] == '{\n  "seed_store": "a/./b//c/capabilities"\n}\n'
    code, out, _ = run(*ADD)
    assert code == 0
    assert '"path": "a/./b//c/capabilities/misc/x.yml"' in out
    assert '"path": "a/./b//c/capabilities/misc/x.yml"' in run("list")[1]
    (tmp_path / "a/b/c/capabilities/misc/bad.yml").write_text("id: [\n")
    code, _, err = run("inspect", "bad")
    assert code == 1
    assert err.startswith("error: failed to parse YAML from a/./b//c/capabilities/misc/bad.yml: ")
    assert run("list")[2].startswith(
        "warning: a/./b//c/capabilities/misc/bad.yml:2: failed to parse YAML from a/./b//c/"
    )
