"""The persisted index's files: where they lie, what a section file holds, and when an entry is trusted.

The format and the trust rules are persisted.py's docstring's; this module holds
them on plain values (lists, tuples, ints), imports only what the interpreter
has at start-up plus `zlib` and json's C scanner, and does no I/O but reading an index
file: persisted.py writes and refreshes the files through it, and the read
commands that answer from them (quickread.py) read them through it too.

A section file is a header line (format, version, store root, section, the
body's length, the CRC-32 of the body up to the seed texts and that of the seed
texts), then the body: the directory record line
`[checked_ns, [[name, mtime_ns, ctime_ns, inode, device], ...], [domain, ...]]`,
one JSON line per column (each position but the seed text, in order: the list
of that position's values, one per entry), and each entry's seed JSON text on a
line of its own.
"""

from __future__ import annotations

import gc
import os
import stat
import zlib

from agentsidecar.seedstore_service.names import is_identifier

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    Entry = list[Any]
    Signature = tuple[int, int, int, int, int]
    DirectorySignature = tuple[int, int, int, int]  # mtime_ns, ctime_ns, inode, device
    RawRecord = tuple[int, tuple[tuple[str, DirectorySignature], ...], tuple[str, ...]]

INDEX_DIR_NAME = ".seedstore-index"
FORMAT = "agentsidecar-seedstore-index"
VERSION = 4
# A file modified this close to the read that made its entry is compared by content on every load.
RACY_WINDOW_NS = 2_000_000_000
ROOT_SECTION_FILE = "root.json"
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
# The most an index file may hold: a million seeds' entries, far beyond any store.
MAX_INDEX_BYTES = 1 << 30

# An entry, as stored (a JSON array; positions below):
# [name, size, mtime_ns, ctime_ns, ino, dev, checked_ns, revision,
#  seed id or null, declared domain, seed JSON text (ASCII bytes), notes [[line, reason], ...],
#  problem [line, reason] or null, domain_line, the `list` row [kind, provides, status, risks] or null,
#  the search keys [canonical provides, canonical texts] (ranking.match_keys) or null,
#  the rank inputs [canonical preferred_for, canonical avoid_for, default priority or null,
#  external_service, may_cost_money, risks (ranking.seed_risks), required gates (ranking.seed_gates)]
#  or null]
NAME, SIZE, MTIME, CTIME, INO, DEV, CHECKED, REVISION = range(8)
ID, DOMAIN, SEED, NOTES, PROBLEM, DOMAIN_LINE, ROW, KEYS, RANK = range(8, 17)
ENTRY_LENGTH = 17
# The positions stored as JSON columns: all but the seed text, which has a line of its own.
COLUMN_POSITIONS = tuple(position for position in range(ENTRY_LENGTH) if position != SEED)
EMPTY_RECORD: RawRecord = (0, (), ())


def signature_of(stat_result: os.stat_result) -> Signature:
    return (
        stat_result.st_size,
        stat_result.st_mtime_ns,
        stat_result.st_ctime_ns,
        stat_result.st_ino,
        stat_result.st_dev,
    )


def directory_signature_of(stat_result: os.stat_result) -> DirectorySignature:
    return (stat_result.st_mtime_ns, stat_result.st_ctime_ns, stat_result.st_ino, stat_result.st_dev)


def is_racy(mtime_ns: int, ctime_ns: int, checked_ns: int) -> bool:
    """Whether a file with these times changed within RACY_WINDOW_NS of the read at `checked_ns`."""
    return max(mtime_ns, ctime_ns) + RACY_WINDOW_NS >= checked_ns


def racy(entry: Entry) -> bool:
    """Whether the file changed within RACY_WINDOW_NS of the read that made the entry."""
    return is_racy(entry[MTIME], entry[CTIME], entry[CHECKED])


def record_settled(record: RawRecord) -> bool:
    """Whether no directory of the record changed within the racy window of its listing."""
    checked_ns, signatures, _domains = record
    return bool(signatures) and all(
        max(signature[0], signature[1]) + RACY_WINDOW_NS < checked_ns for _name, signature in signatures
    )


def record_current(record: RawRecord, base: str) -> bool:
    """Whether every directory under `base` (the section's directory) is as recorded, and settled."""
    if not record_settled(record):
        return False
    for name, signature in record[1]:
        try:
            found = os.stat(os.path.join(base, name) if name else base)
        except OSError:
            return False
        if directory_signature_of(found) != signature:
            return False
    return True


def section_directory(root: str, domain_dir: str | None) -> str:
    """The directory of a section, spelled as the walk spells it."""
    return root if domain_dir is None else os.path.join(root, domain_dir)


def section_prefix(root: str, domain_dir: str | None) -> str:
    """What a walk's path of a section's file starts with; the entry's name follows."""
    base = section_directory(root, domain_dir)
    return base.rstrip(os.sep) + os.sep if base != "." else ""


