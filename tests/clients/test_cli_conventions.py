"""One shape for both CLIs (`seedstore`, `negotiator`) and the pair launcher, against real servers.

`--version` from the package metadata, exit codes in every help, help text on
every option, `--server` and `--json-style` before or after the subcommand, one
error shape (`error:` line, then the JSON error object), the wrong service
named as such, and a wrong flag answered with the subcommand's usage.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from agentsidecar import pair as agentsidecar_pair
from agentsidecar.negotiator_service import cli as negotiator_cli
from agentsidecar.seedstore_service import cli as seedstore_cli
from tests.clients.sidecars import ServerHandle

BIN = Path(sys.executable).parent


def run(main: Any, *argv: str) -> tuple[int, str, str]:
    """A CLI's main() in-process, as its console script calls it."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_request:
            code = exit_request.code if isinstance(exit_request.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def run_negotiator(*argv: str) -> tuple[int, str, str]:
    return run(negotiator_cli.main, *argv)


def run_seedstore(*argv: str) -> tuple[int, str, str]:
    return run(seedstore_cli.main, *argv)


@pytest.fixture(autouse=True)
def _no_server_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SEEDSTORE_SERVER", raising=False)
    monkeypatch.delenv("NEGOTIATOR_SERVER", raising=False)
    monkeypatch.setenv("SKILLSPEC_HOME", str(tmp_path / "local-home"))


# --- --version, help ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["seedstore", "--version"],
        ["seedstore", "-V"],
        ["negotiator", "--version"],
        ["agentsidecar-pair", "--version"],
    ],
)
def test_version_everywhere_from_the_package_metadata(argv: list[str]) -> None:
    result = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"{argv[0]} {version('agentsidecar')}\n",
        "",
    )


def _argparse_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _argparse_parsers(sub)
    return found


