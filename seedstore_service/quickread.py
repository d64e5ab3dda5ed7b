"""`seedstore`'s entry point: the read commands answered from the persisted index, else cli.py.

Agents run `seedstore search CAP --domain D --json` and its kin one process per
call, so a read's cost is mostly the interpreter starting and the modules it
imports. `answer` gives the output of `store`, `list`, `inspect` and `search`
importing only modules that import nothing the interpreter has not loaded at
start-up (walk, indexfile, names, scoring, location, render, cli_output and
cli_common), or None, and then `main` hands the command line to `cli.main`,
which does everything and saves what the index lacks.

It answers only when its answer is the one `cli.main` prints, byte for byte:

* the command line is one of the plain forms below, each option at most once,
  every value an identifier (anything else may be an error, help, or something
  this module does not do: cli.py says it);
  `store` | `list [--domain D]` | `inspect ID [--domain D] [--json]` |
  `search CAP [--domain D] [--json] [--explain] [--local-only] [--preferred-seed S]`,
  each with `[--json-style pretty|compact]`, values given as `--opt V` or `--opt=V`;
* the local store, no `--server` nor `$SEEDSTORE_SERVER`, and its root spelled
  as pathlib spells it (else cli.py re-spells paths);
* the store is walked as every load walks it (walk.py) without a problem, and
  every seed file in scope has an entry in its section's index file whose
  signature is the file's now and which is not racy (persisted.py's trust rule:
  the same test a load makes before it uses an entry instead of reading the file);
* no file in scope has a problem or a note, and with `--domain` every seed there
  declares that domain (else the answer carries problems and warnings);
* `inspect` finds the id in exactly one file; `search`'s capability has a
  canonical form.

Nothing here writes: when an entry is missing or stale, cli.py reads the file and
saves the entry, and the next call answers from it.
"""

from __future__ import annotations

import gc
import os
import sys

from agentsidecar.seedstore_service import cli_output, indexfile, render
from agentsidecar.seedstore_service.indexfile import (
    DOMAIN,
    ID,
    KEYS,
    NOTES,
    PROBLEM,
    RANK,
    REVISION,
    ROW,
    SEED,
)
from agentsidecar.seedstore_service.location import SERVER_ENV, is_normal, spelled_store_root
from agentsidecar.seedstore_service.names import canonical, is_identifier
from agentsidecar.seedstore_service.scoring import could_match, rank_key, score, select
from agentsidecar.seedstore_service.walk import join_path, walk
from agentsidecar.sidecar_runtime import cli_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    Scope = list[tuple[str, indexfile.Entry]]

# Each command's options: those taking a value, and switches.
_VALUED = {
    "store": ("json-style",),
    "list": ("domain", "json-style"),
    "inspect": ("domain", "json-style"),
    "search": ("domain", "preferred-seed", "json-style"),
}
_SWITCHES = {
    "store": (),
    "list": (),
    "inspect": ("json",),
    "search": ("json", "explain", "local-only"),
}
_POSITIONALS = {"store": 0, "list": 0, "inspect": 1, "search": 1}


class _Request:
    """A command line in one of the plain forms."""

    __slots__ = ("command", "options", "positional")

    def __init__(self, command: str, options: dict[str, str | bool], positional: str | None) -> None:
        self.command = command
        self.options = options
        self.positional = positional

    def value(self, name: str) -> str | None:
        value = self.options.get(name)
        return value if isinstance(value, str) else None


def parse(argv: Sequence[str]) -> _Request | None:
    """The request of a plain command line (see the module docstring), else None."""
    if not argv or argv[0] not in _VALUED:
        return None
    command = argv[0]
    valued, switches = _VALUED[command], _SWITCHES[command]
    options: dict[str, str | bool] = {}
    positional: str | None = None
    tokens = iter(argv[1:])
    for token in tokens:
        if not token.startswith("-"):
            if positional is not None or _POSITIONALS[command] == 0:
                return None
            positional = token
            continue
        name, equals, attached = token[2:].partition("=")
        if not token.startswith("--") or name in options:
            return None
        if name in switches and not equals:
            options[name] = True
        elif name in valued:
            value = attached if equals else next(tokens, None)
            if value is None or (not equals and value.startswith("-")):
                return None
            options[name] = value
        else:
            return None
    if _POSITIONALS[command] == 1 and positional is None:
        return None
    style = options.get("json-style", cli_common.DEFAULT_JSON_STYLE)
    if style not in cli_common.JSON_STYLES:
        return None
    for name in ("domain", "preferred-seed"):
        given = options.get(name)
        if isinstance(given, str) and not is_identifier(given):
            return None
    if positional is not None and not is_identifier(positional):
        return None
    return _Request(command, options, positional)


