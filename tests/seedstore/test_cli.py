"""The `seedstore` CLI in subprocesses: SkillSpec's JSON shapes, local and `--server` paths alike."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentsidecar.seedstore_service.patch import AddSpec
from agentsidecar.seedstore_service.render import SCAN_MESSAGE
from agentsidecar.seedstore_service.seedfile import parse_seed
from agentsidecar.seedstore_service.store import SeedStore

from .conftest import PYTHON, Cli, CliResult, ServerThread

EXAMPLE_YAML = """\
id: remote-voice-cli
domain: voice
kind: cli
command: voice-cli
provides:
- text_to_speech
rank:
  default_priority: 80
  tie_breakers:
    quality: high
evidence:
- source: cli_help
  command: voice-cli --help
"""
EXAMPLE_ADD = [
    "add", "remote-voice-cli", "--domain", "voice", "--kind", "cli", "--command", "voice-cli",
    "--provides", "text_to_speech", "--priority", "80", "--tie", "quality=high",
    "--evidence-command", "voice-cli --help",
]  # fmt: skip
FULL_ADD = [
    "add", "remote-voice-cli", "--domain", "voice", "--kind", "cli", "--command", "voice-cli",
    "--provides", "text_to_speech", "--provides", "voice_message", "--alias", "say it",
    "--preferred-for", "text_to_speech", "--avoid-for", "music", "--tie", "quality=high", "--tie", "a=b=c",
    "--auth-env", "VOICE_TOKEN", "--priority", "80", "--external-service", "--may-cost-money",
    "--evidence-command", "voice-cli --help", "--suggested-skill-id", "voice.provider",
]  # fmt: skip
MACOS_ADD = [
    "add", "macos-say", "--domain", "voice", "--kind", "cli", "--command", "voice-cli",
    "--provides", "text_to_speech", "--priority", "75",
]  # fmt: skip
TIMESTAMP = re.compile(r'"verified_at_unix": (\d+)')


def add_example(home: Path) -> Path:
    """The example seed `add` writes, written through the store API (cheaper than a CLI process)."""
    stored = SeedStore(home / "capabilities").add(
        AddSpec(
            id="remote-voice-cli",
            domain="voice",
            kind="cli",
            command="voice-cli",
            provides=("text_to_speech",),
            ties=("quality=high",),
            priority=80,
            evidence_commands=("voice-cli --help",),
        )
    )
    return Path(stored.path)


def ok(result: CliResult) -> Any:
    assert result.code == 0, result.stderr
    assert result.stderr == ""
    return result.json


ANSI_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
REVISION = re.compile(r'("revision": "|has revision |"actual":")[0-9a-f]{16}')


def without_timestamps(text: str, earliest: int, latest: int) -> str:
    """Blank what the clock decides: verified_at_unix (checked to fall within the run) and so revisions."""
    for match in TIMESTAMP.finditer(text):
        assert earliest <= int(match.group(1)) <= latest
    text = TIMESTAMP.sub('"verified_at_unix": "<now>"', text)
    return REVISION.sub(r"\1<revision>", text)


@pytest.mark.slow
def test_add_writes_the_skillspec_example_byte_for_byte(cli: Cli, home: Path) -> None:
    result = cli.run(*EXAMPLE_ADD)
    output = ok(result)
    path = home / "capabilities" / "voice" / "remote-voice-cli.yml"
    assert path.read_bytes() == EXAMPLE_YAML.encode()
    assert list(output) == ["seed_store", "id", "domain", "path", "status", "seed"]
    assert output["status"] == "written"
    assert output["path"] == str(path)
    assert output["seed"] == {
        "id": "remote-voice-cli",
        "domain": "voice",
        "kind": "cli",
        "command": "voice-cli",
        "provides": ["text_to_speech"],
        "rank": {"default_priority": 80, "tie_breakers": {"quality": "high"}},
        "evidence": [{"source": "cli_help", "command": "voice-cli --help"}],
    }
    # Pretty JSON with two-space indents, as serde_json prints it.
    assert result.stdout.startswith('{\n  "seed_store": ')


@pytest.mark.slow
def test_every_subcommand_prints_skillspec_shapes(cli: Cli, home: Path) -> None:
    store = str(home / "capabilities")
    remote_path = f"{store}/voice/remote-voice-cli.yml"
    macos_path = f"{store}/voice/macos-say.yml"
    started = int(time.time())
    results = cli.batch(
        ["store"],
        FULL_ADD,
        MACOS_ADD,
        ["verify", "remote-voice-cli", "--json"],
        ["verify", "macos-say", "--domain", "voice"],
        ["list"],
        ["search", "text_to_speech", "--domain", "voice", "--explain", "--json"],
        ["search", "text_to_speech", "--local-only"],
        ["search", "nothing"],
        ["search", "voice_generation", "--domain", "voice", "--broaden"],
        ["inspect", "remote-voice-cli", "--json"],
        ["verify", "remote-voice-cli", "macos-say"],
        ["verify", "--all", "--domain", "voice"],
        [
            "update",
            "remote-voice-cli",
            "--add-provides",
            "speech_synthesis",
            "--add-alias",
            "talk",
            "--priority",
            "35",
            "--add-tie",
            "speed=fast",
            "--remove-tie",
            "a",
            "--mark-unverified",
        ],
        ["prefer", "remote-voice-cli", "--for", "realistic_voice", "--priority", "90"],
        ["remove", "macos-say"],
        ["scan"],
        ["list", "--domain", "voice"],
    )
    finished = int(time.time())
    (
        store_out, add_out, _macos, verify_one, _verify_macos, list_out, search_out, local_out,
        empty_out, broad_out, inspect_out, verify_two, verify_all, update_out, prefer_out,
        remove_out, scan_out, list_after,
    ) = (ok(result) for result in results)  # fmt: skip

    assert store_out == {"seed_store": store}
    assert list(add_out["seed"]) == [
        "id", "domain", "kind", "command", "provides", "aliases",
        "rank", "evidence", "auth", "risk", "promotion",
    ]  # fmt: skip
    assert add_out["seed"]["rank"] == {
        "default_priority": 80,
        "preferred_for": ["text_to_speech"],
        "avoid_for": ["music"],
        "tie_breakers": {"a": "b=c", "quality": "high"},
    }
    assert add_out["seed"]["auth"] == {"env": ["VOICE_TOKEN"]}
    assert add_out["seed"]["risk"] == {"external_service": True, "may_cost_money": True}
    assert add_out["seed"]["promotion"] == {"suggested_skill_id": "voice.provider"}

    assert verify_one == {
        "seed_store": store,
        "id": "remote-voice-cli",
        "domain": "voice",
        "path": remote_path,
        "status": "verified",
        "outcomes": [
            {"check": "path_lookup:voice-cli", "ok": True, "message": "voice-cli found on PATH"},
            {
                "check": "evidence_command:voice-cli --help",
                "ok": True,
                "message": "evidence command exited successfully",
            },
        ],
    }

    assert list_out["seed_store"] == store
    assert list_out["domain"] is None
    assert [row["id"] for row in list_out["seeds"]] == ["macos-say", "remote-voice-cli"]
    remote_row = list_out["seeds"][1]
    assert list(remote_row) == [
        "id", "domain", "kind", "path", "provides", "verification_status", "risk", "revision",
    ]  # fmt: skip
    assert remote_row["provides"] == ["text_to_speech", "voice_message"]
    assert remote_row["verification_status"] == "verified"
    assert remote_row["risk"] == ["external_service", "may_cost_money"]
    assert remote_row["revision"] == inspect_out["revision"]

    assert search_out == {
        "domain": "voice",
        "capability": "text_to_speech",
        "seed_store": store,
        "selected": None,
        "selection_policy": "highest_score_after_constraints",
        "ask_policy": {"reason": "top_candidates_within_10_points"},
        "candidates": [
            {
                "id": "remote-voice-cli",
                "domain": "voice",
                "path": remote_path,
                "score": 73,
                "status": "candidate",
                "reasons": [
                    "direct provides match: text_to_speech",
                    "verified evidence",
                    "preferred_for text_to_speech",
                    "rank.default_priority 80 -> +8",
                    "external or paid risk requires gate",
                ],
                "risk": ["external_service", "may_cost_money"],
                "required_gates": [
                    "provider_cost_approval",
                    "external_service_approval",
                    "secret_use_approval",
                ],
            },
            {
                "id": "macos-say",
                "domain": "voice",
                "path": macos_path,
                "score": 72,
                "status": "candidate",
                "reasons": [
                    "direct provides match: text_to_speech",
                    "verified evidence",
                    "rank.default_priority 75 -> +7",
                ],
                "risk": [],
                "required_gates": [],
            },
        ],
    }
    assert local_out["selected"] == "macos-say"
    assert "ask_policy" not in local_out
    assert [(c["id"], c["score"]) for c in local_out["candidates"]] == [("macos-say", 92)]
    assert local_out["candidates"][0]["reasons"][-1] == "local-only constraint satisfied"
    assert empty_out == {
        "domain": None,
        "capability": "nothing",
        "seed_store": store,
        "selected": None,
        "selection_policy": "highest_score_after_constraints",
        "candidates": [],
    }

    broadening = broad_out["broadening"]
    assert broadening["first_search_empty"] is True
    assert broadening["attempts"][0] == {"capability": "voice_generation", "domain": "voice", "found": []}
    assert {
        "capability": "text_to_speech",
        "domain": "voice",
        "found": ["voice/remote-voice-cli", "voice/macos-say"],
    } in (broadening["attempts"])
    assert broadening["table_sources"] == ["builtin"]
    assert [(c["id"], c["matched_capability"], c["matched_domain"]) for c in broad_out["candidates"]] == [
        ("remote-voice-cli", "text_to_speech", "voice"),
        ("macos-say", "text_to_speech", "voice"),
    ]
    assert broad_out["capability"] == "voice_generation"

    assert list(inspect_out) == ["seed_store", "path", "revision", "seed"]
    verification = inspect_out["seed"]["verification"]
    assert verification["status"] == "verified"
    assert started <= verification["verified_at_unix"] <= finished
    assert [outcome["check"] for outcome in verification["outcomes"]] == [
        "path_lookup:voice-cli",
        "evidence_command:voice-cli --help",
    ]

    assert list(verify_two) == ["seed_store", "results"]
    assert [(r["id"], r["status"]) for r in verify_two["results"]] == [
        ("remote-voice-cli", "verified"),
        ("macos-say", "verified"),
    ]
    assert list(verify_two["results"][0]) == ["id", "domain", "path", "status", "outcomes"]
    assert [r["id"] for r in verify_all["results"]] == ["macos-say", "remote-voice-cli"]

    assert update_out["status"] == "updated"
    assert update_out["path"] == remote_path
    seed = update_out["seed"]
    assert seed["provides"] == ["text_to_speech", "voice_message", "speech_synthesis"]
    assert seed["aliases"] == ["say it", "talk"]
    assert seed["rank"]["default_priority"] == 35
    assert seed["rank"]["tie_breakers"] == {"quality": "high", "speed": "fast"}
    assert set(seed["verification"]) == {"status", "verified_at_unix"}  # outcomes cleared
    assert seed["verification"]["status"] == "unverified"
    assert started <= seed["verification"]["verified_at_unix"] <= finished

    assert prefer_out["status"] == "updated"
    assert prefer_out["seed"]["rank"]["preferred_for"] == ["text_to_speech", "realistic_voice"]
    assert prefer_out["seed"]["rank"]["default_priority"] == 90

    assert remove_out == {"seed_store": store, "id": "macos-say", "path": macos_path, "removed": True}
    assert not Path(macos_path).exists()
    assert scan_out == {"seed_store": store, "proposals": [], "message": SCAN_MESSAGE}
    assert list_after["domain"] == "voice"
    assert [row["id"] for row in list_after["seeds"]] == ["remote-voice-cli"]


PARITY_SCENARIO: list[list[str]] = [
    ["store"],
    FULL_ADD,
    MACOS_ADD,
    ["add", "twin", "--domain", "voice", "--kind", "cli", "--provides", "text_to_speech"],
    ["add", "twin", "--domain", "audio", "--kind", "cli", "--provides", "text_to_speech"],
    ["list"],
    ["verify", "macos-say"],
    ["search", "text_to_speech"],
    ["search", "speech", "--local-only", "--preferred-seed", "macos-say"],
    ["search", "voice_generation", "--broaden"],
    ["inspect", "macos-say", "--domain", "voice"],
    ["update", "macos-say", "--add-avoid-for", "music", "--external-service", "true"],
    ["prefer", "macos-say", "--for", "realistic_voice"],
    ["verify", "remote-voice-cli", "macos-say", "--timeout", "5", "--concurrency", "2"],
    ["remove", "twin", "--domain", "audio"],
    ["scan"],
    # errors, each exit 1 with SkillSpec's message
    ["inspect", "nope"],
    ["add", "twin", "--domain", "audio", "--kind", "cli", "--provides", "text_to_speech"],
    ["inspect", "twin"],
    ["add", "Bad", "--domain", "voice", "--kind", "cli", "--provides", "x"],
    ["search", "Text"],
    ["add", "x", "--domain", "voice", "--kind", "cli", "--provides", "x", "--priority", "101"],
    ["add", "x", "--domain", "voice", "--kind", "cli", "--provides", "x", "--tie", "nokey"],
    ["add", "x", "--domain", "voice", "--kind", "cli"],
    ["update", "macos-say", "--kind", "tool", "--expected-revision", "0000"],
    ["prefer", "macos-say", "--for", "../etc"],
    ["update", "macos-say", "--add-provides", "Nope"],
    # usage errors, exit 2
    ["add", "x", "--domain", "voice", "--kind", "cli", "--provides", "x", "--priority", "256"],
    ["update", "macos-say", "--mark-failed", "--mark-unverified"],
    ["verify"],
]
PARITY_ERRORS = {
    "inspect nope": 'error: unknown capability seed "nope"',
    "inspect twin": 'error: capability seed "twin" exists in multiple domains; pass --domain',
    "add Bad": 'error: invalid identifier "Bad" in capability id',
    "search Text": 'error: invalid identifier "Text" in capability',
    "priority 101": "error: priority must be between 0 and 100",
    "tie": 'error: tie breaker "nokey" must use key=value',
    "no provides": "error: spec is missing required field provides",
    "prefer": 'error: invalid identifier "../etc" in for',
    "add-provides": 'error: invalid identifier "Nope" in add-provides',
}


@pytest.mark.slow
def test_local_and_server_paths_print_identical_output(
    home: Path, make_cli: Callable[[ServerThread | None], Cli], start_server: Callable[..., ServerThread]
) -> None:
    started = int(time.time())
    local = make_cli(None).batch(*PARITY_SCENARIO)
    shutil.rmtree(home / "capabilities")
    remote = make_cli(start_server()).batch(*PARITY_SCENARIO)
    finished = int(time.time())

    assert len(local) == len(remote) == len(PARITY_SCENARIO)
    for command, mine, theirs in zip(PARITY_SCENARIO, local, remote, strict=True):
        assert mine.code == theirs.code, command
        assert without_timestamps(mine.stdout, started, finished) == without_timestamps(
            theirs.stdout, started, finished
        ), command
        assert without_timestamps(mine.stderr, started, finished) == without_timestamps(
            theirs.stderr, started, finished
        ), command

    codes = [result.code for result in local]
    assert codes == [0] * 16 + [1, 0] + [1] * 9 + [2] * 3
    # SkillSpec's `error:` line first, then the same error as one JSON line (the service's status).
    errors = [result.stderr.strip().partition("\n")[0] for result in local[16:27]]
    for result, line in zip(local[16:27], errors, strict=True):
        if line:
            error = json.loads(result.stderr.splitlines()[-1])["error"]
            assert error["message"] == line.removeprefix("error: ")
    assert errors[0] == PARITY_ERRORS["inspect nope"]
    assert errors[1] == ""  # the second twin is a plain overwrite of the audio one
    assert errors[2] == PARITY_ERRORS["inspect twin"]
    assert errors[3] == PARITY_ERRORS["add Bad"]
    assert errors[4] == PARITY_ERRORS["search Text"]
    assert errors[5] == PARITY_ERRORS["priority 101"]
    assert errors[6] == PARITY_ERRORS["tie"]
    assert errors[7] == PARITY_ERRORS["no provides"]
    assert errors[8].startswith('error: capability seed "macos-say" has revision ')
    assert errors[8].endswith("not the expected 0000; read it again and retry")
    assert errors[9] == PARITY_ERRORS["prefer"]
    assert errors[10] == PARITY_ERRORS["add-provides"]
    assert all(result.stdout == "" for index, result in enumerate(local) if index >= 16 and index != 17)
    assert "256 is not in 0..=255" in local[27].stderr
    assert "error: the argument '--mark-failed' cannot be used with '--mark-unverified'" in local[28].stderr


@pytest.mark.slow
def test_malformed_file_is_reported_and_left_alone(cli: Cli, home: Path) -> None:
    broken = home / "capabilities" / "voice" / "broken.yml"
    broken.parent.mkdir(parents=True)
    content = b"id: broken\ndomain: voice\nkind: cli\nflavour: spicy\nprovides:\n- text_to_speech\n"
    broken.write_bytes(content)
    cli.sync()

    first_add, listed, searched, inspected, updated, added = cli.batch(
        EXAMPLE_ADD,
        ["list"],
        ["search", "text_to_speech"],
        ["inspect", "broken"],
        ["update", "broken", "--kind", "tool"],
        ["add", "broken", "--domain", "voice", "--kind", "cli", "--provides", "x"],
    )
    assert ok(first_add)["status"] == "written"  # add loads nothing, so a broken neighbour is no obstacle
    assert listed.code == 0
    assert searched.code == 0
    problem = listed.json["problems"]
    assert len(problem) == 1
    assert problem[0]["path"] == str(broken)
    assert problem[0]["line"] == 4
    assert "flavour" in problem[0]["reason"]
    assert [row["id"] for row in listed.json["seeds"]] == ["remote-voice-cli"]
    warning = f"warning: {broken}:4: {problem[0]['reason']}\n"
    assert listed.stderr == warning
    assert searched.stderr == warning
    assert searched.json["selected"] == "remote-voice-cli"
    assert searched.json["problems"] == problem
    for refused in (inspected, updated, added):
        assert refused.code == 1
        assert refused.stderr.startswith(f"error: failed to parse YAML from {broken}: ")
    assert broken.read_bytes() == content


@pytest.mark.slow
def test_search_broadens_with_a_user_equivalents_file(
    home: Path, make_cli: Callable[[ServerThread | None], Cli], start_server: Callable[..., ServerThread]
) -> None:
    equivalents = home / "equivalents.yml"
    equivalents.write_text("groups:\n- name: clips\n  capabilities: [sound_clip, text_to_speech]\n")
    add_example(home)
    search = ["search", "sound_clip", "--broaden"]
    explicit = [*search, "--equivalents", str(equivalents)]
    mine, mine_explicit = make_cli(None).batch(search, explicit)
    theirs, refused = make_cli(start_server()).batch(search, explicit)
    assert mine.stdout == theirs.stdout
    assert mine_explicit.stdout == mine.stdout
    output = ok(mine)
    assert output["broadening"]["table_sources"] == ["builtin", str(equivalents)]
    assert output["selected"] == "remote-voice-cli"
    assert output["candidates"][0]["matched_capability"] == "text_to_speech"
    # An explicit file only works locally: the service reads its own.
    assert refused.code == 2
    assert "--equivalents cannot be used with --server" in refused.stderr


@pytest.mark.slow
def test_server_address_from_environment_over_tcp(
    cli_env: dict[str, str], server: ServerThread, home: Path
) -> None:
    add_example(home)
    server.sync()
    completed = subprocess.run(
        [PYTHON, "-m", "agentsidecar.seedstore_service.cli", "list"],
        env={**cli_env, "SEEDSTORE_SERVER": server.tcp_target, "SKILLSPEC_HOME": "/nonexistent"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    # The listing comes from the server's store, not this process's SKILLSPEC_HOME.
    assert [row["id"] for row in json.loads(completed.stdout)["seeds"]] == ["remote-voice-cli"]


@pytest.mark.slow
def test_unreachable_server_is_an_error(cli_env: dict[str, str], socket_dir: Path) -> None:
    completed = subprocess.run(
        [
            PYTHON,
            "-m",
            "agentsidecar.seedstore_service.cli",
            "--server",
            f"unix:{socket_dir}/none.sock",
            "store",
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 1
    assert completed.stderr.startswith(
        f"error: cannot reach the seedstore service at unix:{socket_dir}/none.sock"
    )


@pytest.mark.slow
def test_verify_shows_live_progress_on_a_terminal(cli: Cli, home: Path) -> None:
    add_example(home)
    cli.sync()
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [PYTHON, "-m", "agentsidecar.seedstore_service.cli", *cli.argv(["verify", "remote-voice-cli"])],
            env=cli.env,
            stdout=subprocess.PIPE,
            stderr=terminal,
            text=True,
        )
        os.close(terminal)
        stdout, _ = process.communicate(timeout=30)
        progress = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's other end has closed
                break
            if not chunk:
                break
            progress += chunk
    finally:
        os.close(controller)
    assert process.returncode == 0
    assert json.loads(stdout)["status"] == "verified"
    screen = ANSI_CONTROL.sub("", progress.decode())
    # The live display: seeds done of the total, the seed's checks done of its planned two,
    # the running check, the elapsed time; it is cleared at the end.
    assert re.search(r"seeds .*0/1", screen)
    assert re.search(r"voice/remote-voice-cli .*0/2 .*path_lookup:voice-cli", screen)
    assert re.search(r"voice/remote-voice-cli .*1/2 .*evidence_command", screen)
    assert re.search(r"voice/remote-voice-cli .*2/2", screen)
    assert re.search(r"seeds .*1/1", screen)
    assert re.search(r"\d+:\d\d:\d\d", screen)
    # What stays: one line per verdict.
    assert "ok     voice/remote-voice-cli: verified (2 of 2 checks passed)" in screen


@pytest.mark.slow
def test_verify_progress_json_streams_the_events_as_json_lines(cli: Cli, home: Path) -> None:
    add_example(home)
    cli.sync()
    result = cli.run("verify", "remote-voice-cli", "--progress", "json")
    assert result.code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    seed_store = str(home / "capabilities")
    events = [{key: value for key, value in line.items() if key != "seed_store"} for line in lines[:-1]]
    assert all(line["seed_store"] == seed_store for line in lines[:-1])
    started = {"id": "remote-voice-cli", "domain": "voice", "check": "path_lookup:voice-cli"}
    assert events[0] == {"check_started": started}
    finished = events[1]["check_finished"]
    assert finished["check"] == "path_lookup:voice-cli"
    assert finished["ok"] is True
    assert finished["duration"].endswith("s")
    assert events[2] == {
        "check_started": {
            "id": "remote-voice-cli",
            "domain": "voice",
            "check": "evidence_command:voice-cli --help",
            "index": 1,
        }
    }
    assert events[3]["check_finished"]["exit_code"] == 0
    verdict = events[4]["seed_verified"]
    assert (verdict["id"], verdict["status"], len(verdict["outcomes"])) == (
        "remote-voice-cli",
        "VERIFICATION_STATUS_VERIFIED",
        2,
    )
    assert len(events) == 5
    # The last line is the usual verify object, compact.
    assert lines[-1]["result"]["status"] == "verified"
    assert lines[-1]["result"]["seed_store"] == seed_store


_WORKER = """
import sys
from agentsidecar.seedstore_service.cli import main
prefix, server = sys.argv[1], sys.argv[2]
base = ["--server", server] if server else []
for n in range(25):
    code = main([*base, "update", "remote-voice-cli", "--add-provides", f"{prefix}_{n}"])
    if code != 0:
        sys.exit(code)
"""


@pytest.mark.slow
def test_concurrent_updates_through_both_front_ends_lose_nothing(
    cli_env: dict[str, str], server: ServerThread, make_cli: Callable[[ServerThread | None], Cli], home: Path
) -> None:
    path = add_example(home)
    server.sync()
    workers = [
        subprocess.Popen(
            [PYTHON, "-c", _WORKER, prefix, target],
            env=cli_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix, target in (
            ("local_a", ""),
            ("local_b", ""),
            ("remote_a", server.unix_target),
            ("remote_b", server.tcp_target),
        )
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=60)
        assert worker.returncode == 0, stderr
    provides = parse_seed(path.read_text(), str(path)).provides
    expected = [
        f"{prefix}_{n}" for prefix in ("local_a", "local_b", "remote_a", "remote_b") for n in range(25)
    ]
    assert provides[0] == "text_to_speech"
    assert sorted(provides[1:]) == sorted(expected)
    # Each writer's additions keep their own order: no update was lost or reordered.
    for prefix in ("local_a", "local_b", "remote_a", "remote_b"):
        assert [value for value in provides if value.startswith(prefix)] == [
            f"{prefix}_{n}" for n in range(25)
        ]
