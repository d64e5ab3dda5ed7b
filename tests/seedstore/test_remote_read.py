"""`seedstore --server` read commands answered by remote_read.py print what cli.py prints, or nothing.

Every comparison runs the same command line through `remote_read.answer` and through
`cli.main`, against one real seedstore service (its own loop in a thread, on a Unix socket and
on loopback TCP), and compares stdout, stderr and the exit code.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
from agentsidecar.seedstore_service import cli, remote_convert, remote_read
from agentsidecar.seedstore_service.errors import InvalidArgument
from agentsidecar.seedstore_service.location import SERVER_ENV, TOKEN_FILE_ENV
from agentsidecar.seedstore_service.model import VerificationStatus
from agentsidecar.seedstore_service.patch import AddSpec
from agentsidecar.seedstore_service.store import SeedStore
from agentsidecar.sidecar_runtime.auth import EnvToken
from agentsidecar.sidecar_runtime.server import ServerOptions

from .conftest import ServerThread
from .test_server_path_imports import loaded, run_listing_modules

Outcome = tuple[int, str, str]


def full(argv: Sequence[str], env: dict[str, str]) -> Outcome:
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for key in (SERVER_ENV, TOKEN_FILE_ENV):
            patch.delenv(key, raising=False)
        for key, value in env.items():
            patch.setenv(key, value)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = cli.main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


def quick(argv: Sequence[str], env: dict[str, str]) -> Outcome | None:
    stdout, stderr = io.StringIO(), io.StringIO()
    code = remote_read.answer(list(argv), {**os.environ, **env}, stdout, stderr)
    return None if code is None else (code, stdout.getvalue(), stderr.getvalue())


def populate(root: Path) -> None:
    store = SeedStore(root)
    specs = [
        AddSpec(id="say", domain="voice", kind="cli", command="say", provides=("text_to_speech",)),
        AddSpec(
            id="cloud-tts",
            domain="voice",
            kind="cli",
            command="cloud-tts",
            provides=("text_to_speech", "voice_message"),
            external_service=True,
            may_cost_money=True,
            auth_env=("TTS_KEY",),
            priority=70,
            preferred_for=("voice_message",),
        ),
        AddSpec(id="paint", domain="image", kind="cli", command="paint", provides=("image_generation",)),
        # The same id in two domains: inspect without --domain is ambiguous.
        AddSpec(id="twin", domain="voice", kind="cli", command="twin", provides=("text_to_speech",)),
        AddSpec(id="twin", domain="image", kind="cli", command="twin", provides=("image_generation",)),
    ]
    for spec in specs:
        store.add(spec)
    broken = root / "voice" / "broken.yml"
    broken.write_text("id: broken\ndomain: voice\nkind: cli\nflavour: spicy\n", encoding="utf-8")


@pytest.fixture
def served(home: Path, start_server: Callable[..., ServerThread]) -> ServerThread:
    populate(home / "capabilities")
    server = start_server()
    server.sync()
    return server


ANSWERED = [
    ["store"],
    ["list"],
    ["list", "--domain", "voice"],
    ["list", "--domain=image", "--json-style", "compact"],
    ["list", "--domain", "nowhere"],
    ["search", "text_to_speech"],
    ["search", "voice_message", "--domain", "voice", "--json"],
    ["search", "text_to_speech", "--local-only", "--explain", "--preferred-seed", "say"],
    ["search", "nothing_provides_this"],
    ["inspect", "cloud-tts"],
    ["inspect", "paint", "--domain", "image", "--json"],
    ["inspect", "nope"],
    ["inspect", "twin"],
]


@pytest.mark.parametrize("command", ANSWERED, ids=" ".join)
def test_answers_what_cli_prints(served: ServerThread, home: Path, command: list[str]) -> None:
    env = {"SKILLSPEC_HOME": str(home)}
    target = served.unix_target
    for argv in (
        ["--server", target, *command],
        [f"--server={target}", *command],
        [*command, "--server", target],
        [command[0], f"--server={target}", *command[1:]],
    ):
        answered = quick(argv, env)
        assert answered is not None, argv
        assert answered == full(argv, env), argv
    # The service named by the environment instead.
    environment = {**env, SERVER_ENV: served.tcp_target}
    assert quick(command, environment) == full(command, environment)


def test_errors_and_warnings_are_cli_py_s(served: ServerThread, home: Path) -> None:
    env = {"SKILLSPEC_HOME": str(home)}
    code, stdout, stderr = quick(["--server", served.unix_target, "inspect", "twin"], env) or (0, "", "")
    assert (code, stdout) == (1, "")
    assert stderr.startswith("error: ")
    assert '"reason":"SEED_AMBIGUOUS"' in stderr
    code, stdout, stderr = quick(["--server", served.unix_target, "list"], env) or (0, "", "")
    assert code == 0
    assert "warning: " in stderr
    assert "broken.yml" in stderr


def test_unreachable_service_is_cli_py_s_error(home: Path, socket_dir: Path) -> None:
    env = {"SKILLSPEC_HOME": str(home)}
    argv = ["--server", f"unix:{socket_dir / 'nobody.sock'}", "store"]
    answered = quick(argv, env)
    assert answered is not None
    assert answered == full(argv, env)
    assert answered[2].startswith(f"error: cannot reach the seedstore service at unix:{socket_dir}")


def test_token_file_is_sent_and_its_absence_reported(
    home: Path, tmp_path: Path, start_server: Callable[..., ServerThread]
) -> None:
    populate(home / "capabilities")
    options = ServerOptions(listen=(), tokens=EnvToken("SIDECAR_TOKEN", (b"s3cret",)))
    server = start_server(server_options=options)
    token = tmp_path / "token"
    token.write_text("s3cret\n", encoding="utf-8")
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n", encoding="utf-8")
    base = {"SKILLSPEC_HOME": str(home)}
    for target in (server.unix_target, server.tcp_target):
        argv = ["--server", target, "list", "--domain", "image"]
        for env in ({**base, TOKEN_FILE_ENV: str(token)}, {**base, TOKEN_FILE_ENV: str(wrong)}, base):
            answered = quick(argv, env)
            assert answered is not None
            assert answered == full(argv, env)
        assert quick(argv, {**base, TOKEN_FILE_ENV: str(token)}) is not None
        assert '"reason":"TOKEN_MISSING"' in (quick(argv, base) or (0, "", ""))[2]
    # An unreadable token file is cli.py's usage error.
    assert (
        quick(["--server", server.unix_target, "store"], {**base, TOKEN_FILE_ENV: str(tmp_path / "no")})
        is None
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["store"],  # local: no --server, no $SEEDSTORE_SERVER
        ["--server", "unix:/x.sock", "--server", "unix:/y.sock", "store"],
        ["--server", "unix:/x.sock", "store", "--server", "unix:/y.sock"],
        ["--server=", "store"],
        ["--server", "-x", "store"],
        ["--server"],
        ["store", "--server"],
        ["search", "cap", "--domain", "--server", "unix:/x.sock"],
        ["--server", "unix:/x.sock", "search", "cap", "--broaden"],
        ["--server", "unix:/x.sock", "search", "cap", "--equivalents", "eq.yml"],
        ["--server", "unix:/x.sock", "add", "x"],
        ["--server", "unix:/x.sock", "verify", "x"],
        ["--server", "unix:/x.sock", "list", "--domain", "Not An Id"],
        ["--json-style", "compact", "--server", "unix:/x.sock", "list"],
        ["--server", "unix:/x.sock", "list", "--help"],
    ],
    ids=" ".join,
)
def test_leaves_other_command_lines_to_cli_py(argv: list[str]) -> None:
    env = {key: value for key, value in os.environ.items() if key != SERVER_ENV}
    assert (
        remote_read.split_server(argv, env) is None
        or remote_read.answer(argv, env, io.StringIO(), io.StringIO()) is None
    )


def test_split_server_takes_the_option_out_where_cli_py_accepts_it() -> None:
    env: dict[str, str] = {}
    assert remote_read.split_server(["--server", "unix:a", "list"], env) == ("unix:a", ["list"])
    assert remote_read.split_server(["list", "--json-style", "compact", "--server=unix:a"], env) == (
        "unix:a",
        ["list", "--json-style", "compact"],
    )
    assert remote_read.split_server(["search", "cap", "--json", "--server", "h:1"], env) == (
        "h:1",
        ["search", "cap", "--json"],
    )
    assert remote_read.split_server(["list"], {SERVER_ENV: "unix:b"}) == ("unix:b", ["list"])
    assert remote_read.split_server(["list"], {SERVER_ENV: ""}) is None


def test_a_listing_asks_for_the_largest_page_the_service_gives() -> None:
    from agentsidecar.seedstore_service import paging

    assert remote_read.LIST_PAGE_SIZE == paging.MAX_PAGE_SIZE


def test_status_names_are_remote_convert_s() -> None:
    names = remote_read._Names()
    for value in [*pb.VerificationStatus.values(), 99]:
        try:
            expected: str | None = remote_convert.status_from_proto(
                pb.VerificationStatus.ValueType(value)
            ).value
        except InvalidArgument:
            expected = None
        try:
            assert names.status(value) == expected
        except remote_read._Unanswerable:
            assert expected is None
    assert {status.value for status in VerificationStatus} == {
        names.status(value) for value in pb.VerificationStatus.values() if value
    }


def test_risk_and_gate_names_are_remote_convert_s() -> None:
    from agentsidecar.common.v1 import common_pb2 as common

    names = remote_read._Names()
    risks = [*common.RiskFlag.values(), common.RiskFlag.ValueType(97)]
    gates = [*common.Gate.values(), common.Gate.ValueType(98)]
    assert names.risks(risks) == list(remote_convert._risks_from_proto(risks))
    assert names.gates(gates) == list(remote_convert._gates_from_proto(gates))
    assert names.risks(risks)[-1] == "unknown_risk_97"


@pytest.mark.slow
def test_each_read_imports_neither_cli_py_nor_the_error_tree(
    served: ServerThread, home: Path, tmp_path: Path
) -> None:
    (home / "capabilities" / "voice" / "broken.yml").unlink()  # its warning would be stderr's
    served.sync()
    env = {key: value for key, value in os.environ.items() if not key.startswith("SEEDSTORE_")}
    env["SKILLSPEC_HOME"] = str(home)
    seedstore = "agentsidecar.seedstore_service"
    unused = (
        f"{seedstore}.cli",
        f"{seedstore}.operations",
        f"{seedstore}.ranking",
        f"{seedstore}.store",
        f"{seedstore}.remote_frontend",
        "agentsidecar.clients.errors",
        "agentsidecar.sidecar_runtime.statusdecode",
    )
    for command in (["store"], ["list"], ["search", "text_to_speech", "--json"], ["inspect", "say"]):
        printed, modules = run_listing_modules(tmp_path, env, "--server", served.unix_target, *command)
        assert printed == full(["--server", served.unix_target, *command], {"SKILLSPEC_HOME": str(home)})[1]
        assert loaded(modules, unused) == [], command
        assert (f"{seedstore}.model" in modules) == (command[0] == "inspect"), command
