"""`seedstore`: the `skillspec capability` commands, on the local store or through the service.

Subcommands, positional arguments, flags and JSON output are SkillSpec's
(`store add update list search inspect verify prefer remove scan`). Additions:

* `--server ADDR` (or `$SEEDSTORE_SERVER`): go through a running seedstore
  service (`unix:PATH` or `HOST:PORT`; `unix:run/seedstore.sock` is the socket
  `agentsidecar-pair` serves) instead of the local files, which stay the
  default, as in SkillSpec. Both paths print identical JSON: responses are
  converted back to the same core values and rendered by the same functions.
  `--server` goes before the subcommand or after it, once: before it, the
  top-level parser takes it (full name only, the value attached with `=` or
  the next token when that does not start with `-`); after it, it is one of
  the subcommand's own options, parsed by clap's rules like every other. A
  server that is not a seedstore is named as such.
* `--json-style pretty|compact` (before or after the subcommand, as
  `--server`): pretty, the default, is SkillSpec's output byte for byte;
  compact prints the result on one line. `-V`/`--version` prints the version.
* `search --broaden [--equivalents FILE]`: when the first search is empty,
  search equivalent capabilities and domains, and say what was tried
  (`broadening` key). Through `--server` the service's own table is used.
* `update --expected-revision REV`: refuse the update unless the file still
  has the revision you read (`revision` in list and inspect output).
* `verify ID... [--all] [--timeout SECONDS] [--concurrency N]`: one id prints
  SkillSpec's verify object; several ids, or `--all --domain D`, print
  `{"seed_store": ..., "results": [<verify object without seed_store>, ...]}`
  in the order the ids were given (by domain, then id, for `--all`). On a
  terminal, progress lines go to stderr while checks run.
* `serve --listen ADDR [--listen ADDR] ...`: run the service.
* Files that could not be used are listed under `problems` in the JSON and
  as `warning: <path>:<line>: <reason>` lines on stderr.

Exit codes: 0 success (also when verify records a failed seed, unless
`--strict`), 1 for an error, 2 for a usage error. An error prints
`error: <message>` on stderr (SkillSpec's line), then the error as one JSON
line, the negotiator CLI's shape (agentsidecar.sidecar_runtime.cli_common); the local and
the service paths print the same object. A usage error prints clap's text.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeAlias, cast

from agentsidecar.seedstore_service import cli_output, render
from agentsidecar.seedstore_service.cliparse import (
    BOOL_VALUES,
    Command,
    HelpRequested,
    Opt,
    Positional,
    UsageError,
    parse_bool,
    parse_command,
    parse_u8,
    similar,
)
from agentsidecar.seedstore_service.errors import SeedStoreError
from agentsidecar.seedstore_service.location import SERVER_ENV, TOKEN_FILE_ENV, rust_join
from agentsidecar.seedstore_service.model import Problem, VerificationStatus
from agentsidecar.seedstore_service.operations import (
    DEFAULT_CHECK_TIMEOUT_SECONDS,
    DEFAULT_VERIFY_CONCURRENCY,
    SearchOutcome,
    SeedListing,
    SeedOperations,
    SeedRemoved,
    SeedVerified,
    SeedView,
    VerifyRequest,
    default_equivalents_file,
    load_equivalents,
)
from agentsidecar.seedstore_service.ranking import SearchQuery
from agentsidecar.seedstore_service.seedtext import seed_to_json
from agentsidecar.seedstore_service.store import SeedStore, resolve_store_root, spelled_store_root
from agentsidecar.sidecar_runtime import cli_common

# Agents run the local read commands one process per call: grpc, the generated code,
# the client, the server and asyncio are imported only by the commands that use them
# (`--server`, `serve`, `verify`).
if TYPE_CHECKING:
    import argparse

    from agentsidecar.clients.errors import SidecarError
    from agentsidecar.seedstore_service.operations import VerifyProgress
    from agentsidecar.seedstore_service.patch import AddSpec, UpdatePatch
    from agentsidecar.seedstore_service.remote_frontend import RemoteFrontend


ProgressListener: TypeAlias = Callable[[str, "VerifyProgress"], None]
"""Called with the seed store and each verify event."""


# --- the two front ends ----------------------------------------------------------


class Frontend(Protocol):
    # What its calls raise for a failure to report (as opposed to a bug).
    errors: tuple[type[Exception], ...]

    def store(self) -> str: ...
    def add(self, spec: AddSpec) -> SeedView: ...
    def update(
        self, seed_id: str, domain: str | None, patch: UpdatePatch, expected_revision: str | None
    ) -> SeedView: ...
    def list_seeds(self, domain: str | None) -> SeedListing: ...
    def search(self, query: SearchQuery, broaden: bool) -> SearchOutcome: ...
    def inspect(self, seed_id: str, domain: str | None) -> SeedView: ...
    def prefer(
        self, seed_id: str, domain: str | None, for_capability: str, priority: int | None
    ) -> SeedView: ...
    def remove(self, seed_id: str, domain: str | None) -> SeedRemoved: ...
    def scan(self) -> str: ...
    def verify(self, request: VerifyRequest, limits_given: bool, listener: ProgressListener) -> str: ...
    def planned_checks(self, request: VerifyRequest) -> dict[tuple[str, str], int]: ...


class LocalFrontend:
    """The files themselves, as SkillSpec reads them, through the persisted index (persisted.py)."""

    errors: tuple[type[Exception], ...] = (SeedStoreError,)

    def __init__(self, env: Mapping[str, str], equivalents_file: str | None) -> None:
        self._env = env
        self._equivalents_file = equivalents_file
        self._operations: SeedOperations | None = None

    def _ops(self, *, with_equivalents: bool = False) -> SeedOperations:
        if self._operations is None or with_equivalents:
            equivalents = None
            if with_equivalents:
                explicit = self._equivalents_file
                path = Path(explicit) if explicit is not None else default_equivalents_file(self._env)
                equivalents = load_equivalents(path, required=explicit is not None)
            self._operations = SeedOperations(
                SeedStore(resolve_store_root(self._env)),
                equivalents=equivalents,
                runner_path=self._env.get("PATH") or None,
            )
        return self._operations

    def store(self) -> str:
        return self._ops().seed_store

    def add(self, spec: AddSpec) -> SeedView:
        return self._ops().add(spec)

    def update(
        self, seed_id: str, domain: str | None, patch: UpdatePatch, expected_revision: str | None
    ) -> SeedView:
        return self._ops().update(seed_id, domain, patch, expected_revision=expected_revision)

    def list_seeds(self, domain: str | None) -> SeedListing:
        operations = self._ops()
        entries, problems = operations.store.listing(domain)
        return SeedListing(operations.seed_store, domain, entries, problems)

    def search(self, query: SearchQuery, broaden: bool) -> SearchOutcome:
        return self._ops(with_equivalents=broaden).search(query, broaden_empty=broaden)

    def inspect(self, seed_id: str, domain: str | None) -> SeedView:
        return self._ops().inspect(seed_id, domain)

    def prefer(self, seed_id: str, domain: str | None, for_capability: str, priority: int | None) -> SeedView:
        return self._ops().prefer(seed_id, domain, for_capability, priority)

    def remove(self, seed_id: str, domain: str | None) -> SeedRemoved:
        return self._ops().remove(seed_id, domain)

    def scan(self) -> str:
        return self._ops().scan()

    def verify(self, request: VerifyRequest, limits_given: bool, listener: ProgressListener) -> str:
        import asyncio

        operations = self._ops()

        async def run() -> None:
            async with contextlib.aclosing(operations.verify(request)) as events:
                async for event in events:
                    listener(operations.seed_store, event)

        asyncio.run(run())
        return operations.seed_store

    def planned_checks(self, request: VerifyRequest) -> dict[tuple[str, str], int]:
        targets = self._ops().verify_targets(request)
        from agentsidecar.seedstore_service.verification import plan_checks

        return {(stored.seed.domain, stored.seed.id): len(plan_checks(stored.seed)) for stored in targets}


# --- argument parsing ------------------------------------------------------------

PROG = "seedstore"
PROGRESS_MODES = ("auto", "json", "none")
SERVER_HELP = (
    f"Use the seedstore service at ADDR (unix:PATH or HOST:PORT, e.g. unix:run/seedstore.sock, "
    f"the run command's); default ${SERVER_ENV}, else the local store"
)
EXIT_CODES_HELP = cli_common.exit_codes_help(
    refused=False, success_note=" (also when verify records a failed seed, unless --strict)"
)
JSON_STYLE_HELP = "Print the result pretty (SkillSpec's output; the default) or compact (one line)"


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if not value > 0:
        raise ValueError("must be more than 0")
    return value


def _positive_int(text: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ValueError("not a whole number")
    value = int(text, 10)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _server_option() -> Opt:
    return Opt("server", SERVER_HELP, "ADDR")


def _json_style_option() -> Opt:
    return Opt("json-style", JSON_STYLE_HELP, "STYLE", choices=cli_common.JSON_STYLES)


def _with_common(command: Command) -> Command:
    """`command` taking `--json-style` too (as each takes `--server`), its help ending in the exit codes."""
    options = (*command.options, _json_style_option())
    after_help = command.after_help or EXIT_CODES_HELP
    return Command(command.name, command.about, options, command.positionals, after_help)


def _many(long: str, value_name: str, help_text: str) -> Opt:
    return Opt(long, help_text + " Repeatable.", value_name, multiple=True)


def _domain_lookup() -> Opt:
    return Opt("domain", "Domain of the seed, when its id is in several domains.", "DOMAIN")


_JSON = Opt("json", "Accepted for SkillSpec; the output is always JSON.")
_ID = Positional("ID", "id", "Seed id.")
_PRIORITY_HELP = "Default priority, 0 to 100; adds priority/10 (rounded down) to the score."

COMMANDS: dict[str, Command] = {
    command.name: _with_common(command)
    for command in (
        Command("store", "Print the seed store directory.", (_server_option(),)),
        Command(
            "add",
            "Create or overwrite a capability seed (an earlier verification is dropped).",
            (
                Opt("domain", "Domain directory of the seed, such as voice.", "DOMAIN", required=True),
                Opt("kind", "Seed kind: cli, adapter, script, flow, ...", "KIND", required=True),
                Opt("command", "Command name or path the seed runs.", "COMMAND"),
                Opt("adapter", "Adapter id or name.", "ADAPTER"),
                Opt("script", "Local script path.", "SCRIPT"),
                _many("provides", "PROVIDES", "Capability the seed provides (at least one)."),
                _many("alias", "ALIAS", "Free-text phrase the seed also answers to."),
                Opt("priority", _PRIORITY_HELP, "PRIORITY", parser=parse_u8),
                _many("preferred-for", "PREFERRED_FOR", "Capability the seed is preferred for."),
                _many("avoid-for", "AVOID_FOR", "Capability the seed should be avoided for."),
                _many("tie", "TIES", "Tie-breaker metadata as KEY=VALUE."),
                _many("auth-env", "AUTH_ENV", "Environment variable holding a secret the seed uses."),
                Opt("external-service", "The seed calls an external service."),
                Opt("may-cost-money", "The seed may spend money or provider credits."),
                _many(
                    "evidence-command",
                    "EVIDENCE_COMMAND",
                    'Command whose success is evidence, e.g. "tool --help".',
                ),
                Opt(
                    "suggested-skill-id",
                    "Skill id to suggest once the seed has worked.",
                    "SUGGESTED_SKILL_ID",
                ),
                _server_option(),
            ),
            (Positional("ID", "id", "Seed id, such as preferred-voice-cli."),),
        ),
        Command(
            "update",
            "Patch an existing capability seed; fields not named keep their values.",
            (
                Opt("domain", "Domain of the seed (narrows the lookup; cannot move a seed).", "DOMAIN"),
                Opt("kind", "Replace the seed kind.", "KIND"),
                Opt("command", "Set the command.", "COMMAND"),
                Opt("clear-command", "Clear the command."),
                Opt("adapter", "Set the adapter.", "ADAPTER"),
                Opt("clear-adapter", "Clear the adapter."),
                Opt("script", "Set the script path.", "SCRIPT"),
                Opt("clear-script", "Clear the script path."),
                _many("add-provides", "ADD_PROVIDES", "Add a provided capability."),
                _many("remove-provides", "REMOVE_PROVIDES", "Remove a provided capability."),
                _many("add-alias", "ADD_ALIAS", "Add an alias."),
                _many("remove-alias", "REMOVE_ALIAS", "Remove an alias."),
                Opt("priority", _PRIORITY_HELP, "PRIORITY", parser=parse_u8),
                Opt("clear-priority", "Clear the default priority."),
                _many("add-preferred-for", "ADD_PREFERRED_FOR", "Add a preferred-for capability."),
                _many("remove-preferred-for", "REMOVE_PREFERRED_FOR", "Remove a preferred-for capability."),
                _many("add-avoid-for", "ADD_AVOID_FOR", "Add an avoid-for capability."),
                _many("remove-avoid-for", "REMOVE_AVOID_FOR", "Remove an avoid-for capability."),
                _many("add-tie", "ADD_TIE", "Insert or replace tie-breaker metadata, KEY=VALUE."),
                _many("remove-tie", "REMOVE_TIE", "Remove tie-breaker metadata by key."),
                _many("add-auth-env", "ADD_AUTH_ENV", "Add an auth environment variable."),
                _many("remove-auth-env", "REMOVE_AUTH_ENV", "Remove an auth environment variable."),
                Opt(
                    "external-service",
                    "Set the external-service risk.",
                    "EXTERNAL_SERVICE",
                    parser=parse_bool,
                    choices=BOOL_VALUES,
                ),
                Opt(
                    "may-cost-money",
                    "Set the may-cost-money risk.",
                    "MAY_COST_MONEY",
                    parser=parse_bool,
                    choices=BOOL_VALUES,
                ),
                _many("add-evidence-command", "ADD_EVIDENCE_COMMAND", "Add an evidence command."),
                _many("remove-evidence-command", "REMOVE_EVIDENCE_COMMAND", "Remove an evidence command."),
                Opt("suggested-skill-id", "Set the suggested skill id.", "SUGGESTED_SKILL_ID"),
                Opt("clear-suggested-skill-id", "Clear the suggested skill id."),
                Opt(
                    "mark-unverified",
                    "Mark the seed unverified without running checks.",
                    conflicts_with=("mark-failed",),
                ),
                Opt(
                    "mark-failed",
                    "Mark the seed failed without running checks.",
                    conflicts_with=("mark-unverified",),
                ),
                Opt("expected-revision", "Refuse unless the seed file still has this revision.", "REV"),
                _server_option(),
            ),
            (Positional("ID", "id", "Seed id to update."),),
        ),
        Command(
            "list",
            "List seeds, sorted by domain, then id.",
            (Opt("domain", "Only this domain.", "DOMAIN"), _server_option()),
        ),
        Command(
            "search",
            "Rank seeds for one capability.",
            (
                Opt("domain", "Only this domain.", "DOMAIN"),
                Opt("explain", "Accepted for SkillSpec; reasons are always shown."),
                _JSON,
                Opt("local-only", "Leave out seeds that call an external service."),
                Opt("preferred-seed", "Give this seed id the explicit-preference bonus.", "PREFERRED_SEED"),
                Opt("broaden", "When nothing matches, search equivalent capabilities and domains."),
                Opt("equivalents", "Extra equivalence table for --broaden (local store only).", "FILE"),
                _server_option(),
            ),
            (Positional("CAPABILITY", "capability", "Capability to search for, such as text_to_speech."),),
        ),
        Command("inspect", "Print one seed.", (_domain_lookup(), _JSON, _server_option()), (_ID,)),
        Command(
            "verify",
            "Run seeds' evidence checks and record the verdicts.",
            (
                _domain_lookup(),
                Opt("all", "Verify every seed of --domain."),
                _JSON,
                Opt("timeout", "Seconds each check may run (default 10).", "SECONDS", parser=_positive_float),
                Opt("concurrency", "Seeds verified at once (default 4).", "N", parser=_positive_int),
                Opt("strict", "Exit 1 unless every seed verified (SkillSpec exits 0 for a failed seed)."),
                Opt(
                    "progress",
                    "Progress while checks run: auto (a live display on a terminal), json (events as "
                    "JSON lines on stdout), none.",
                    "MODE",
                    choices=PROGRESS_MODES,
                ),
                _server_option(),
            ),
            (Positional("ID", "ids", "Seed ids to verify.", required=False, multiple=True),),
            after_help="Exit codes: 0 success (also for a failed seed), 1 error or, with --strict, a seed "
            "that did not verify, 2 usage error.",
        ),
        Command(
            "prefer",
            "Prefer a seed for a capability, optionally setting its priority.",
            (
                _domain_lookup(),
                Opt("for", "Capability to prefer the seed for.", "FOR_CAPABILITY", required=True),
                Opt("priority", _PRIORITY_HELP, "PRIORITY", parser=parse_u8),
                _server_option(),
            ),
            (_ID,),
        ),
        Command("remove", "Delete a seed file.", (_domain_lookup(), _server_option()), (_ID,)),
        Command("scan", "Propose seeds (no providers are configured).", (_server_option(),)),
    )
}
SERVE_ABOUT = "Run the seedstore gRPC service."
GLOBAL_OPTIONS = (_server_option(), _json_style_option())
"""Options taken before the subcommand as well as after it (never both)."""


def top_help() -> str:
    rows = [(name, command.about) for name, command in COMMANDS.items()]
    rows.append(("serve", SERVE_ABOUT))
    width = max(len(name) for name, _ in rows)
    lines = [
        "Capability seeds: SkillSpec's `capability` commands, on the local store or through the service.",
        "",
        f"Usage: {PROG} [OPTIONS] <COMMAND>",
        "",
        "Commands:",
        *(f"  {name.ljust(width)}  {about}" for name, about in rows),
        "",
        "Options:",
        f"      --server <ADDR>        {SERVER_HELP}",
        f"      --json-style <STYLE>   {JSON_STYLE_HELP} [possible values: pretty, compact]",
        "  -h, --help                 Print help",
        "  -V, --version              Print version",
        "",
        EXIT_CODES_HELP,
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The parser of `seedstore [--server ADDR] serve ...`: the service's own flags, argparse-style.

    `serve` has no SkillSpec counterpart; it shares its flags with the negotiator's `serve`.
    """
    import argparse

    from agentsidecar.seedstore_service.server import add_serve_arguments

    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False)
    parser.add_argument("--server", metavar="ADDR", help=SERVER_HELP)
    commands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
    serve_parser = commands.add_parser("serve", help=SERVE_ABOUT, description=SERVE_ABOUT, allow_abbrev=False)
    add_serve_arguments(serve_parser)
    return parser


