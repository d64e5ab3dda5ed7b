"""`seedstore`'s entry point: the read commands answered from the persisted index, else cli.py.

Agents run `seedstore search CAP --domain D --json` and its kin one process per
call, so a read's cost is mostly the interpreter starting and the modules it
imports. `run` prints the output of `store`, `list`, `inspect` and `search`
importing only modules that import nothing the interpreter has not loaded at
start-up (walk, indexfile, names, scoring, location, render, cli_output and
cli_common; cli_output only for an output not written from the listing blocks or
with warnings; the error tree and its status table only for an unknown or ambiguous
id), or
returns None, and then `main` offers the command line to `remote_read` (a
`--server` read in the same plain forms) and else hands it to `cli.main`,
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
* a file that does not parse, (with `--domain`) a seed there declaring another domain,
  and a seed's notes are reported as cli.py reports them, in the answer's `problems`
  (sorted by path) and as `warning:` lines on stderr before it;
* `inspect` prints the seed of the one file holding the id, or cli.py's failure from
  the status table: SeedNotFound when none does (unless a file that does not parse is
  named after the id), AmbiguousSeed with the paths of those that do, sorted, when
  several do; `search`'s capability has a canonical form.

Nothing here writes: when an entry is missing or stale, cli.py reads the file and
saves the entry, and the next call answers from it.
"""

from __future__ import annotations

import gc
import os
import sys
from operator import itemgetter

from agentsidecar.seedstore_service import indexfile, render
from agentsidecar.seedstore_service.indexfile import (
    DOMAIN,
    DOMAIN_LINE,
    ID,
    KEYS,
    NAME,
    NOTES,
    PROBLEM,
    RANK,
    REVISION,
    ROW,
)
from agentsidecar.seedstore_service.location import SERVER_ENV, is_normal, spelled_store_root
from agentsidecar.seedstore_service.names import canonical, domain_mismatch_reason, is_identifier
from agentsidecar.seedstore_service.scoring import could_match, rank_key, score, select
from agentsidecar.seedstore_service.walk import file_stem, join_path, walk_stats
from agentsidecar.sidecar_runtime import cli_common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TextIO

    from agentsidecar.seedstore_service.model import ProblemLike

_first = itemgetter(0)


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


class _Vouched:
    """A section of the scope whose entries vouch for the walk's files in it (`vouched_sections`)."""

    __slots__ = ("broken", "complete", "names", "prefix", "problems", "rows", "section")

    def __init__(
        self,
        section: indexfile.Section,
        prefix: str,
        names: list[str],
        rows: list[int] | None,
        problems: list[_Problem],
        broken: list[str],
    ) -> None:
        self.section = section
        self.prefix = prefix  # a file's path is the prefix and its name
        self.names = names  # the names of the section's files that hold a seed in scope, sorted
        # Each file's entry (`rows`; None: the files are the entries, in order).
        self.rows: Sequence[int] = rows if rows is not None else range(section.count)
        self.complete = rows is None or len(rows) == section.count  # every entry is one of the files'
        self.problems = problems  # what the section's files report, in the files' order
        self.broken = broken  # the names of its files that hold no seed in scope (they report why)


class _Problem:
    """A problem a file reports (`model.Problem`'s fields, which render and the warnings read)."""

    __slots__ = ("line", "path", "reason")

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason


def problems_of(vouched: list[_Vouched]) -> list[_Problem]:
    """The scope's problems as a load assembles them (`persisted.assemble_problems`): sorted by
    path, each file's in its own order."""
    problems = [problem for held in vouched for problem in held.problems]
    problems.sort(key=_path_of)
    return problems


def _path_of(problem: _Problem) -> str:
    return problem.path