def name_in_section(root: str, path: str, domain_dir: str | None) -> str:
    """`path` (as the walk spells it) relative to its section's directory: the key of its entry."""
    prefix = section_prefix(root, domain_dir)
    return path[len(prefix) :] if path.startswith(prefix) else path


def section_file_name(domain_dir: str | None) -> str:
    """The index file of a section: `d-<name>.json` for an identifier, else a hash of the name."""
    if domain_dir is None:
        return ROOT_SECTION_FILE
    if is_identifier(domain_dir):
        return f"d-{domain_dir}.json"
    import hashlib

    digest = hashlib.sha256(domain_dir.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return f"h-{digest}.json"


def read_index_file(path: str) -> bytes | None:
    """An index file's bytes; None when it is missing, not a regular file, a link, or too large."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        with open(fd, "rb") as handle:
            stat_result = os.fstat(handle.fileno())
            if not stat.S_ISREG(stat_result.st_mode) or stat_result.st_size > MAX_INDEX_BYTES:
                return None
            return handle.read(MAX_INDEX_BYTES + 1)
    except OSError:
        return None


def _header(
    root: str, domain_dir: str | None, length: int, columns_crc32: int, seeds_crc32: int
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "root": root,
        "section": domain_dir,
        "length": length,
        "crc32": columns_crc32,
        "seeds_crc32": seeds_crc32,
    }


def _compact(value: Any) -> bytes:
    import json  # only writers encode

    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogateescape")


class _Strict:
    """The settings of json's scanner that `json.loads` uses by default, NaN and Infinity refused."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not a value the index writes")


def loads(data: bytes | str) -> Any:
    """One JSON value filling `data` (bytes are UTF-8), as `json.loads` reads it, surrounding
    whitespace refused (the index writes none).

    json's own C scanner, without importing the json package and the regular expressions its
    decoder compiles: the read commands decode index files in a process that needs nothing else
    of json. Raises ValueError for anything but one whole value.
    """
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else data
    try:
        from _json import make_scanner
    except ImportError:  # an interpreter without the C accelerator
        import json

        scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__, untyped
    else:
        # typeshed types the context as a scanner; any object with these attributes is one (its TODO).
        scan = make_scanner(_Strict)  # type: ignore[arg-type]
    try:
        value, end = scan(text, 0)
    except StopIteration:
        raise ValueError("not a JSON value") from None
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return value


def encode_section(
    root: str, domain_dir: str | None, entries: Iterable[Entry], record: RawRecord = EMPTY_RECORD
) -> bytes:
    """A section file (see the module docstring); an empty record vouches for nothing.

    By column, a line each: a reader decodes a few long lists instead of a list per
    entry, and only the columns it uses (`Section.column`). The seed texts (most of
    the bytes) come last, with a checksum of their own, so a reader that shows no
    seed neither checks nor splits them.
    """
    rows = list(entries)
    lines = [_compact(_record_list(record))]
    lines.extend(_compact([entry[position] for entry in rows]) for position in COLUMN_POSITIONS)
    columns = b"\n".join(lines)
    seeds = b"\n".join(_seed_bytes(entry[SEED]) for entry in rows)
    body = columns + b"\n" + seeds
    header = _header(root, domain_dir, len(body), zlib.crc32(columns), zlib.crc32(seeds))
    return _compact(header) + b"\n" + body


def _record_list(record: RawRecord) -> list[Any]:
    checked_ns, signatures, domains = record
    return [checked_ns, [[name, *signature] for name, signature in signatures], list(domains)]


def _seed_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("ascii")


def _decode_json(data: bytes) -> Any:
    """`loads`, with the cyclic collector paused: a section makes many lists, none cyclic."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return loads(data)
    finally:
        if collecting:
            gc.enable()


def section_of_file(data: bytes) -> tuple[bool, str | None]:
    """(whether the header names a section, which one): the section an index file says it holds."""
    head, newline, _body = data.partition(b"\n")
    try:
        header = loads(head) if newline else None
    except (ValueError, TypeError, RecursionError):
        header = None
    if not isinstance(header, dict) or "section" not in header:
        return False, None
    section = header["section"]
    return isinstance(section, str | None), section if isinstance(section, str) else None


def _record_of(meta: Any) -> RawRecord | None:
    if not isinstance(meta, list) or len(meta) != 3:
        return None
    checked_ns, listed, domains = meta
    if not isinstance(checked_ns, int) or not isinstance(listed, list) or not isinstance(domains, list):
        return None
    signatures: list[tuple[str, DirectorySignature]] = []
    for item in listed:
        if not (
            isinstance(item, list)
            and len(item) == 5
            and isinstance(item[0], str)
            and all(isinstance(number, int) for number in item[1:])
        ):
            return None
        signatures.append((item[0], (item[1], item[2], item[3], item[4])))
    if not all(isinstance(name, str) for name in domains):
        return None
    return checked_ns, tuple(signatures), tuple(domains)


class Section:
    """A section file whose header, length, checksum and directory record were checked; its columns
    are decoded when first asked for (`column`), its seed texts split and checked when first
    asked for (`seeds`)."""

    __slots__ = ("_columns", "_lines", "_seeds", "_seeds_block", "_seeds_crc32", "count", "record")

    def __init__(
        self, record: RawRecord, lines: list[bytes], names: list[str], seeds_block: bytes, seeds_crc32: int
    ) -> None:
        self.record = record
        self.count = len(names)
        self._lines = lines  # one JSON list per position of COLUMN_POSITIONS
        self._seeds_block = seeds_block
        self._seeds_crc32 = seeds_crc32
        self._seeds: list[bytes] | None = None
        self._columns: dict[int, list[Any]] = {NAME: names}

    def seeds(self) -> list[bytes]:
        """Each entry's seed JSON text (empty for a problem's), in entry order.

        Raises:
            ValueError: the texts are not the ones written (their checksum or their count).
        """
        if self._seeds is None:
            if zlib.crc32(self._seeds_block) != self._seeds_crc32:
                raise ValueError("the seed texts are not the ones written")
            seeds = self._seeds_block.split(b"\n") if self.count else []
            if len(seeds) != self.count:
                raise ValueError("the seed texts are not one per entry")
            self._seeds = seeds
        return self._seeds

    def seeds_intact(self) -> bool:
        """Whether the seed texts are the ones written (their checksum, one per entry), without
        splitting them: a reader that checks this first never finds them damaged in `seeds`."""
        if self._seeds is not None:
            return True
        block = self._seeds_block
        if zlib.crc32(block) != self._seeds_crc32:
            return False
        return not self.count or block.count(b"\n") + 1 == self.count

    def narrowed(self, positions: Iterable[int]) -> Section:
        """This section holding only the columns at `positions` (and the names and seed texts):
        what a reader keeps for later, without the bytes of the columns it has already taken."""
        kept = frozenset(positions)
        lines = [
            line if position in kept else b""
            for position, line in zip(COLUMN_POSITIONS, self._lines, strict=True)
        ]
        section = Section(self.record, lines, self._columns[NAME], self._seeds_block, self._seeds_crc32)
        section._seeds = self._seeds
        for position, values in self._columns.items():
            if position in kept:
                section._columns[position] = values
        return section

    def column(self, position: int) -> list[Any]:
        """The values at `position` of every entry, in entry order.

        Raises:
            ValueError: the column is not a JSON list of one value per entry (the file is
                not a whole index: the caller drops it, as `open_section` would have).
        """
        found = self._columns.get(position)
        if found is not None:
            return found
        if position == SEED:
            return self.seeds()
        try:
            values = _decode_json(self._lines[COLUMN_POSITIONS.index(position)])
        except (TypeError, RecursionError) as error:
            raise ValueError(str(error)) from None
        if not isinstance(values, list) or len(values) != self.count:
            raise ValueError("a column does not hold one value per entry")
        self._columns[position] = values
        return values


def open_section(data: bytes, root: str, domain_dir: str | None) -> Section | None:
    """The section an index file holds, or None when it is not a whole index of this section
    (truncated, foreign, corrupt, another version or another store's). The seed texts are
    checked when first used (`Section.seeds`)."""
    head, newline, body = data.partition(b"\n")
    if not newline:
        return None
    parts = body.split(b"\n", 1 + len(COLUMN_POSITIONS))
    if len(parts) != 2 + len(COLUMN_POSITIONS):
        return None
    seeds_block = parts.pop()
    columns = body[: len(body) - len(seeds_block) - 1]
    try:
        header = loads(head)
        seeds_crc32 = header.get("seeds_crc32") if isinstance(header, dict) else None
        if not isinstance(seeds_crc32, int):
            return None
        if header != _header(root, domain_dir, len(body), zlib.crc32(columns), seeds_crc32):
            return None
        record = _record_of(loads(parts[0]))
        if record is None:
            return None
        names = _decode_json(parts[1 + COLUMN_POSITIONS.index(NAME)])
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        return None
    return Section(record, parts[1:], names, seeds_block, seeds_crc32)


def decode_section(
    data: bytes, root: str, domain_dir: str | None
) -> tuple[dict[str, Entry], RawRecord] | None:
    """The entries of an index file by name and its directory record, or None when it is not a
    whole index of this section (truncated, foreign, corrupt, another version or another store's)."""
    section = open_section(data, root, domain_dir)
    if section is None:
        return None
    try:
        columns = [section.column(position) for position in range(ENTRY_LENGTH)]
    except ValueError:
        return None
    return {entry[NAME]: entry for entry in map(list, zip(*columns, strict=True))}, section.record