def _flag_like(token: str) -> bool:
    return token.startswith("-") and token != "-"


def parse_argv(argv: Sequence[str]) -> argparse.Namespace:
    """The command line as clap would take it (`serve` aside).

    The global options (`--server`, `--json-style`) are this CLI's additions.
    Before the subcommand they are read here by clap's rules for a long option
    (full name only, once, the value attached with `=` or the next token unless
    it starts with `-`); after it, each is one of the subcommand's own options
    and `parse_command` reads it with the rest. Given in both places, it is
    "cannot be used multiple times", as clap says of a global argument.

    Raises:
        UsageError, HelpRequested: see `cliparse`.
    """
    for token in argv:
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            # Bytes that are not UTF-8 reach Python as lone surrogates; clap's String refuses them.
            raise UsageError("invalid UTF-8 was detected in one or more arguments") from None
    given: dict[str, str] = {}  # the global options before the subcommand, by dest
    index = 0
    while index < len(argv):
        token = argv[index]
        if token in ("-h", "--help"):
            raise HelpRequested(top_help())
        if token in ("-V", "--version"):
            raise HelpRequested(cli_common.version_text(PROG) + "\n")
        option = next((o for o in GLOBAL_OPTIONS if token.partition("=")[0] == f"--{o.long}"), None)
        if option is not None:
            if option.dest in given:
                raise UsageError(f"the argument '{option.display}' cannot be used multiple times")
            if "=" in token:
                value = token.partition("=")[2]
            elif index + 1 < len(argv) and not _flag_like(argv[index + 1]):
                index += 1
                value = argv[index]
            else:
                raise UsageError(f"a value is required for '{option.display}' but none was supplied")
            if option.choices and value not in option.choices:
                raise UsageError(
                    f"invalid value '{value}' for '{option.display}'\n"
                    f"  [possible values: {', '.join(option.choices)}]"
                )
            given[option.dest] = value
            index += 1
            continue
        if _flag_like(token):
            shown = token.partition("=")[0] if token.startswith("--") else token[:2]
            usage = f"Usage: {PROG} [OPTIONS] <COMMAND>"
            names = [o.long for o in GLOBAL_OPTIONS] + ["help", "version"]
            tip = similar(shown.lstrip("-"), names) if token.startswith("--") else None
            tips = [f"a similar argument exists: '--{tip}'"] if tip else []
            raise UsageError(f"unexpected argument '{shown}' found", tips=tips, usage=usage)
        break
    if index >= len(argv):
        raise UsageError("a subcommand is required", usage=f"Usage: {PROG} [OPTIONS] <COMMAND>")
    name, rest = argv[index], argv[index + 1 :]
    if name == "serve":
        args = build_parser().parse_args(["serve", *rest])
        args.server = given.get("server")
        args.json_style = given.get("json_style") or cli_common.DEFAULT_JSON_STYLE
        return args
    command = COMMANDS.get(name)
    if command is None:
        tip = similar(name, [*COMMANDS, "serve"])
        tips = [f"a similar subcommand exists: '{tip}'"] if tip else []
        raise UsageError(
            f"unrecognized subcommand '{name}'", tips=tips, usage=f"Usage: {PROG} [OPTIONS] <COMMAND>"
        )
    values = parse_command(command, rest, PROG)
    for option in GLOBAL_OPTIONS:
        if values[option.dest] is not None and option.dest in given:
            raise UsageError(f"the argument '{option.display}' cannot be used multiple times")
        if values[option.dest] is None:
            values[option.dest] = given.get(option.dest)
    values["json_style"] = values["json_style"] or cli_common.DEFAULT_JSON_STYLE
    if name == "prefer":
        values["for_capability"] = values.pop("for")
    # argparse.Namespace's attribute access, without importing argparse for a local command.
    return cast("argparse.Namespace", types.SimpleNamespace(subcommand=name, **values))


