"""`seedstore`: the `skillspec capability` commands, on the local store or through the service.

Subcommands, positional arguments, flags and JSON output are SkillSpec's
(`store add update list search inspect verify prefer remove scan`). Additions:

* `--server ADDR` (or `$SEEDSTORE_SERVER`): go through a running seedstore
  service (`unix:PATH` or `HOST:PORT`) instead of the local files. Both paths
  print identical JSON: responses are converted back to the same core values
  and rendered by the same functions.
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

Exit codes: 0 success (also when verify finds a failing seed), 1 for an
error (`error: <message>` on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import grpc
from agentsidecar.seedstore.v1 import seedstore_pb2 as pb

from clients.errors import SidecarError
from clients.seedstore import SeedStoreClient
from seedstore_service import convert, render
from seedstore_service.errors import SeedStoreError
from seedstore_service.model import Problem, VerificationStatus
from seedstore_service.operations import (
    DEFAULT_CHECK_TIMEOUT_SECONDS,
    DEFAULT_VERIFY_CONCURRENCY,
    SearchOutcome,
    SeedListing,
    SeedOperations,
    SeedRemoved,
    SeedVerified,
    SeedView,
    VerifyProgress,
    VerifyRequest,
    default_equivalents_file,
    load_equivalents,
)
from seedstore_service.patch import AddSpec, UpdatePatch
from seedstore_service.ranking import SearchQuery
from seedstore_service.runner import DEFAULT_PATH, CheckFinished, CheckStarted
from seedstore_service.server import Settings, add_serve_arguments, serve
from seedstore_service.store import SeedStore, resolve_store_root
from sidecar_runtime.lifecycle import log_json

SERVER_ENV = "SEEDSTORE_SERVER"

ProgressListener = Callable[[VerifyProgress], None]


# --- the two front ends ----------------------------------------------------------


class Frontend(Protocol):
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


class LocalFrontend:
    """The files themselves, loaded afresh by every command, as SkillSpec does."""

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
                runner_path=self._env.get("PATH") or DEFAULT_PATH,
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
        return self._ops().list_seeds(domain)

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
        operations = self._ops()

        async def run() -> None:
            async with contextlib.aclosing(operations.verify(request)) as events:
                async for event in events:
                    listener(event)

        asyncio.run(run())
        return operations.seed_store


class RemoteFrontend:
    """A seedstore service; every response is turned back into the core value the local path returns."""

    def __init__(self, target: str) -> None:
        self._client = SeedStoreClient(target)

    def close(self) -> None:
        self._client.close()

    def store(self) -> str:
        return self._client.get_store().seed_store

    def add(self, spec: AddSpec) -> SeedView:
        return convert.seed_view_from_proto(self._client.add_seed(convert.add_request(spec)))

    def update(
        self, seed_id: str, domain: str | None, patch: UpdatePatch, expected_revision: str | None
    ) -> SeedView:
        request = convert.update_request(seed_id, domain, patch, expected_revision)
        return convert.seed_view_from_proto(self._client.update_seed(request))

    def list_seeds(self, domain: str | None) -> SeedListing:
        # Every page, so the output is the whole listing as SkillSpec prints it.
        return convert.listing_from_proto(self._client.list_all_seeds(pb.ListSeedsRequest(domain=domain)))

    def search(self, query: SearchQuery, broaden: bool) -> SearchOutcome:
        response = self._client.search_seeds(convert.search_request(query, broaden))
        return convert.search_outcome_from_proto(response)

    def inspect(self, seed_id: str, domain: str | None) -> SeedView:
        request = pb.InspectSeedRequest(id=seed_id, domain=domain)
        return convert.seed_view_from_proto(self._client.inspect_seed(request))

    def prefer(self, seed_id: str, domain: str | None, for_capability: str, priority: int | None) -> SeedView:
        request = pb.PreferSeedRequest(
            id=seed_id, domain=domain, for_capability=for_capability, priority=priority
        )
        return convert.seed_view_from_proto(self._client.prefer_seed(request))

    def remove(self, seed_id: str, domain: str | None) -> SeedRemoved:
        request = pb.RemoveSeedRequest(id=seed_id, domain=domain)
        return convert.removed_from_proto(self._client.remove_seed(request))

    def scan(self) -> str:
        return self._client.scan_seeds().seed_store

    def verify(self, request: VerifyRequest, limits_given: bool, listener: ProgressListener) -> str:
        message = convert.verify_request(request, send_timeout=limits_given, send_concurrency=limits_given)
        seed_store = ""
        for response in self._client.verify_seeds(message):
            seed_store = response.seed_store
            listener(convert.verify_event_from_proto(response))
        if not seed_store:
            seed_store = self.store()
        return seed_store


# --- argument parsing ------------------------------------------------------------


def _u8(text: str) -> int:
    """clap's u8: 0-255, anything else is a usage error (the core refuses > 100 itself)."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid digit found in string: {text!r}") from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(f"{value} is not in 0..=255")
    return value


