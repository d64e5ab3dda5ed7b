"""`seedstore --server ADDR` read commands answered with one blocking call, without cli.py.

An agent runs `seedstore --server ADDR search CAP --domain D --json` and its kin one process
per call, so the command's cost is mostly the interpreter starting and the modules it imports.
`answer` runs `store`, `list`, `search` and `inspect` in quickread's plain forms through the
blocking client and renders the replies with `render`'s row functions, importing neither cli.py
(the local store's modules), the value types of `remote_convert`, nor the decoding of an error
until a call fails. Anything else returns None, and `cli.main` does the command.

It answers only where its output, errors and exit code are cli.main's:

* the command line is quickread's plain form of the command (`quickread.parse`) once `--server
  ADDR` (or `--server=ADDR`) is taken out of it, given once, before the subcommand or among its
  options, not where it could be the value of the option before it; or the plain form alone with
  `$SEEDSTORE_SERVER` set;
* the channel opens (a malformed target or an unreadable token file: cli.py reports it);
* every enum of the reply is one this build names (a verification status it does not know is
  cli.py's error to report); `inspect` converts the seed through `remote_convert`, as cli.py does.

A failed call prints what cli.py prints for it: `error_text`, then the status's JSON error object.
"""

from __future__ import annotations

from agentsidecar.seedstore_service import cli_output, render
from agentsidecar.seedstore_service.indexfile import list_row_text
from agentsidecar.seedstore_service.location import SERVER_ENV, TOKEN_FILE_ENV
from agentsidecar.seedstore_service.quickread import parse
from agentsidecar.sidecar_runtime import cli_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any, TextIO

    from agentsidecar.clients.errors import SidecarError
    from agentsidecar.clients.seedstore import SeedStoreClient
    from agentsidecar.seedstore.v1 import seedstore_pb2
    from agentsidecar.seedstore_service.model import ProblemLike
    from agentsidecar.seedstore_service.quickread import _Request

SERVER_OPTION = "--server"
# The most seeds a ListSeeds reply holds (`paging.MAX_PAGE_SIZE`, which imports the error tree these
# reads leave out): a listing takes as few round trips as the server's message limit allows.
LIST_PAGE_SIZE = 10_000
# The switches of the plain forms: a `--server` right after one of them is an option of its own.
_SWITCHES = frozenset(("--json", "--explain", "--local-only"))

# The names cli.py prints for the verification statuses (remote_convert maps the same ones;
# tests/seedstore/test_remote_read.py holds the two together).
_STATUS_NAMES = {
    "VERIFICATION_STATUS_VERIFIED",
    "VERIFICATION_STATUS_FAILED",
    "VERIFICATION_STATUS_UNVERIFIED",
}


class _Unanswerable(Exception):
    """The reply holds something only cli.py's conversion reports as cli.py does."""


def split_server(argv: Sequence[str], env: Mapping[str, str]) -> tuple[str, list[str]] | None:
    """The service target and the command line without `--server ADDR`, or None: not a remote
    command line this module answers (module docstring)."""
    rest = list(argv)
    target: str | None = None
    for index, token in enumerate(argv):
        if token != SERVER_OPTION and not token.startswith(f"{SERVER_OPTION}="):
            continue
        if target is not None:
            return None  # given twice: cli.py's usage error
        if index > 0:
            before = argv[index - 1]
            if before.startswith("-") and "=" not in before and before not in _SWITCHES:
                return None  # `--server` may be that option's value
        if token == SERVER_OPTION:
            value = argv[index + 1] if index + 1 < len(argv) else ""
            width = 2
        else:
            value = token.partition("=")[2]
            width = 1
        if not value or value.startswith("-"):
            return None
        target = value
        start = index - (len(argv) - len(rest))
        del rest[start : start + width]
    if target is None:
        target = env.get(SERVER_ENV) or None
        if target is None:
            return None
    elif any(token == SERVER_OPTION or token.startswith(f"{SERVER_OPTION}=") for token in rest):
        return None  # the value of one `--server` was another
    return target, rest