def _add_spec(args: argparse.Namespace) -> AddSpec:
    from agentsidecar.seedstore_service.patch import AddSpec

    return AddSpec(
        id=args.id,
        domain=args.domain,
        kind=args.kind,
        command=args.command,
        adapter=args.adapter,
        script=args.script,
        provides=tuple(args.provides),
        aliases=tuple(args.alias),
        preferred_for=tuple(args.preferred_for),
        avoid_for=tuple(args.avoid_for),
        ties=tuple(args.tie),
        auth_env=tuple(args.auth_env),
        priority=args.priority,
        external_service=args.external_service,
        may_cost_money=args.may_cost_money,
        evidence_commands=tuple(args.evidence_command),
        suggested_skill_id=args.suggested_skill_id,
    )


def _update_patch(args: argparse.Namespace) -> UpdatePatch:
    from agentsidecar.seedstore_service.patch import UpdatePatch

    mark: VerificationStatus | None = None
    if args.mark_failed:
        mark = VerificationStatus.FAILED
    elif args.mark_unverified:
        mark = VerificationStatus.UNVERIFIED
    return UpdatePatch(
        kind=args.kind,
        command=args.command,
        clear_command=args.clear_command,
        adapter=args.adapter,
        clear_adapter=args.clear_adapter,
        script=args.script,
        clear_script=args.clear_script,
        add_provides=tuple(args.add_provides),
        remove_provides=tuple(args.remove_provides),
        add_aliases=tuple(args.add_alias),
        remove_aliases=tuple(args.remove_alias),
        priority=args.priority,
        clear_priority=args.clear_priority,
        add_preferred_for=tuple(args.add_preferred_for),
        remove_preferred_for=tuple(args.remove_preferred_for),
        add_avoid_for=tuple(args.add_avoid_for),
        remove_avoid_for=tuple(args.remove_avoid_for),
        add_ties=tuple(args.add_tie),
        remove_ties=tuple(args.remove_tie),
        add_auth_env=tuple(args.add_auth_env),
        remove_auth_env=tuple(args.remove_auth_env),
        external_service=args.external_service,
        may_cost_money=args.may_cost_money,
        add_evidence_commands=tuple(args.add_evidence_command),
        remove_evidence_commands=tuple(args.remove_evidence_command),
        suggested_skill_id=args.suggested_skill_id,
        clear_suggested_skill_id=args.clear_suggested_skill_id,
        mark=mark,
    )