def vouched_scope(root: str, domain: str | None) -> Scope | None:
    """Every seed file of the scope (walk order) with its entry, when the index vouches for each
    and none has a problem, a note or (with `domain`) another declared domain; else None."""
    refs, problems = walk(root, domain)
    if problems:
        return None
    index_directory = join_path(root, indexfile.INDEX_DIR_NAME)
    sections: dict[str | None, tuple[dict[str, indexfile.Entry], str]] = {}
    scope: Scope = []
    for path, domain_dir in refs:
        section = sections.get(domain_dir)
        if section is None:
            data = indexfile.read_index_file(
                join_path(index_directory, indexfile.section_file_name(domain_dir))
            )
            decoded = None if data is None else indexfile.decode_section(data, root, domain_dir)
            if decoded is None:
                return None
            section = sections[domain_dir] = (decoded[0], indexfile.section_prefix(root, domain_dir))
        entries, prefix = section
        entry = entries.get(path[len(prefix) :] if path.startswith(prefix) else path)
        try:
            found = os.stat(path)
        except OSError:
            return None
        if entry is None or not indexfile.signature_matches(entry, found) or indexfile.racy(entry):
            return None
        if entry[PROBLEM] is not None or entry[NOTES] or (domain is not None and entry[DOMAIN] != domain):
            return None
        scope.append((path, entry))
    return scope


def _list(root: str, domain: str | None, scope: Scope) -> dict[str, Any]:
    rows = []
    for path, entry in sorted(scope, key=lambda item: (item[1][DOMAIN], item[1][ID], item[0])):
        kind, provides, status, risks = entry[ROW]
        rows.append(
            render.list_row_json(
                entry[ID], entry[DOMAIN], kind, path, provides, status, risks, entry[REVISION]
            )
        )
    return render.listing_json(root, domain, rows, ())


def _inspect(root: str, seed_id: str, scope: Scope) -> dict[str, Any] | None:
    matches = [(path, entry) for path, entry in scope if entry[ID] == seed_id]
    if len(matches) != 1:
        return None  # not found or ambiguous: cli.py reports which
    path, entry = matches[0]
    try:
        seed = indexfile.loads(entry[SEED])
    except ValueError:
        return None
    return render.inspect_json(root, path, entry[REVISION], seed, ())


def _search(root: str, request: _Request, scope: Scope) -> dict[str, Any] | None:
    capability = request.positional
    assert capability is not None
    requested = canonical(capability)
    if not requested:
        return None
    preferred_seed = request.value("preferred-seed")
    local_only = request.options.get("local-only") is True
    scored = []
    for path, entry in scope:
        provides, texts = entry[KEYS]
        if not could_match(provides, texts, requested):
            continue
        preferred_for, avoid_for, priority, external_service, may_cost_money, risks, gates = entry[RANK]
        result = score(
            requested,
            capability,
            seed_id=entry[ID],
            status=entry[ROW][2],
            provides=provides,
            texts=texts,
            preferred_for=preferred_for,
            avoid_for=avoid_for,
            priority=priority,
            external_service=external_service,
            may_cost_money=may_cost_money,
            preferred_seed=preferred_seed,
            local_only=local_only,
        )
        if result is not None:
            points, reasons = result
            scored.append((rank_key(points, entry[ID], entry[DOMAIN], path), points, reasons, risks, gates))
    scored.sort(key=lambda item: item[0])
    selected, ask_policy = select([(key[1], points) for key, points, _reasons, _risks, _gates in scored])
    candidates = [
        render.candidate_json(key[1], key[2], key[3], points, reasons, risks, gates)
        for key, points, reasons, risks, gates in scored
    ]
    return render.search_result_json(
        root, capability, request.value("domain"), selected, ask_policy, candidates, ()
    )


def answer(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """What `cli.main(argv)` prints on stdout (without the final newline), or None (module docstring)."""
    request = parse(argv)
    if request is None or env.get(SERVER_ENV):
        return None
    root = spelled_store_root(env)
    if root is None or not is_normal(root):
        return None
    output: dict[str, Any] | None
    if request.command == "store":
        output = render.store_json(root)
    else:
        domain = request.value("domain")
        scope = vouched_scope(root, domain)
        if scope is None:
            return None
        if request.command == "list":
            output = _list(root, domain, scope)
        elif request.command == "inspect":
            assert request.positional is not None
            output = _inspect(root, request.positional, scope)
        else:
            output = _search(root, request, scope)
    if output is None:
        return None
    return cli_output.dumps(output, request.value("json-style") or cli_common.DEFAULT_JSON_STYLE)


def main() -> int:
    """The `seedstore` console command."""
    argv = sys.argv[1:]
    # One command, then the process exits: the cyclic collector would only scan the decoded
    # index again and again (cli.main pauses it the same way).
    collecting = gc.isenabled()
    gc.disable()
    try:
        text = answer(argv, os.environ)
    finally:
        if collecting:
            gc.enable()
    if text is None:
        from agentsidecar.seedstore_service.cli import main as full_main

        return full_main(argv)
    return cli_common.write_result(text + "\n")