def answer(argv: Sequence[str], env: Mapping[str, str], stdout: TextIO, stderr: TextIO) -> int | None:
    """Run a remote read command and return its exit code; None when cli.py has to run it."""
    try:
        return _answer(argv, env, stdout, stderr)
    except BrokenPipeError:  # a warning or the error lines, as cli.main handles it
        return cli_common.reader_gone(stdout)


def _answer(argv: Sequence[str], env: Mapping[str, str], stdout: TextIO, stderr: TextIO) -> int | None:
    split = split_server(argv, env)
    if split is None:
        return None
    target, rest = split
    request = parse(rest)
    if request is None:
        return None
    from agentsidecar.clients.seedstore import SeedStoreClient

    try:
        client = SeedStoreClient(target, token_file=env.get(TOKEN_FILE_ENV) or None)
    except (ValueError, OSError):
        return None  # cli.py says why, as a usage error
    style = request.value("json-style") or cli_common.DEFAULT_JSON_STYLE
    try:
        output, problems = _call(client, request, style)
    except _Unanswerable:
        return None
    except Exception as error:
        # A failed call raised it from the error tree, which that call imported.
        from agentsidecar.clients.errors import SidecarError

        if not isinstance(error, SidecarError):
            raise
        message = error_text(error, target)
        cli_common.print_error(message, cli_common.status_error_object(error, message), stderr)
        return cli_common.EXIT_FAILED
    except KeyboardInterrupt:
        interrupted = cli_common.error_object("CANCELLED", "", "interrupted")
        cli_common.print_error("interrupted", interrupted, stderr)
        return 130
    finally:
        client.close()
    cli_output.print_warnings(problems, stderr)
    text = output if isinstance(output, str) else cli_output.dumps(output, style)
    return cli_common.write_result(text + "\n", stdout)


def _call(
    client: SeedStoreClient, request: _Request, style: str
) -> tuple[dict[str, Any] | str, Sequence[ProblemLike]]:
    """The command's result (an object to print in `style`, or its text) and the warnings."""
    from agentsidecar.seedstore.v1 import seedstore_pb2 as pb

    command, positional, domain = request.command, request.positional or "", request.value("domain")

    if command == "store":
        return render.store_json(client.get_store().seed_store), ()
    if command == "list":
        listing = client.list_all_seeds(pb.ListSeedsRequest(domain=domain, page_size=LIST_PAGE_SIZE))
        if style == "pretty":
            return _list_text(listing), listing.problems
        return _list_json(listing), listing.problems
    if command == "search":
        found = client.search_seeds(
            pb.SearchSeedsRequest(
                capability=positional,
                domain=domain,
                local_only=bool(request.options.get("local-only")),
                preferred_seed=request.value("preferred-seed"),
                broaden=False,
            )
        )
        return _search_json(found), found.problems
    assert command == "inspect"
    inspected = client.inspect_seed(pb.InspectSeedRequest(id=positional, domain=domain))
    return _inspect_json(inspected), inspected.problems


def _optional(message: Any, field: str) -> str | None:
    return getattr(message, field) if message.HasField(field) else None


class _Names:
    """The names cli.py prints for a reply's enum numbers, as remote_convert gives them: risks and
    gates by member name, else the unknown number's; a status it does not know is unanswerable."""

    def __init__(self) -> None:
        from agentsidecar.common.v1 import common_pb2 as common
        from agentsidecar.seedstore.v1 import seedstore_pb2 as pb
        from agentsidecar.sidecar_runtime import wire_names

        self._statuses: dict[int, str] = {
            pb.VerificationStatus.Value(name): name.removeprefix("VERIFICATION_STATUS_").lower()
            for name in _STATUS_NAMES
        }
        self._risks = _by_member_name(common.RiskFlag.items(), "RISK_FLAG_", wire_names.Risk)
        self._gates = _by_member_name(common.Gate.items(), "GATE_", wire_names.Gate)
        self._unknown_risk = wire_names.UnknownRisk
        self._unknown_gate = wire_names.UnknownGate

    def status(self, value: int) -> str:
        name = self._statuses.get(value)
        if name is None:
            raise _Unanswerable
        return name

    def risks(self, values: Iterable[int]) -> list[str]:
        known = self._risks
        return [known.get(value) or self._unknown_risk(int(value)).value for value in values]

    def gates(self, values: Iterable[int]) -> list[str]:
        known = self._gates
        return [known.get(value) or self._unknown_gate(int(value)).value for value in values]