# --- running a command -----------------------------------------------------------


def _run_verify(
    frontend: Frontend, args: argparse.Namespace, stdout: TextIO, stderr: TextIO
) -> tuple[dict[str, Any], Sequence[Problem]]:
    request = VerifyRequest(
        ids=tuple(args.ids),
        domain=args.domain,
        all_in_domain=args.all,
        check_timeout=args.timeout if args.timeout is not None else DEFAULT_CHECK_TIMEOUT_SECONDS,
        concurrency=args.concurrency if args.concurrency is not None else DEFAULT_VERIFY_CONCURRENCY,
    )
    verdicts: list[SeedVerified] = []
    limits_given = args.timeout is not None or args.concurrency is not None
    mode = args.progress or "auto"
    with contextlib.ExitStack() as stack:
        show: ProgressListener | None = None
        if mode == "json":
            from agentsidecar.seedstore_service.verify_progress import JsonLines

            show = JsonLines(stdout)
        elif mode == "auto" and stderr.isatty():
            from agentsidecar.seedstore_service.verify_progress import LiveDisplay

            try:
                planned: dict[tuple[str, str], int] | None = frontend.planned_checks(request)
            except frontend.errors:
                planned = None  # the verify call itself reports why
            show = stack.enter_context(LiveDisplay(stderr, planned))

        def listen(seed_store: str, event: VerifyProgress) -> None:
            if show is not None:
                show(seed_store, event)
            if isinstance(event, SeedVerified):
                verdicts.append(event)

        seed_store = frontend.verify(request, limits_given, listen)

    def verify_object(verdict: SeedVerified) -> dict[str, Any]:
        return render.verify_json(
            seed_store, verdict.id, verdict.domain, verdict.path, verdict.status, verdict.outcomes
        )

    if len(request.ids) == 1 and not request.all_in_domain and len(verdicts) == 1:
        return verify_object(verdicts[0]), ()
    if request.all_in_domain:
        verdicts.sort(key=lambda verdict: (verdict.domain, verdict.id))
    else:
        position: dict[str, int] = {}
        for index, seed_id in enumerate(request.ids):
            position.setdefault(seed_id, index)
        verdicts.sort(key=lambda verdict: (position.get(verdict.id, len(position)), verdict.path))
    results = []
    for verdict in verdicts:
        result = verify_object(verdict)
        del result["seed_store"]
        results.append(result)
    return {"seed_store": seed_store, "results": results}, ()