def vouched_sections(
    root: str, domain: str | None, narrow: Callable[[indexfile.Section], indexfile.Section]
) -> list[_Vouched] | None:
    """The sections holding the seed files of the scope, when each file has an entry that vouches
    for it; else None. A section keeps the names and rows of its files that hold a seed in
    scope, and what its files report (`_in_scope`).

    The walk finds what every load finds (`walk.walk_stats`); the trust test is persisted.py's, made for a
    section at once (`indexfile.Section.signatures_hold`): each entry's signature is its
    file's now (stat taken after the walk listed the file), and the entry is not racy.
    `narrow` gives what the command keeps of a section once it vouches (`Section.narrowed`),
    so that the file's bytes are let go before the next is read.
    """
    stated = walk_stats(root, domain, indexfile.pack_signatures)
    if stated is None:
        return None
    index_directory = join_path(root, indexfile.INDEX_DIR_NAME)
    vouched = []
    # Every section file is read into this one buffer: each section is narrowed (its blocks
    # copied out) before the next file is read over it.
    buffer = bytearray()
    try:
        for domain_dir, parts in stated:
            names, current = _joined(parts)
            if current is None:
                return None  # a signature no entry could hold
            prefix = indexfile.section_prefix(root, domain_dir)
            if join_path(root if domain_dir is None else join_path(root, domain_dir), "") != prefix:
                return None  # the walk spells the section's paths otherwise: no entry names them
            file_name = indexfile.section_file_name(domain_dir)
            read = indexfile.read_index_file_into(join_path(index_directory, file_name), buffer)
            if read is None:
                return None
            buffer, length = read
            section = indexfile.open_section(buffer, root, domain_dir, length)
            if section is None:
                return None
            # Entries and a directory's files are sorted by name: when the files (of one directory)
            # are the entries, the names are equal.
            rows: list[int] | None = None
            if not section.names_are(names):
                positions = dict(zip(section.column(NAME), range(section.count), strict=True))
                found = list(map(positions.get, names))
                if None in found:
                    return None  # a file without an entry
                rows = found  # type: ignore[assignment]  # no None among them
            if not section.signatures_hold(current, rows):
                return None
            vouched.append(
                _Vouched(narrow(section), prefix, *_in_scope(section, prefix, names, rows, domain))
            )
    except (OSError, ValueError):
        return None  # a file gone since the walk, or a block or column that is not one
    return vouched


def _joined(parts: list[tuple[list[str], bytes | None]]) -> tuple[list[str], bytes | None]:
    """A section's files' names and packed signatures from those of the directories holding them."""
    if len(parts) == 1:
        return parts[0]
    names: list[str] = []
    columns: list[list[int]] = [[] for _field in range(5)]
    for part_names, packed in parts:
        if packed is None:
            return names, None
        names.extend(part_names)
        for column, values in zip(columns, indexfile.unpack_signatures(packed), strict=True):
            column.extend(values)
    return names, indexfile.pack_columns(columns)


def _clean(section: indexfile.Section, rows: list[int] | None, domain: str | None) -> bool:
    """Whether no entry at `rows` (None: every entry; else each at most once) has a problem or a
    note and, with `domain`, each declares it.

    Raises:
        ValueError: a column is not one.
    """
    if rows is None or len(rows) == section.count:  # every entry: the columns as a whole
        if not (section.column_holds_only(PROBLEM, b"null") or _all_none(section.column(PROBLEM))):
            return False
        if not (section.column_holds_only(NOTES, b"[]") or not any(section.column(NOTES))):
            return False
        if domain is None:
            return True
        text = cli_common.encode_string(domain).encode()  # an identifier: ASCII
        return (
            section.column_holds_only(DOMAIN, text) or section.column(DOMAIN).count(domain) == section.count
        )
    problem, notes = section.column(PROBLEM), section.column(NOTES)
    domains = section.column(DOMAIN) if domain is not None else None
    return all(
        problem[row] is None and not notes[row] and (domains is None or domains[row] == domain)
        for row in rows
    )