def _by_member_name(numbers: Iterable[tuple[str, int]], prefix: str, members: Any) -> dict[int, str]:
    """Each proto number whose name, less `prefix`, is a member's name -> that member's value."""
    table: dict[int, str] = {}
    for name, number in numbers:
        member = members.__members__.get(name.removeprefix(prefix))
        if member is not None:
            table[number] = str(member.value)
    return table


def _list_json(response: seedstore_pb2.ListSeedsResponse) -> dict[str, Any]:
    rows = [render.list_row_json(*fields) for fields in _list_rows(response)]
    return render.listing_json(response.seed_store, _optional(response, "domain"), rows, response.problems)


def _list_text(response: seedstore_pb2.ListSeedsResponse) -> str:
    """`cli_output.dumps(_list_json(response), "pretty")`, each row written from its fields."""
    rows = [list_row_text(*fields) for fields in _list_rows(response)]
    empty = render.listing_json(response.seed_store, _optional(response, "domain"), [], response.problems)
    return cli_output.listing_text(empty, rows)


def _list_rows(
    response: seedstore_pb2.ListSeedsResponse,
) -> list[tuple[str, str, str, str, list[str], str, list[str], str]]:
    """Each seed's `list` row fields (`render.list_row_json`'s arguments), sorted as
    render.list_json sorts the entries: domain, id, path."""
    names = _Names()
    entries = sorted(response.seeds, key=lambda entry: (entry.domain, entry.id, entry.path))
    return [
        (
            entry.id,
            entry.domain,
            entry.kind,
            entry.path,
            list(entry.provides),
            names.status(entry.verification_status),
            names.risks(entry.risks),
            entry.revision,
        )
        for entry in entries
    ]


def _search_json(response: seedstore_pb2.SearchSeedsResponse) -> dict[str, Any]:
    if response.HasField("broadening"):
        raise _Unanswerable  # not asked for; cli.py renders what a server sent anyway
    names = _Names()
    candidates = [
        render.candidate_json(
            candidate.id,
            candidate.domain,
            candidate.path,
            candidate.score,
            candidate.reasons,
            names.risks(candidate.risks),
            names.gates(candidate.required_gates),
        )
        for candidate in response.candidates
    ]
    ask_policy = response.ask_policy.reason if response.HasField("ask_policy") else None
    return render.search_result_json(
        response.seed_store,
        response.capability,
        _optional(response, "domain"),
        _optional(response, "selected"),
        ask_policy,
        candidates,
        response.problems,
    )


def _inspect_json(response: seedstore_pb2.InspectSeedResponse) -> dict[str, Any]:
    from agentsidecar.seedstore_service.errors import SeedStoreError
    from agentsidecar.seedstore_service.remote_convert import seed_from_proto
    from agentsidecar.seedstore_service.seedtext import seed_to_json

    try:
        seed = seed_from_proto(response.seed)
    except SeedStoreError:
        raise _Unanswerable from None
    return render.inspect_json(
        response.seed_store,
        response.path,
        response.revision,
        seed_to_json(seed),
        response.problems,
    )


def error_text(error: SidecarError, target: str) -> str:
    """The message a failed remote command prints: the server's, or what the CLI knows better."""
    return cli_common.failed_call_text(
        error, target, cli_common.SEEDSTORE_SERVICE, "seedstore", unreachable_as="the seedstore service"
    )