def run_command(
    frontend: Frontend, args: argparse.Namespace, stdout: TextIO, stderr: TextIO
) -> tuple[dict[str, Any], Sequence[Problem]]:
    """The JSON object a command prints, and the problems to warn about."""
    name = args.subcommand
    if name == "store":
        return render.store_json(frontend.store()), ()
    if name == "add":
        view = frontend.add(_add_spec(args))
        return render.written_json(view.seed_store, view.stored.seed, view.stored.path, "written"), ()
    if name in ("update", "prefer"):
        if name == "update":
            view = frontend.update(args.id, args.domain, _update_patch(args), args.expected_revision)
        else:
            view = frontend.prefer(args.id, args.domain, args.for_capability, args.priority)
        output = render.written_json(
            view.seed_store, view.stored.seed, view.stored.path, "updated", problems=view.problems
        )
        return output, view.problems
    if name == "list":
        listing = frontend.list_seeds(args.domain)
        return render.list_json(listing.seed_store, listing.domain, listing.entries, listing.problems), (
            listing.problems
        )
    if name == "search":
        query = SearchQuery(
            capability=args.capability,
            domain=args.domain,
            local_only=args.local_only,
            preferred_seed=args.preferred_seed,
        )
        outcome = frontend.search(query, args.broaden)
        output = render.search_json(outcome.seed_store, outcome.result, outcome.broadening, outcome.problems)
        return output, outcome.problems
    if name == "inspect":
        view = frontend.inspect(args.id, args.domain)
        output = render.inspect_json(
            view.seed_store,
            view.stored.path,
            view.stored.revision,
            seed_to_json(view.stored.seed),
            view.problems,
        )
        return output, view.problems
    if name == "verify":
        return _run_verify(frontend, args, stdout, stderr)
    if name == "remove":
        removed = frontend.remove(args.id, args.domain)
        return render.remove_json(removed.seed_store, removed.id, removed.path, problems=removed.problems), (
            removed.problems
        )
    if name == "scan":
        return render.scan_json(frontend.scan()), ()
    raise AssertionError(f"unhandled command {name}")