def _in_scope(
    section: indexfile.Section, prefix: str, names: list[str], rows: list[int] | None, domain: str | None
) -> tuple[list[str], list[int] | None, list[_Problem], list[str]]:
    """The names and rows of the files that hold a seed in scope, what the files report, and the
    names of those that hold none, as `persisted.IndexedFile.problems` and `in_scope` say: a file
    that does not parse reports its problem, (with `domain`) a seed declaring another domain the
    mismatch, and neither is in scope; a seed in scope reports its notes.

    Raises:
        ValueError: a column is not one.
    """
    if _clean(section, rows, domain):
        return names, rows, [], []
    problem_of, notes_of = section.column(PROBLEM), section.column(NOTES)
    # With `domain`: each seed's declared domain, and the line that declares it.
    domains, lines = (section.column(DOMAIN), section.column(DOMAIN_LINE)) if domain is not None else ([], [])
    kept_names: list[str] = []
    kept_rows: list[int] = []
    problems: list[_Problem] = []
    held_none: list[str] = []
    for name, row in zip(names, range(section.count) if rows is None else rows, strict=True):
        problem = problem_of[row]
        if problem is not None:
            problems.append(_Problem(prefix + name, problem[0], problem[1]))
            held_none.append(name)
            continue
        if domain is not None and domains[row] != domain:
            path = prefix + name
            problems.append(_Problem(path, lines[row], domain_mismatch_reason(path, domain, domains[row])))
            held_none.append(name)
            continue
        problems.extend(_Problem(prefix + name, line, reason) for line, reason in notes_of[row])
        kept_names.append(name)
        kept_rows.append(row)
    return kept_names, kept_rows, problems, held_none


def _all_none(values: list[Any]) -> bool:
    return values.count(None) == len(values)


class _Scope:
    """The seed files of a scope with where their entries lie: (path, section, position), in no
    particular order (every answer sorts by a key that ends in the path)."""

    __slots__ = ("files",)

    def __init__(self, vouched: list[_Vouched]) -> None:
        self.files: list[tuple[str, indexfile.Section, int]] = []
        for held in vouched:
            prefix, section = held.prefix, held.section
            self.files.extend(
                (prefix + name, section, row) for name, row in zip(held.names, held.rows, strict=True)
            )

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


_SEEDS_LINE = '\n  "seeds": []'
_ROWS_START = '\n  "seeds": [\n'
_ROWS_END = "\n  ]"


class _Listing:
    """A pretty `list` output: the text before the rows, each section's rows (UTF-8, lone
    surrogates as such), the text after, without the final newline."""

    __slots__ = ("head", "parts", "tail")

    def __init__(self, head: str, parts: list[bytes], tail: str) -> None:
        self.head = head
        self.parts = parts
        self.tail = tail

    def text(self) -> str:
        rows = indexfile.LISTING_SEPARATOR.encode().join(self.parts).decode("utf-8", "surrogatepass")
        return f"{self.head}{_ROWS_START}{rows}{_ROWS_END}{self.tail}"

    def chunks(self) -> list[bytes] | None:
        """The output and its final newline as ASCII bytes, or None when it holds anything else."""
        if not (self.head.isascii() and self.tail.isascii() and all(part.isascii() for part in self.parts)):
            return None
        separator = indexfile.LISTING_SEPARATOR.encode()
        chunks = [(self.head + _ROWS_START).encode()]
        for part in self.parts:
            chunks.extend((part, separator))
        chunks[-1] = (_ROWS_END + self.tail + "\n").encode()
        return chunks


