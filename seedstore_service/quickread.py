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
    CHECKED,
    CTIME,
    DEV,
    DOMAIN,
    ID,
    INO,
    KEYS,
    MTIME,
    NAME,
    NOTES,
    PROBLEM,
    RANK,
    REVISION,
    ROW,
    SIZE,
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

    # A section, its entries' positions by name, its path prefix, then by position: the
    # signatures, checked_ns, problem, notes and declared domain of its entries.
    _Held = tuple[
        indexfile.Section,
        dict[str, int],
        str,
        list[tuple[int, int, int, int, int]],
        list[int],
        list[Any],
        list[Any],
        list[str],
    ]


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


class _Scope:
    """The seed files of a scope (walk order) with where their entries lie: (path, section, position)."""

    __slots__ = ("files",)

    def __init__(self) -> None:
        self.files: list[tuple[str, indexfile.Section, int]] = []

    def values(self, position: int) -> list[Any]:
        """Each file's entry's value at `position`, in the files' order."""
        columns: dict[indexfile.Section, list[Any]] = {}
        values = []
        for _path, section, index in self.files:
            column = columns.get(section)
            if column is None:
                column = columns[section] = section.column(position)
            values.append(column[index])
        return values


def vouched_scope(root: str, domain: str | None) -> _Scope | None:
    """Every seed file of the scope with its entry, when the index vouches for each and none has a
    problem, a note or (with `domain`) another declared domain; else None.

    The trust test is persisted.py's: the entry's signature (`indexfile.signature_of`) is the
    file's now, and the entry is not racy (`indexfile.is_racy`).
    """
    refs, problems = walk(root, domain)
    if problems:
        return None
    index_directory = join_path(root, indexfile.INDEX_DIR_NAME)
    sections: dict[str | None, _Held] = {}
    scope = _Scope()
    try:
        for path, domain_dir in refs:
            held = sections.get(domain_dir)
            if held is None:
                opened = _open(root, index_directory, domain_dir)
                if opened is None:
                    return None
                held = sections[domain_dir] = opened
            section, positions, prefix, signatures, checked, problem, notes, domains = held
            index = positions.get(path[len(prefix) :] if path.startswith(prefix) else path)
            if index is None:
                return None
            signature = signatures[index]
            if signature != indexfile.signature_of(os.stat(path)):
                return None
            if indexfile.is_racy(signature[1], signature[2], checked[index]):
                return None
            if (
                problem[index] is not None
                or notes[index]
                or (domain is not None and domains[index] != domain)
            ):
                return None
            scope.files.append((path, section, index))
    except (OSError, ValueError):
        return None  # a file gone since the walk, or a column that is not one
    return scope


def _open(root: str, index_directory: str, domain_dir: str | None) -> _Held | None:
    """A section's index file with what the trust test reads of it, or None when it cannot be used.

    Raises:
        ValueError: a column is not one (see `indexfile.Section.column`).
    """
    data = indexfile.read_index_file(join_path(index_directory, indexfile.section_file_name(domain_dir)))
    section = None if data is None else indexfile.open_section(data, root, domain_dir)
    if section is None:
        return None
    column = section.column
    positions = {name: index for index, name in enumerate(column(NAME))}
    signatures = list(zip(column(SIZE), column(MTIME), column(CTIME), column(INO), column(DEV), strict=True))
    return (
        section,
        positions,
        indexfile.section_prefix(root, domain_dir),
        signatures,
        column(CHECKED),
        column(PROBLEM),
        column(NOTES),
        column(DOMAIN),
    )


def _list(root: str, domain: str | None, scope: _Scope) -> dict[str, Any]:
    ids, domains, rows_in, revisions = (scope.values(p) for p in (ID, DOMAIN, ROW, REVISION))
    paths = [path for path, _section, _index in scope.files]
    order = sorted(range(len(paths)), key=lambda k: (domains[k], ids[k], paths[k]))
    rows = []
    for k in order:
        kind, provides, status, risks = rows_in[k]
        rows.append(
            render.list_row_json(ids[k], domains[k], kind, paths[k], provides, status, risks, revisions[k])
        )
    return render.listing_json(root, domain, rows, ())


def _inspect(root: str, seed_id: str, scope: _Scope) -> dict[str, Any] | None:
    ids = scope.values(ID)
    matches = [k for k, value in enumerate(ids) if value == seed_id]
    if len(matches) != 1:
        return None  # not found or ambiguous: cli.py reports which
    path, section, index = scope.files[matches[0]]
    seed = indexfile.loads(section.seeds()[index])
    return render.inspect_json(root, path, section.column(REVISION)[index], seed, ())


def _search(root: str, request: _Request, scope: _Scope) -> dict[str, Any] | None:
    capability = request.positional
    assert capability is not None
    requested = canonical(capability)
    if not requested:
        return None
    preferred_seed = request.value("preferred-seed")
    local_only = request.options.get("local-only") is True
    scored = []
    for path, section, index in scope.files:
        provides, texts = section.column(KEYS)[index]
        if not could_match(provides, texts, requested):
            continue
        seed_id = section.column(ID)[index]
        rank = section.column(RANK)[index]
        preferred_for, avoid_for, priority, external_service, may_cost_money, risks, gates = rank
        result = score(
            requested,
            capability,
            seed_id=seed_id,
            status=section.column(ROW)[index][2],
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
            key = rank_key(points, seed_id, section.column(DOMAIN)[index], path)
            scored.append((key, points, reasons, risks, gates))
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
        try:
            if request.command == "list":
                output = _list(root, domain, scope)
            elif request.command == "inspect":
                assert request.positional is not None
                output = _inspect(root, request.positional, scope)
            else:
                output = _search(root, request, scope)
        except ValueError:
            return None  # a column or the seed texts of a section are not what was written
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