class Respelling:
    """Puts the store root back as the user spelled it into what the local store reports.

    The store works on pathlib paths, which normalise `a/./b//c` to `a/b/c`; SkillSpec prints
    the root as given. Only the printed locations change: `seed_store`, every `path`, and the
    paths inside problem and error texts (never a seed's own values).
    """

    def __init__(self, normal: str, spelled: str) -> None:
        self._normal = normal
        self._spelled = spelled
        prefix = re.escape(normal.rstrip("/") + "/") if normal != "." else None
        # A path starts the text or follows a space, a quote or a parenthesis.
        self._inside = re.compile(r"(?:(?<=^)|(?<=[\s\"'(]))" + prefix) if prefix is not None else None

    @property
    def needed(self) -> bool:
        return self._normal != self._spelled

    def path(self, text: str) -> str:
        if text == self._normal:
            return self._spelled
        if self._normal == ".":
            return rust_join(self._spelled, text)
        head = self._normal.rstrip("/") + "/"
        return rust_join(self._spelled, text[len(head) :]) if text.startswith(head) else text

    def text(self, message: str) -> str:
        if self._inside is None:
            return message
        spelled = rust_join(self._spelled, "")
        return self._inside.sub(lambda _match: spelled, message)

    def output(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {name: item if name == "seed" else self.output(item, name) for name, item in value.items()}
        if isinstance(value, list):
            return [self.output(item, key) for item in value]
        if isinstance(value, str) and key in ("seed_store", "path"):
            return self.path(value)
        if isinstance(value, str) and key == "reason":
            return self.text(value)
        return value

    def problem(self, problem: Problem) -> Problem:
        return Problem(self.path(problem.path), problem.line, self.text(problem.reason))


def _serve(args: argparse.Namespace, env: Mapping[str, str], stderr: TextIO) -> int:
    import asyncio

    from agentsidecar.seedstore_service.server import Settings, serve
    from agentsidecar.sidecar_runtime.lifecycle import log_json

    log_json("seedstore", stderr)
    try:
        settings = Settings.from_args(args, env)
        asyncio.run(serve(settings))
    except (SeedStoreError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    stdout, stderr = sys.stdout, sys.stderr
    try:
        args = parse_argv(list(sys.argv[1:] if argv is None else argv))
    except HelpRequested as help_request:
        stdout.write(help_request.text)
        return 0
    except UsageError as error:
        stderr.write(error.text)
        return 2
    except SystemExit as exit_request:  # argparse, for `serve`
        return exit_request.code if isinstance(exit_request.code, int) else 2
    env = os.environ
    if args.subcommand == "serve":
        return _serve(args, env, stderr)
    # One command, then the process exits: the cyclic collector would only scan the decoded
    # index again and again as the command allocates (a `list` of a large store, mostly). Verify
    # runs checks for longer, so it keeps collecting.
    pause_collector = args.subcommand != "verify" and gc.isenabled()
    if pause_collector:
        gc.disable()
    try:
        return _command(args, env, stdout, stderr)
    except BrokenPipeError:  # verify's progress lines, written as checks finish
        return cli_common.reader_gone(stdout)
    finally:
        if pause_collector:
            gc.enable()


def _command(args: argparse.Namespace, env: Mapping[str, str], stdout: TextIO, stderr: TextIO) -> int:
    target = args.server or env.get(SERVER_ENV) or None
    if args.subcommand == "verify" and not args.ids and not args.all:
        return _usage_error("verify needs at least one ID, or --all with --domain", "verify")
    if args.subcommand == "verify" and args.all and args.ids:
        return _usage_error("verify takes seed IDs or --all, not both", "verify")
    if args.subcommand == "search" and target is not None and args.equivalents is not None:
        return _usage_error(
            "--equivalents cannot be used with --server: the service reads its own table", "search"
        )
    frontend: Frontend
    remote: RemoteFrontend | None = None
    respelling: Respelling | None = None
    if target is None:
        try:
            respelling = Respelling(str(resolve_store_root(env)), spelled_store_root(env))
        except SeedStoreError:
            respelling = None  # HOME unset: the command reports it
        if respelling is not None and not respelling.needed:
            respelling = None
    if target is not None:
        from agentsidecar.seedstore_service.remote_frontend import RemoteFrontend

        try:
            remote = RemoteFrontend(target, env.get(TOKEN_FILE_ENV) or None)
        except ValueError as error:
            return _usage_error(str(error), args.subcommand)
        except OSError as error:
            return _usage_error(
                f"{TOKEN_FILE_ENV}: cannot read {error.filename}: {error.strerror}", args.subcommand
            )
        frontend = remote
    else:
        frontend = LocalFrontend(env, getattr(args, "equivalents", None))
    try:
        output, problems = run_command(frontend, args, stdout, stderr)
    except SeedStoreError as error:
        message = respelling.text(error.message) if respelling is not None else error.message
        cli_common.print_error(message, cli_output.local_error_object(error, message), stderr)
        return 1
    except frontend.errors as error:
        # Only the remote front end's SidecarError gets here: SeedStoreError is caught above.
        sidecar_error = cast("SidecarError", error)
        from agentsidecar.seedstore_service.remote_read import error_text

        message = error_text(sidecar_error, target or "")
        cli_common.print_error(message, cli_common.status_error_object(sidecar_error, message), stderr)
        return 1
    except KeyboardInterrupt:
        cli_common.print_error("interrupted", cli_common.error_object("CANCELLED", "", "interrupted"), stderr)
        return 130
    finally:
        if remote is not None:
            remote.close()
    if respelling is not None:
        output = respelling.output(output)
        problems = [respelling.problem(problem) for problem in problems]
    cli_output.print_warnings(problems, stderr)
    if args.subcommand == "verify" and args.progress == "json":
        text = cli_common.dumps_line({"result": output})
    else:
        text = cli_output.dumps(output, args.json_style)
    if cli_common.write_result(text + "\n", stdout) != cli_common.EXIT_OK:
        return cli_common.EXIT_FAILED
    if args.subcommand == "verify" and args.strict:
        unverified = _unverified(output)
        if unverified:
            message = f"not verified: {', '.join(unverified)}"
            not_verified = cli_common.error_object(
                "FAILED_PRECONDITION", "SEED_NOT_VERIFIED", message, {"seeds": ",".join(unverified)}
            )
            cli_common.print_error(message, not_verified, stderr)
            return 1
    return 0


def _unverified(output: Mapping[str, Any]) -> list[str]:
    """The `domain/id` of every verdict in a verify output that is not `verified`."""
    results = output.get("results", [output])
    return [f"{result['domain']}/{result['id']}" for result in results if result["status"] != "verified"]


def _usage_error(message: str, subcommand: str) -> int:
    command = COMMANDS.get(subcommand)
    usage = command.usage(PROG) if command is not None else None
    sys.stderr.write(UsageError(message, usage=usage).text)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