def _listed(
    root: str, domain: str | None, vouched: list[_Vouched], problems: Sequence[ProblemLike]
) -> _Listing | None:
    """The pretty `list` output from the sections' listing blocks, a section's rows written from
    its columns where its block does not list exactly its files' seeds (some of its files hold
    none, or it has entries for files the walk did not find); None when the sections' rows
    interleave.

    Raises:
        ValueError: a listing block or a column is not the one written.
    """
    spans = []
    for held in vouched:
        section = held.section
        keys: Sequence[Sequence[str]] | None = section.listing_keys
        if keys is not None and held.complete:
            block = section.listing() or b""
        elif held.names:
            # Some of the section's files hold no seed (they report a problem): its rows are
            # written from its columns, as the index writes a listing block.
            domains, ids, rows, revisions = (section.column(p) for p in (DOMAIN, ID, ROW, REVISION))
            block, keys = indexfile.listing_of(
                held.prefix,
                [
                    (domains[r], ids[r], name, rows[r], revisions[r])
                    for name, r in zip(held.names, held.rows, strict=True)
                ],
            )
        else:
            continue  # no seed in the section
        (first_domain, first_id, first_name), (last_domain, last_id, last_name) = keys
        first = (first_domain, first_id, held.prefix + first_name)
        last = (last_domain, last_id, held.prefix + last_name)
        spans.append((first, last, block))
    if not spans:
        return None
    spans.sort(key=_first)
    for k in range(1, len(spans)):
        if not spans[k - 1][1] < spans[k][0]:
            return None  # the sections' rows interleave: `_list` sorts them
    empty = render.listing_json(root, domain, [], problems)
    head, found, tail = cli_common.pretty(empty).partition(_SEEDS_LINE)
    if not found:
        return None
    return _Listing(head, [block for _first_key, _last, block in spans], tail)


def _list(root: str, domain: str | None, scope: _Scope, problems: Sequence[ProblemLike]) -> dict[str, Any]:
    ids, domains, rows_in, revisions = (scope.values(p) for p in (ID, DOMAIN, ROW, REVISION))
    paths = [path for path, _section, _index in scope.files]
    order = sorted(range(len(paths)), key=lambda k: (domains[k], ids[k], paths[k]))
    rows = []
    for k in order:
        kind, provides, status, risks = rows_in[k]
        rows.append(
            render.list_row_json(ids[k], domains[k], kind, paths[k], provides, status, risks, revisions[k])
        )
    return render.listing_json(root, domain, rows, problems)


class _Failure:
    """The failure cli.py prints for `inspect`'s id: SeedNotFound when no seed in scope holds it
    and no file that holds none is named after it (which cli.py would report instead); with
    `paths`, AmbiguousSeed: the seeds of those files hold it (sorted, as a scope's seeds are)."""

    __slots__ = ("paths", "seed_id")

    def __init__(self, seed_id: str, paths: list[str] | None = None) -> None:
        self.seed_id = seed_id
        self.paths = paths


def _inspect(
    root: str, seed_id: str, vouched: list[_Vouched], problems: Sequence[ProblemLike]
) -> dict[str, Any] | _Failure | None:
    found: tuple[_Vouched, int] | None = None
    for held in vouched:
        section = held.section
        if held.complete:
            if not section.count_of(ID, seed_id):
                continue  # counted as written: the column need not be decoded
            ids = section.column(ID)
            hits = ids.count(seed_id)
            rows = [ids.index(seed_id)] if hits == 1 else list(range(hits))  # past one: ambiguous
        else:
            ids = section.column(ID)
            rows = [row for row in held.rows if ids[row] == seed_id]
        for row in rows:
            if found is not None:
                return _ambiguous(seed_id, vouched)
            found = (held, row)
    if found is None:
        if any(file_stem(name) == seed_id for held in vouched for name in held.broken):
            return None  # a file that holds no seed in scope may be this one: cli.py reports it
        # An absence is reported only from checked ids: the counts above read the column as
        # written, which a forged column could make miss the seed.
        for held in vouched:
            ids = held.section.column(ID)
            if any(ids[row] == seed_id for row in held.rows):
                return None
        return _Failure(seed_id)
    held, row = found
    section = held.section
    path = held.prefix + held.names[held.rows.index(row)]
    seed = indexfile.loads(section.seeds()[row])
    return render.inspect_json(root, path, section.column(REVISION)[row], seed, problems)