def _bool(text: str) -> bool:
    """clap's bool: exactly `true` or `false`."""
    if text == "true":
        return True
    if text == "false":
        return False
    raise argparse.ArgumentTypeError(f"invalid value {text!r}: possible values: true, false")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seedstore",
        description="Capability seeds: SkillSpec's `capability` commands, locally or through the service.",
    )
    server_help = f"use the seedstore service at ADDR (unix:PATH or HOST:PORT; default ${SERVER_ENV})"
    parser.add_argument("--server", metavar="ADDR", help=server_help)
    commands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        # Accepted after the subcommand too; SUPPRESS keeps a global value.
        sub.add_argument("--server", metavar="ADDR", default=argparse.SUPPRESS, help=server_help)
        return sub

    def repeated(sub: argparse.ArgumentParser, flag: str, metavar: str, help_text: str) -> None:
        sub.add_argument(flag, action="append", default=[], metavar=metavar, help=help_text + " (repeatable)")

    command("store", "print the seed store directory")

    add = command("add", "create or overwrite a capability seed")
    add.add_argument("id", metavar="ID")
    add.add_argument("--domain", required=True)
    add.add_argument("--kind", required=True, help="cli, adapter, script, flow, ...")
    add.add_argument("--command")
    add.add_argument("--adapter")
    add.add_argument("--script")
    repeated(add, "--provides", "CAP", "capability provided")
    repeated(add, "--alias", "TEXT", "free-text alias")
    repeated(add, "--preferred-for", "CAP", "capability this seed is preferred for")
    repeated(add, "--avoid-for", "CAP", "capability this seed should be avoided for")
    repeated(add, "--tie", "KEY=VALUE", "tie breaker")
    repeated(add, "--auth-env", "VAR", "environment variable holding a secret")
    repeated(add, "--evidence-command", "CMD", "command whose success is evidence")
    add.add_argument("--priority", type=_u8, metavar="N", help="0-100; adds floor(N/10) to the score")
    add.add_argument("--external-service", action="store_true")
    add.add_argument("--may-cost-money", action="store_true")
    add.add_argument("--suggested-skill-id", metavar="ID")

    update = command("update", "patch an existing capability seed")
    update.add_argument("id", metavar="ID")
    update.add_argument("--domain", help="narrows the lookup; cannot move a seed")
    update.add_argument(
        "--expected-revision", metavar="REV", help="fail unless the seed still has this revision"
    )
    update.add_argument("--kind")
    for name, metavar in (("command", "C"), ("adapter", "A"), ("script", "S")):
        update.add_argument(f"--{name}", metavar=metavar)
        update.add_argument(f"--clear-{name}", action="store_true")
    for name, metavar in (
        ("provides", "CAP"),
        ("alias", "TEXT"),
        ("preferred-for", "CAP"),
        ("avoid-for", "CAP"),
    ):
        repeated(update, f"--add-{name}", metavar, f"add a {name} value")
        repeated(update, f"--remove-{name}", metavar, f"remove a {name} value")
    update.add_argument("--priority", type=_u8, metavar="N")
    update.add_argument("--clear-priority", action="store_true")
    repeated(update, "--add-tie", "KEY=VALUE", "insert or replace a tie breaker")
    repeated(update, "--remove-tie", "KEY", "remove a tie breaker")
    repeated(update, "--add-auth-env", "VAR", "add an auth env variable")
    repeated(update, "--remove-auth-env", "VAR", "remove an auth env variable")
    update.add_argument("--external-service", type=_bool, metavar="true|false")
    update.add_argument("--may-cost-money", type=_bool, metavar="true|false")
    repeated(update, "--add-evidence-command", "CMD", "add an evidence command")
    repeated(update, "--remove-evidence-command", "CMD", "remove an evidence command")
    update.add_argument("--suggested-skill-id", metavar="ID")
    update.add_argument("--clear-suggested-skill-id", action="store_true")
    marks = update.add_mutually_exclusive_group()
    marks.add_argument("--mark-unverified", action="store_true")
    marks.add_argument("--mark-failed", action="store_true")

    listing = command("list", "list seeds, sorted by domain then id")
    listing.add_argument("--domain")

    search = command("search", "rank seeds for a capability")
    search.add_argument("capability", metavar="CAPABILITY")
    search.add_argument("--domain")
    search.add_argument(
        "--explain", action="store_true", help="accepted for SkillSpec; reasons are always shown"
    )
    search.add_argument("--json", action="store_true", help="accepted for SkillSpec; output is always JSON")
    search.add_argument("--local-only", action="store_true")
    search.add_argument("--preferred-seed", metavar="ID")
    search.add_argument("--broaden", action="store_true", help="search equivalents when nothing matches")
    search.add_argument("--equivalents", metavar="FILE", help="extra equivalence table (local only)")

    inspect = command("inspect", "print one seed")
    inspect.add_argument("id", metavar="ID")
    inspect.add_argument("--domain")
    inspect.add_argument("--json", action="store_true", help="accepted for SkillSpec; output is always JSON")

    verify = command("verify", "run seeds' evidence and record the verdict")
    verify.add_argument("ids", metavar="ID", nargs="*")
    verify.add_argument("--domain")
    verify.add_argument("--all", action="store_true", help="every seed of --domain")
    verify.add_argument("--json", action="store_true", help="accepted for SkillSpec; output is always JSON")
    verify.add_argument("--timeout", type=_positive_float, metavar="SECONDS", help="per check (default 10)")
    verify.add_argument("--concurrency", type=_positive_int, metavar="N", help="seeds at once (default 4)")

    prefer = command("prefer", "prefer a seed for a capability")
    prefer.add_argument("id", metavar="ID")
    prefer.add_argument("--for", dest="for_capability", required=True, metavar="CAP")
    prefer.add_argument("--domain")
    prefer.add_argument("--priority", type=_u8, metavar="N")

    remove = command("remove", "delete a seed file")
    remove.add_argument("id", metavar="ID")
    remove.add_argument("--domain")

    command("scan", "propose seeds (no providers are configured)")

    add_serve_arguments(command("serve", "run the seedstore gRPC service"))
    return parser