def _argparse_options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for sub in _argparse_parsers(parser):
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{sub.prog}: {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_and_argument_has_help() -> None:
    missing = _argparse_options_without_help(negotiator_cli.build_parser())
    missing += _argparse_options_without_help(seedstore_cli.build_parser())
    missing += _argparse_options_without_help(agentsidecar_pair.build_parser())
    for command in seedstore_cli.COMMANDS.values():
        missing += [f"seedstore {command.name}: --{o.long}" for o in command.options if not o.help.strip()]
        missing += [f"seedstore {command.name}: {p.name}" for p in command.positionals if not p.help.strip()]
    missing += [f"seedstore: --{o.long}" for o in seedstore_cli.GLOBAL_OPTIONS if not o.help.strip()]
    assert missing == []


def test_every_help_lists_the_exit_codes() -> None:
    helps = {"negotiator": run_negotiator("--help"), "seedstore": run_seedstore("--help")}
    for name in negotiator_cli.subcommand_parsers(negotiator_cli.build_parser()):
        helps[f"negotiator {name}"] = run_negotiator(name, "--help")
    for name in seedstore_cli.COMMANDS:
        helps[f"seedstore {name}"] = run_seedstore(name, "--help")
    for name, (code, out, _) in helps.items():
        assert code == 0, name
        assert "Exit codes: 0 success" in out.replace("\n", " "), name
    assert "3 refused" in helps["negotiator"][1]
    assert "-V, --version" in helps["seedstore"][1]


# --- --server and --json-style, before or after the subcommand --------------------------------


def test_server_goes_before_or_after_the_subcommand(
    seedstore: ServerHandle, negotiator: ServerHandle
) -> None:
    before = run_negotiator("--server", negotiator.unix, "adapters")
    after = run_negotiator("adapters", "--server", negotiator.unix)
    assert before[0] == 0
    assert before == after
    code, _, err = run_negotiator("--server", negotiator.unix, "adapters", "--server", negotiator.tcp)
    assert code == 2
    assert err.startswith("error: argument --server: given both before and after the command")

    before = run_seedstore("--server", seedstore.unix, "list")
    after = run_seedstore("list", "--server", seedstore.unix)
    assert before[0] == 0
    assert before == after
    assert seedstore.home is not None
    assert json.loads(before[1])["seed_store"] == str(seedstore.home / "capabilities")
    code, _, err = run_seedstore("--server", seedstore.unix, "list", "--server=" + seedstore.tcp)
    assert code == 2
    assert err.startswith("error: the argument '--server <ADDR>' cannot be used multiple times")


def test_json_style_pretty_by_default_compact_on_request(negotiator: ServerHandle, tmp_path: Path) -> None:
    code, pretty, _ = run_negotiator("--server", negotiator.unix, "adapters", "demo")
    assert code == 0
    assert pretty == json.dumps(json.loads(pretty), indent=2, ensure_ascii=False) + "\n"
    for argv in (
        ["--json-style", "compact", "--server", negotiator.unix, "adapters", "demo"],
        ["adapters", "demo", "--server", negotiator.unix, "--json-style=compact"],
    ):
        code, compact, _ = run_negotiator(*argv)
        assert code == 0
        assert compact == json.dumps(json.loads(pretty), ensure_ascii=False, separators=(",", ":")) + "\n"

    code, pretty, _ = run_seedstore("store")  # SkillSpec's bytes: serde_json's to_string_pretty
    assert (code, pretty) == (
        0,
        '{\n  "seed_store": "' + str(tmp_path / "local-home" / "capabilities") + '"\n}\n',
    )
    for argv in (["--json-style", "compact", "store"], ["store", "--json-style", "compact"]):
        assert run_seedstore(*argv) == (0, json.dumps(json.loads(pretty), separators=(",", ":")) + "\n", "")
    code, _, err = run_seedstore("--json-style", "loud", "store")
    assert code == 2
    assert err.startswith("error: invalid value 'loud' for '--json-style <STYLE>'")


# --- errors ------------------------------------------------------------------------------------


ERROR_KEYS = ["code", "reason", "message", "metadata", "field_violations", "precondition_violations"]


def _error(err: str) -> tuple[str, dict[str, Any]]:
    """The `error:` line and the JSON error object that follows it."""
    first, second, *rest = err.splitlines()
    assert rest == []
    assert first.startswith("error: ")
    error: dict[str, Any] = json.loads(second)["error"]
    assert error["message"] == first.removeprefix("error: ")
    return first, error


def test_one_error_shape_in_both_clis(seedstore: ServerHandle, negotiator: ServerHandle) -> None:
    code, out, err = run_negotiator("--server", negotiator.unix, "adapters", "nope")
    assert (code, out) == (1, "")
    _, n_error = _error(err)
    assert list(n_error) == ERROR_KEYS
    assert (n_error["code"], n_error["reason"]) == ("NOT_FOUND", "ADAPTER_NOT_FOUND")

    for argv in (["--server", seedstore.unix, "inspect", "nope"], ["inspect", "nope"]):  # service, local
        code, out, err = run_seedstore(*argv)
        assert (code, out) == (1, "")
        first, s_error = _error(err)
        assert first == 'error: unknown capability seed "nope"'  # SkillSpec's line
        assert list(s_error) == ERROR_KEYS
        assert (s_error["code"], s_error["reason"], s_error["metadata"]) == (
            "NOT_FOUND",
            "SEED_NOT_FOUND",
            {"seedId": "nope"},
        )

    # A refusal: the same shape, plus the adapter and its gaps; exit 3.
    code, out, err = run_negotiator(
        "--server", negotiator.unix, "invoke", "--agent", "shell-echo", "hi", "--model", "m"
    )
    assert (code, out) == (3, "")
    _, refusal = _error(err)
    assert list(refusal) == [*ERROR_KEYS, "adapter", "declaration_version", "gaps"]
    assert refusal["reason"] == "UNSUPPORTED_CAPABILITY"


def test_a_cli_pointed_at_the_other_sidecar_says_so(
    seedstore: ServerHandle, negotiator: ServerHandle
) -> None:
    for target in (seedstore.unix, seedstore.tcp):
        code, _, err = run_negotiator("--server", target, "adapters")
        first, error = _error(err)
        assert code == 1
        assert first == (
            f"error: {target} serves agentsidecar.seedstore.v1.SeedStoreService, not the negotiator "
            "(agentsidecar.negotiator.v1.NegotiatorService)"
        )
        assert error["code"] == "UNIMPLEMENTED"
    code, _, err = run_seedstore("--server", negotiator.unix, "list")
    first, error = _error(err)
    assert code == 1
    assert first == (
        f"error: {negotiator.unix} serves agentsidecar.negotiator.v1.NegotiatorService, not the seedstore "
        "(agentsidecar.seedstore.v1.SeedStoreService)"
    )
    assert "Method not found" not in err


def test_a_wrong_flag_prints_the_subcommands_usage() -> None:
    code, out, err = run_negotiator("adapters", "--bogus")
    assert (code, out) == (2, "")
    assert err.startswith("error: unrecognized arguments: --bogus\n\nusage: negotiator adapters ")
    code, out, err = run_negotiator("produce", "--adapter", "x", "--schema", "{}", "p", "--modle", "m")
    assert (code, out) == (2, "")
    assert err.startswith("error: unrecognized arguments: --modle m\n\nusage: negotiator produce ")
    code, _, err = run_negotiator("adapters", "--wat")  # no abbreviations, as in the seedstore CLI (clap)
    assert (code, err.partition("\n")[0]) == (2, "error: unrecognized arguments: --wat")
    code, _, err = run_negotiator("--bogus", "adapters")  # before the subcommand: the top-level usage
    assert code == 2
    assert "usage: negotiator [-h]" in err

    code, out, err = run_seedstore("list", "--bogus")
    assert (code, out) == (2, "")
    assert err.startswith("error: unexpected argument '--bogus' found")
    assert "Usage: seedstore list [OPTIONS]" in err