def _ambiguous(seed_id: str, vouched: list[_Vouched]) -> _Failure | None:
    """AmbiguousSeed for the files of the scope whose seeds hold `seed_id`, found from checked
    ids (the counts that found a second one read columns as written); None if fewer than two."""
    paths: list[str] = []
    for held in vouched:
        ids = held.section.column(ID)
        paths.extend(
            held.prefix + name for name, row in zip(held.names, held.rows, strict=True) if ids[row] == seed_id
        )
    if len(paths) < 2:
        return None
    paths.sort()
    return _Failure(seed_id, paths)


def _search(
    root: str, request: _Request, scope: _Scope, problems: Sequence[ProblemLike]
) -> dict[str, Any] | None:
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
        # Only the candidates' values are decoded checked (`Section.value`).
        seed_id = section.value(ID, index)
        rank = section.value(RANK, index)
        preferred_for, avoid_for, priority, external_service, may_cost_money, risks, gates = rank
        result = score(
            requested,
            capability,
            seed_id=seed_id,
            status=section.value(ROW, index)[2],
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
            key = rank_key(points, seed_id, section.value(DOMAIN, index), path)
            scored.append((key, points, reasons, risks, gates))
    scored.sort(key=lambda item: item[0])
    selected, ask_policy = select([(key[1], points) for key, points, _reasons, _risks, _gates in scored])
    candidates = [
        render.candidate_json(key[1], key[2], key[3], points, reasons, risks, gates)
        for key, points, reasons, risks, gates in scored
    ]
    return render.search_result_json(
        root, capability, request.value("domain"), selected, ask_policy, candidates, problems
    )


def run(argv: Sequence[str], env: Mapping[str, str], stdout: TextIO, stderr: TextIO) -> int | None:
    """Print what `cli.main(argv)` prints, as it prints it, and return its exit code; None when
    cli.py has to run (module docstring)."""
    answered = _answer(argv, env)
    if answered is None:
        return None
    try:
        return _print(answered, stdout, stderr)
    except BrokenPipeError:  # a warning or the error lines, as cli.main handles it
        return cli_common.reader_gone(stdout)


def _print(
    answered: tuple[str | _Listing, Sequence[ProblemLike]] | _Failure, stdout: TextIO, stderr: TextIO
) -> int:
    if isinstance(answered, _Failure):
        # The errors and their status table are imported only now: no answer needs them.
        from agentsidecar.seedstore_service.cli_output import local_error_object
        from agentsidecar.seedstore_service.errors import AmbiguousSeed, SeedNotFound

        paths = answered.paths
        error = SeedNotFound(answered.seed_id) if paths is None else AmbiguousSeed(answered.seed_id, paths)
        cli_common.print_error(error.message, local_error_object(error, error.message), stderr)
        return cli_common.EXIT_FAILED
    output, problems = answered
    if problems:
        from agentsidecar.seedstore_service.cli_output import print_warnings

        print_warnings(problems, stderr)
    if isinstance(output, _Listing):
        written = _write_listing(output, stdout)
        if written is not None:
            return written
        output = output.text()
    return cli_common.write_result(output + "\n", stdout)


def _answer(
    argv: Sequence[str], env: Mapping[str, str]
) -> tuple[str | _Listing, Sequence[ProblemLike]] | _Failure | None:
    request = parse(argv)
    if request is None or env.get(SERVER_ENV):
        return None
    root = spelled_store_root(env)
    if root is None or not is_normal(root):
        return None
    style = request.value("json-style") or cli_common.DEFAULT_JSON_STYLE
    output: dict[str, Any] | _Failure | None
    problems: Sequence[ProblemLike] = ()
    if request.command == "store":
        output = render.store_json(root)
    else:
        domain = request.value("domain")
        try:
            if request.command == "list":
                vouched = vouched_sections(root, domain, _kept_for_list)
                if vouched is None:
                    return None
                problems = problems_of(vouched)
                listed = _listed(root, domain, vouched, problems) if style == "pretty" else None
                if listed is not None:
                    return listed, problems
                output = _list(root, domain, _Scope(vouched), problems)
            elif request.command == "inspect":
                seed_id = request.positional
                assert seed_id is not None

                def kept_for_inspect(section: indexfile.Section) -> indexfile.Section:
                    return section.narrowed((ID, REVISION), seeds=section.count_of(ID, seed_id) > 0)

                vouched = vouched_sections(root, domain, kept_for_inspect)
                if vouched is None:
                    return None
                problems = problems_of(vouched)
                output = _inspect(root, seed_id, vouched, problems)
            else:
                vouched = vouched_sections(root, domain, _kept_for_search)
                if vouched is None:
                    return None
                problems = problems_of(vouched)
                output = _search(root, request, _Scope(vouched), problems)
        except ValueError:
            return None  # a column or a block of a section is not what was written
    if output is None or isinstance(output, _Failure):
        return output
    # Imported here: a pretty `list` written from the listing blocks needs none of it.
    from agentsidecar.seedstore_service import cli_output

    return cli_output.dumps(output, style), problems


def _kept_for_list(section: indexfile.Section) -> indexfile.Section:
    return section.narrowed((ID, DOMAIN, ROW, REVISION), seeds=False, listing=True)


def _kept_for_search(section: indexfile.Section) -> indexfile.Section:
    return section.narrowed((KEYS, ID, RANK, ROW, DOMAIN), seeds=False)


def main() -> int:
    """The `seedstore` command's exit code, once it has printed what it prints."""
    argv = sys.argv[1:]
    code = _answered(argv)
    return _full_cli(argv) if code is None else code


def console() -> int:
    """The `seedstore` console script: `main`, but a command answered here or by `remote_read`
    ends the process as soon as its output is flushed (`os._exit`), without the interpreter's
    teardown: freeing every module and object one by one is work no one waits for. cli.main's
    commands exit as usual (their locks, temporary files and handlers close at exit)."""
    argv = sys.argv[1:]
    code = _answered(argv)
    if code is None:
        return _full_cli(argv)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        code = cli_common.reader_gone(sys.stdout)
    os._exit(code)


def _full_cli(argv: list[str]) -> int:
    from agentsidecar.seedstore_service.cli import main as full_main

    return full_main(argv)


def _answered(argv: list[str]) -> int | None:
    """The exit code of a command answered here, else by `remote_read`; None: cli.py answers."""
    # One command, then the process exits: the cyclic collector would only scan the decoded
    # index, or the service's reply, again and again (cli.main pauses it the same way).
    collecting = gc.isenabled()
    gc.disable()
    try:
        code = run(argv, os.environ, sys.stdout, sys.stderr)
        if code is None:
            from agentsidecar.seedstore_service.remote_read import answer as answer_remote

            code = answer_remote(argv, os.environ, sys.stdout, sys.stderr)
    finally:
        if collecting:
            gc.enable()
    return code


def _write_listing(listing: _Listing, stream: TextIO) -> int | None:
    """Write a listing's bytes to stdout's buffer, as `cli_common.write_result` writes its text
    (then flush; a reader gone is exit 1); None when the bytes could differ from the text's:
    stdout is no UTF-8 text stream on a binary one, or translates newlines, or the output holds
    more than ASCII."""
    buffer = getattr(stream, "buffer", None)
    encoding = str(getattr(stream, "encoding", "")).lower().replace("_", "-")
    if buffer is None or encoding not in ("utf-8", "utf8") or os.linesep != "\n":
        return None
    chunks = listing.chunks()
    if chunks is None:
        return None
    try:
        stream.flush()
        for chunk in chunks:
            buffer.write(chunk)
        buffer.flush()
    except BrokenPipeError:
        return cli_common.reader_gone(stream)
    return cli_common.EXIT_OK