def _add_spec(args: argparse.Namespace) -> AddSpec:
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


class _VerifyProgress:
    """Live lines on a terminal: one when a check starts, one when it ends, one per verdict."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, event: VerifyProgress) -> None:
        if isinstance(event, CheckStarted):
            line = f"[{event.seed_id}] {event.check} ..."
        elif isinstance(event, CheckFinished):
            verdict = "ok" if event.ok else f"failed: {event.message}"
            line = f"[{event.seed_id}] {event.check} ... {verdict} ({round(event.duration_s * 1000)} ms)"
        else:
            line = f"[{event.id}] {event.status.value}"
        print(line, file=self._stream, flush=True)


def _run_verify(
    frontend: Frontend, args: argparse.Namespace, stderr: TextIO
) -> tuple[dict[str, Any], Sequence[Problem]]:
    request = VerifyRequest(
        ids=tuple(args.ids),
        domain=args.domain,
        all_in_domain=args.all,
        check_timeout=args.timeout if args.timeout is not None else DEFAULT_CHECK_TIMEOUT_SECONDS,
        concurrency=args.concurrency if args.concurrency is not None else DEFAULT_VERIFY_CONCURRENCY,
    )
    progress = _VerifyProgress(stderr) if stderr.isatty() else None
    verdicts: list[SeedVerified] = []

    def listen(event: VerifyProgress) -> None:
        if progress is not None:
            progress(event)
        if isinstance(event, SeedVerified):
            verdicts.append(event)

    limits_given = args.timeout is not None or args.concurrency is not None
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
    frontend: Frontend, args: argparse.Namespace, stderr: TextIO
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
            view.seed_store, view.stored.path, view.stored.revision, view.stored.seed, view.problems
        )
        return output, view.problems
    if name == "verify":
        return _run_verify(frontend, args, stderr)
    if name == "remove":
        removed = frontend.remove(args.id, args.domain)
        return render.remove_json(removed.seed_store, removed.id, removed.path, problems=removed.problems), (
            removed.problems
        )
    if name == "scan":
        return render.scan_json(frontend.scan()), ()
    raise AssertionError(f"unhandled command {name}")


def _error_text(error: SidecarError, target: str) -> str:
    if not error.reason and error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        # No ErrorInfo: the service itself was never reached.
        return f"cannot reach the seedstore service at {target}: {error.message}"
    return error.message


def _serve(args: argparse.Namespace, env: Mapping[str, str], stderr: TextIO) -> int:
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
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else 2
    if extras:
        # argparse fills a `*` positional only once: `verify a --json b` leaves `b` over.
        if args.subcommand != "verify" or any(extra.startswith("-") for extra in extras):
            return _usage_error(parser, f"unrecognized arguments: {' '.join(extras)}")
        args.ids = [*args.ids, *extras]
    env = os.environ
    if args.subcommand == "serve":
        return _serve(args, env, stderr)
    target = args.server or env.get(SERVER_ENV) or None
    if args.subcommand == "verify" and not args.ids and not args.all:
        return _usage_error(parser, "verify needs at least one ID, or --all with --domain")
    if args.subcommand == "verify" and args.all and args.ids:
        return _usage_error(parser, "verify takes seed IDs or --all, not both")
    if args.subcommand == "search" and target is not None and args.equivalents is not None:
        return _usage_error(
            parser, "--equivalents cannot be used with --server: the service reads its own table"
        )
    frontend: Frontend
    remote: RemoteFrontend | None = None
    if target is not None:
        try:
            remote = RemoteFrontend(target)
        except ValueError as error:
            return _usage_error(parser, str(error))
        frontend = remote
    else:
        frontend = LocalFrontend(env, getattr(args, "equivalents", None))
    try:
        output, problems = run_command(frontend, args, stderr)
    except SeedStoreError as error:
        print(f"error: {error.message}", file=stderr)
        return 1
    except SidecarError as error:
        print(f"error: {_error_text(error, target or '')}", file=stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=stderr)
        return 130
    finally:
        if remote is not None:
            remote.close()
    for problem in problems:
        print(f"warning: {problem.path}:{problem.line}: {problem.reason}", file=stderr)
    print(json.dumps(output, indent=2, ensure_ascii=False), file=stdout)
    return 0


def _usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    try:
        parser.error(message)
    except SystemExit as exit_request:
        return exit_request.code if isinstance(exit_request.code, int) else 2
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
