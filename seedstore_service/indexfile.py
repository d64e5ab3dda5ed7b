"""The persisted index's files: where they lie, what a section file holds, and when an entry is trusted.

The format and the trust rules are persisted.py's docstring's; this module holds
them on plain values (lists, tuples, ints), imports only what the interpreter
has at start-up plus `zlib`, `struct`, `operator` and json's C scanner and
escaper, and does no I/O but reading an index file: persisted.py writes and
refreshes the files through it, and the read commands that answer from them
(quickread.py) read them through it too.

A section file is a header line (format, version, store root, section, the number
of entries, the length and CRC-32 of each block of the body, and the keys of the
listing block), then the body: its blocks back to back, each checked when first used:

* the directory record,
  `[checked_ns, [[name, mtime_ns, ctime_ns, inode, device], ...], [domain, ...]]`;
* one JSON list per column (each position but the seed text, in order: that
  position's values, one per entry), `null` for those the signatures block holds;
* signatures: each entry's size, mtime_ns, ctime_ns, inode, device and checked_ns,
  packed by column as little-endian 64-bit integers (`SIGNATURE_POSITIONS`), so a
  reader compares a section's signatures with its files' as one string of bytes,
  then the least `checked_ns - max(mtime_ns, ctime_ns)` of the entries (none is racy
  when it exceeds `RACY_WINDOW_NS`); empty when there is no entry or a value does
  not fit (then the columns hold them);
* listing: every entry's `list` row as the CLI prints it (`list_row_text`), in
  `list` order (declared domain, id, path), joined by `LISTING_SEPARATOR`; the
  header names the (domain, id, name) of the first and the last row. Empty, and no
  keys, when an entry holds no seed;
* seeds: each entry's seed JSON text, one a line.
"""

from __future__ import annotations

import gc
import os
import stat
import zlib
from itertools import chain
from operator import attrgetter, itemgetter
from struct import error as StructError
from struct import pack, unpack_from

from agentsidecar.seedstore_service.names import is_identifier

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    Entry = list[Any]
    Signature = tuple[int, int, int, int, int]
    DirectorySignature = tuple[int, int, int, int]  # mtime_ns, ctime_ns, inode, device
    RawRecord = tuple[int, tuple[tuple[str, DirectorySignature], ...], tuple[str, ...]]

INDEX_DIR_NAME = ".seedstore-index"
FORMAT = "agentsidecar-seedstore-index"
VERSION = 5
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
# The positions packed in the signatures block, in order, and each one's struct code: the
# stat fields a signature compares, then checked_ns.
SIGNATURE_POSITIONS = ((SIZE, "q"), (MTIME, "q"), (CTIME, "q"), (INO, "Q"), (DEV, "Q"), (CHECKED, "q"))
_PACKED_POSITIONS = tuple(position for position, _code in SIGNATURE_POSITIONS)
# Where a stat result, as a tuple, holds a signature's size, inode and device; the nanosecond
# times are attributes only.
_INODE_FIELD, _DEVICE_FIELD, _SIZE_FIELD = 1, 2, 6
_mtime_ns = attrgetter("st_mtime_ns")
_ctime_ns = attrgetter("st_ctime_ns")
# The body's blocks, in order (the header's "blocks": [length, crc32] each): the directory
# record, one per column, then these three.
SIGNATURES_BLOCK = 1 + len(COLUMN_POSITIONS)
LISTING_BLOCK = SIGNATURES_BLOCK + 1
SEEDS_BLOCK = LISTING_BLOCK + 1
BLOCK_COUNT = SEEDS_BLOCK + 1


def _column_block(position: int) -> int:
    """The index of the block holding the column at `position`."""
    return 1 + COLUMN_POSITIONS.index(position)


# What separates two rows of the listing block, and what the CLI prints between two rows.
LISTING_SEPARATOR = ",\n"


def signature_of(stat_result: os.stat_result) -> Signature:
    return (
        stat_result.st_size,
        stat_result.st_mtime_ns,
        stat_result.st_ctime_ns,
        stat_result.st_ino,
        stat_result.st_dev,
    )


def pack_signatures(
    stats: list[os.stat_result], by_field: Sequence[Sequence[int]] | None = None
) -> bytes | None:
    """The signatures of these stat results packed as the signatures block packs an entry's
    (by column: sizes, mtime_ns, ctime_ns, inodes, devices); None when one does not fit.

    A stat result is a tuple of its integer fields (st_mode, st_ino, st_dev, st_nlink, st_uid,
    st_gid, st_size, then the times in whole seconds): `by_field`, when given, is those fields
    by column (`zip(*stats)`), which gives the size, inode and device columns; the nanosecond
    times only attributes hold.
    """
    if not stats:
        return pack_columns([[], [], [], [], []])
    if by_field is None:
        by_field = list(zip(*stats, strict=True))
    return pack_columns(
        [
            by_field[_SIZE_FIELD],
            list(map(_mtime_ns, stats)),
            list(map(_ctime_ns, stats)),
            by_field[_INODE_FIELD],
            by_field[_DEVICE_FIELD],
        ]
    )


def pack_columns(columns: Sequence[Sequence[int]]) -> bytes | None:
    """`pack_signatures` of the signatures given by column; None when one does not fit."""
    sizes, mtimes, ctimes, inodes, devices = columns
    try:
        return pack(_signatures_format(len(sizes), "qqqQQ"), *sizes, *mtimes, *ctimes, *inodes, *devices)
    except StructError:
        return None


def unpack_signatures(packed: bytes) -> list[list[int]]:
    """The columns `pack_signatures` packed: sizes, mtime_ns, ctime_ns, inodes, devices."""
    count = len(packed) // (8 * (len(SIGNATURE_POSITIONS) - 1))
    return [
        list(unpack_from(f"<{count}{code}", packed, 8 * k * count))
        for k, (_position, code) in enumerate(SIGNATURE_POSITIONS[:-1])
    ]


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


def _open_index_file(path: str) -> tuple[int, int] | None:
    """An index file opened for reading and its size; None (nothing left open) when it is
    missing, not a regular file, a link, or too large."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    try:
        stat_result = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    size = stat_result.st_size
    if not stat.S_ISREG(stat_result.st_mode) or size > MAX_INDEX_BYTES:
        os.close(fd)
        return None
    return fd, size


def read_index_file(path: str) -> bytes | None:
    """An index file's bytes; None when it is missing, not a regular file, a link, or too large."""
    opened = _open_index_file(path)
    if opened is None:
        return None
    fd, size = opened
    try:
        # The size it had when opened: a writer replaces an index file, never writes into it.
        chunks = []
        while size > 0:
            chunk = os.read(fd, size)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_index_file_into(path: str, buffer: bytearray) -> tuple[bytearray, int] | None:
    """`read_index_file`, into `buffer` (overwriting what it held) or, when the file does not fit,
    into a new bytearray: the one holding the bytes and their number, or None likewise.

    A reader of many files reads each into the same memory rather than into new memory each.
    """
    opened = _open_index_file(path)
    if opened is None:
        return None
    fd, size = opened
    try:
        if size > len(buffer):
            buffer = bytearray(size + size // 4)
        view = memoryview(buffer)
        done = 0
        while done < size:  # the size it had when opened (`read_index_file`)
            read = os.readv(fd, [view[done:size]])
            if not read:
                break
            done += read
        return buffer, done
    except OSError:
        return None
    finally:
        os.close(fd)


def _header(
    root: str,
    domain_dir: str | None,
    count: int,
    blocks: list[int],
    listing_keys: list[list[str]] | None,
) -> dict[str, Any]:
    """`blocks`: each block's length and CRC-32, in the body's order, one flat list."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "root": root,
        "section": domain_dir,
        "count": count,
        "blocks": blocks,
        "listing": listing_keys,
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


def loads(data: bytes | memoryview | str) -> Any:
    """One JSON value filling `data` (bytes are UTF-8), as `json.loads` reads it, surrounding
    whitespace refused (the index writes none).

    json's own C scanner, without importing the json package and the regular expressions its
    decoder compiles: the read commands decode index files in a process that needs nothing else
    of json. Raises ValueError for anything but one whole value.
    """
    text = data if isinstance(data, str) else str(data, "utf-8", "surrogatepass")
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

    By column, a block each: a reader decodes a few long lists instead of a list per
    entry, and only the columns it uses (`Section.column`); each block has a checksum
    of its own, so a reader checks only the blocks it uses.
    """
    rows = list(entries)
    signatures = _signatures_block(rows)
    packed = {position for position, _code in SIGNATURE_POSITIONS} if signatures else set()
    blocks = [_compact(_record_list(record))]
    blocks.extend(
        b"null" if position in packed else _compact([entry[position] for entry in rows])
        for position in COLUMN_POSITIONS
    )
    blocks.append(signatures)
    listing, listing_keys = _listing_block(root, domain_dir, rows)
    blocks.append(listing)
    blocks.append(b"\n".join(_seed_bytes(entry[SEED]) for entry in rows))
    lengths = [number for block in blocks for number in (len(block), zlib.crc32(block))]
    header = _header(root, domain_dir, len(rows), lengths, listing_keys)
    return _compact(header) + b"\n" + b"".join(blocks)


def _signatures_format(count: int, codes: str) -> str:
    return "<" + "".join(f"{count}{code}" for code in codes)


def _signatures_block(rows: list[Entry]) -> bytes:
    """The entries' signatures and checked_ns packed by column, then the least time between a
    file's last change and the read that made its entry (`is_racy`); empty when there is no entry
    or a value does not fit."""
    if not rows:
        return b""
    values = [entry[position] for position, _code in SIGNATURE_POSITIONS for entry in rows]
    codes = "".join(code for _position, code in SIGNATURE_POSITIONS)
    try:
        least = min(entry[CHECKED] - max(entry[MTIME], entry[CTIME]) for entry in rows)
        return pack(_signatures_format(len(rows), codes) + "q", *values, least)
    except (StructError, TypeError):  # a value out of range or no int: the columns hold them
        return b""


def list_row_text(
    seed_id: str,
    domain: str,
    kind: str,
    path: str,
    provides: list[str],
    status: str,
    risks: list[str],
    revision: str,
) -> str:
    """One row of `list` as the CLI prints it in the pretty style: `render.list_row_json`'s
    object as `cli_common.dumps` writes it, byte for byte (the tests compare the two)."""
    from _json import encode_basestring as encode

    return (
        "    {\n"
        f'      "id": {encode(seed_id)},\n'
        f'      "domain": {encode(domain)},\n'
        f'      "kind": {encode(kind)},\n'
        f'      "path": {encode(path)},\n'
        f'      "provides": {_strings_text(provides, encode)},\n'
        f'      "verification_status": {encode(status)},\n'
        f'      "risk": {_strings_text(risks, encode)},\n'
        f'      "revision": {encode(revision)}\n'
        "    }"
    )


def _strings_text(values: list[str], encode: Any) -> str:
    if not values:
        return "[]"
    return "[\n" + ",\n".join("        " + encode(value) for value in values) + "\n      ]"


def _listing_block(
    root: str, domain_dir: str | None, rows: list[Entry]
) -> tuple[bytes, list[list[str]] | None]:
    """The `list` rows of the entries in `list` order, with the (domain, id, name) of the first and
    the last; empty and None when there is no entry or one holds no seed."""
    if not rows or any(entry[ROW] is None or entry[PROBLEM] is not None for entry in rows):
        return b"", None
    return listing_of(
        section_prefix(root, domain_dir),
        [(entry[DOMAIN], entry[ID], entry[NAME], entry[ROW], entry[REVISION]) for entry in rows],
    )


def listing_of(
    prefix: str, seeds: list[tuple[str, str, str, list[Any], str]]
) -> tuple[bytes, list[list[str]]]:
    """The `list` rows of a section's seeds, each (domain, id, file name, list row, revision), in
    `list` order, and the (domain, id, file name) of the first and the last: a listing block.
    `seeds` is not empty."""
    ordered = sorted(seeds, key=lambda seed: (seed[0], seed[1], seed[2]))
    texts = []
    for domain, seed_id, name, row, revision in ordered:
        kind, provides, status, risks = row
        texts.append(list_row_text(seed_id, domain, kind, prefix + name, provides, status, risks, revision))
    keys = [[domain, seed_id, name] for domain, seed_id, name, _row, _revision in (ordered[0], ordered[-1])]
    return LISTING_SEPARATOR.join(texts).encode("utf-8", "surrogatepass"), keys


def _record_list(record: RawRecord) -> list[Any]:
    checked_ns, signatures, domains = record
    return [checked_ns, [[name, *signature] for name, signature in signatures], list(domains)]


def _seed_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("ascii")


def _decode_json(data: bytes | memoryview) -> Any:
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
    """A section file whose header, lengths, directory record and names were checked; its columns
    are decoded, and its other blocks checked, when first used (`column`, `seeds`,
    `signatures_hold`, `listing`)."""

    __slots__ = ("_blocks", "_columns", "_crcs", "_seeds", "_unchecked", "count", "listing_keys", "record")

    def __init__(
        self,
        record: RawRecord,
        count: int,
        blocks: list[bytes | memoryview],
        crcs: list[int | None],
        listing_keys: tuple[tuple[str, str, str], tuple[str, str, str]] | None,
    ) -> None:
        self.record = record
        self.count = count
        self.listing_keys = listing_keys
        self._blocks = blocks  # BLOCK_COUNT of them, in the body's order
        self._crcs = crcs  # each block's CRC-32 as written, None once checked
        self._seeds: list[bytes] | None = None
        self._columns: dict[int, list[Any]] = {}  # decoded and checked whole
        self._unchecked: dict[int, list[Any]] = {}  # decoded for `value`, each value checked alone

    def block(self, index: int) -> bytes | memoryview:
        """The block at `index` (the body's order).

        Raises:
            ValueError: its bytes are not the ones written (their checksum).
        """
        block = self._blocks[index]
        crc32 = self._crcs[index]
        if crc32 is not None:
            if zlib.crc32(block) != crc32:
                raise ValueError(f"block {index} of the section is not the one written")
            self._crcs[index] = None
        return block

    def column_block(self, position: int) -> bytes | memoryview:
        """The JSON text of the column at `position`, checked (see `block`)."""
        return self.block(_column_block(position))

    def column_holds_only(self, position: int, text: bytes) -> bool:
        """Whether the column at `position` is, as written, the JSON list of `count` values each
        written as `text` (b"null", b"[]", a JSON string...): a column of one repeated value
        checked without decoding it. False says nothing: the column may spell it otherwise.

        Raises:
            ValueError: the column's block is not the one written.
        """
        written = self.column_block(position)
        expected = b"[" + b",".join([text] * self.count) + b"]"
        return len(written) == len(expected) and bytes(written) == expected

    def count_of(self, position: int, value: str) -> int:
        """How many entries hold the string `value` at `position`.

        A value json writes as it is between quotes (no quote, backslash or control character)
        is counted in the column as written: in a JSON list an element is such a string
        exactly where its text stands between `[` or `,` and `,` or `]` (a quote inside a
        string is escaped, so none of those texts starts or ends inside one). Other values:
        the column is decoded.

        Raises:
            ValueError: the column is not the one written.
        """
        if position in self._columns or not value.isascii() or not value.isprintable():
            return self.column(position).count(value)
        if '"' in value or "\\" in value:
            return self.column(position).count(value)
        written = bytes(self.column_block(position))
        needle = b'"' + value.encode() + b'"'
        found = 0
        start = written.find(needle)
        while start >= 0:
            end = start + len(needle)
            if written[start - 1 : start] in (b"[", b",") and written[end : end + 1] in (b",", b"]"):
                found += 1
            start = written.find(needle, end)
        return found

    def names_are(self, names: list[str]) -> bool:
        """Whether the entries' names are `names`, in this order, compared as written (the names
        column is not decoded). False says nothing: the column may spell them otherwise.

        Raises:
            ValueError: the names' block is not the one written.
        """
        if NAME in self._columns:
            return self._columns[NAME] == names
        written = self.column_block(NAME)
        if len(names) != self.count:
            return False
        if not names:
            return bytes(written) == b"[]"
        # json writes a name without a quote or a backslash between quotes as it is (a control
        # character escaped, so a raw one is never in the column); a JSON text spells one list
        # only, so equal texts are equal lists. Other names: the column is decoded.
        text = '["' + '","'.join(names) + '"]'
        if text.count('"') != 2 * len(names) or "\\" in text:
            return False
        try:
            expected = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return False
        return len(written) == len(expected) and bytes(written) == expected

    def seeds(self) -> list[bytes]:
        """Each entry's seed JSON text (empty for a problem's), in entry order.

        Raises:
            ValueError: the texts are not the ones written (their checksum or their count).
        """
        if self._seeds is None:
            block = bytes(self.block(SEEDS_BLOCK))
            seeds = block.split(b"\n") if self.count else []
            if len(seeds) != self.count:
                raise ValueError("the seed texts are not one per entry")
            self._seeds = seeds
        return self._seeds

    def seeds_intact(self) -> bool:
        """Whether the seed texts are the ones written (their checksum, one per entry), without
        splitting them: a reader that checks this first never finds them damaged in `seeds`."""
        if self._seeds is not None:
            return True
        try:
            block = self.block(SEEDS_BLOCK)
        except ValueError:
            return False
        return not self.count or bytes(block).count(b"\n") + 1 == self.count

    def listing(self) -> bytes | None:
        """The listing block (module docstring), UTF-8 (lone surrogates as such, "surrogatepass"),
        or None when the section holds none.

        Raises:
            ValueError: its bytes are not the ones written.
        """
        if self.listing_keys is None:
            return None
        return bytes(self.block(LISTING_BLOCK))

    def signatures_hold(self, current: bytes, rows: list[int] | None) -> bool:
        """Whether the entry at each of `rows` (None: every entry, in order) has the signature at
        the same place in `current` (`pack_signatures` of the files' stat results) and is not
        racy (`is_racy`): persisted.py's trust test, for many files at once.

        Raises:
            ValueError: the signatures block or a column is not the one written.
        """
        block = self.block(SIGNATURES_BLOCK)
        count = self.count
        if block and len(block) != 8 * (len(SIGNATURE_POSITIONS) * count + 1):
            raise ValueError("the signatures block does not hold one signature per entry")
        if rows is None and block:
            if len(current) != 8 * (len(SIGNATURE_POSITIONS) - 1) * count:
                return False
            if not bytes(block).startswith(current):  # a memoryview compares byte by byte
                return False
            # The signatures are the entries': whether one is racy is the entries' own least time.
            (least,) = unpack_from("<q", block, len(block) - 8)
            return bool(least > RACY_WINDOW_NS)
        now = unpack_signatures(current)
        stored: list[Sequence[Any]]
        if block:
            stored = [
                unpack_from(f"<{count}{code}", block, 8 * k * count)
                for k, (_position, code) in enumerate(SIGNATURE_POSITIONS)
            ]
        else:
            stored = [self.column(position) for position, _code in SIGNATURE_POSITIONS]
        try:
            held = [
                list(column) if rows is None else list(map(column.__getitem__, rows)) for column in stored
            ]
        except IndexError:
            return False
        if held[:5] != now:
            return False
        try:
            return not any(map(is_racy, now[1], now[2], held[5]))
        except TypeError:
            raise ValueError("a checked_ns is not a number") from None

    def narrowed(self, positions: Iterable[int], *, seeds: bool = True, listing: bool = False) -> Section:
        """This section holding only the names, the columns at `positions`, and (as asked) the seed
        texts and the listing: what a reader keeps for later, in bytes of its own (not the
        file's), without the bytes of a column it has decoded already."""
        positions = tuple(positions)
        if not _SEED_ONLY_POSITIONS.isdisjoint(positions):
            positions = (*positions, PROBLEM)  # those columns are checked against it (`column`)
        kept = {_column_block(position) for position in (NAME, *positions)}
        if seeds:
            kept.add(SEEDS_BLOCK)
        if listing:
            kept.add(LISTING_BLOCK)
        if any(position in _PACKED_POSITIONS and position not in self._columns for position in positions):
            kept.add(SIGNATURES_BLOCK)  # those columns are read from it
        decoded = {_column_block(position) for position in self._columns if position in (NAME, *positions)}
        blocks: list[bytes | memoryview] = [
            bytes(block) if index in kept and index not in decoded else b""
            for index, block in enumerate(self._blocks)
        ]
        crcs = [
            crc32 if index in kept and index not in decoded else None
            for index, crc32 in enumerate(self._crcs)
        ]
        section = Section(self.record, self.count, blocks, crcs, self.listing_keys if listing else None)
        if seeds:
            section._seeds = self._seeds
        for position, values in self._columns.items():
            if _column_block(position) in kept:
                section._columns[position] = values
        return section

    def column(self, position: int, *, keep: bool = True) -> list[Any]:
        """The values at `position` of every entry, in entry order; without `keep`, a column not
        decoded yet is decoded for this caller only (the section keeps its bytes, not the values).

        Raises:
            ValueError: the column is not a JSON list of one value per entry (the file is
                not a whole index: the caller drops it, as `open_section` would have).
        """
        found = self._columns.get(position)
        if found is not None:
            return found
        if position == SEED:
            return self.seeds()
        if position in _PACKED_POSITIONS and self._blocks[SIGNATURES_BLOCK]:
            block = self.block(SIGNATURES_BLOCK)
            if len(block) != 8 * (len(SIGNATURE_POSITIONS) * self.count + 1):
                raise ValueError("the signatures block does not hold one signature per entry")
            k = _PACKED_POSITIONS.index(position)
            code = SIGNATURE_POSITIONS[k][1]
            values = list(unpack_from(f"<{self.count}{code}", block, 8 * k * self.count))
            self._columns[position] = values
            return values
        values = self._unchecked.pop(position) if position in self._unchecked else self._decoded(position)
        self._check(position, values)
        if keep:
            self._columns[position] = values
        return values

    def value(self, position: int, index: int) -> Any:
        """`column(position)[index]`, checked alone (as a column of one value) unless the column
        was checked whole: a reader that uses a few entries' values pays for those only.

        Raises:
            ValueError: as `column` does, for the column's block or for this value.
        """
        found = self._columns.get(position)
        if found is not None:
            return found[index]
        if position == SEED or position in _PACKED_POSITIONS:
            return self.column(position)[index]
        values = self._unchecked.get(position)
        if values is None:
            values = self._unchecked[position] = self._decoded(position)
        value = values[index]
        self._check(position, [value], index)
        return value

    def _decoded(self, position: int) -> list[Any]:
        try:
            values = _decode_json(self.column_block(position))
        except (TypeError, RecursionError) as error:
            raise ValueError(str(error)) from None
        if not isinstance(values, list) or len(values) != self.count:
            raise ValueError("a column does not hold one value per entry")
        return values

    def _problems_held(self) -> bool:
        return PROBLEM in self._columns or bool(self._blocks[_column_block(PROBLEM)])

    def _check(self, position: int, values: list[Any], index: int | None = None) -> None:
        """Raise ValueError unless `values` (the column at `position`, or its one value at
        `index`) are of the types the index writes there."""
        if not _COLUMN_CHECKS[position](values):
            raise ValueError(f"column {position} holds a value the index never writes")
        # Null exactly where the entry is a problem: no reader meets a seed without them.
        if position in _SEED_ONLY_POSITIONS and self._problems_held():
            problems = self.column(PROBLEM)
            if not _null_where_problems(values, problems if index is None else [problems[index]]):
                raise ValueError(f"column {position} is null for another entry than a problem")


def _of_types(values: Iterable[Any], *types: type) -> bool:
    return set(map(type, values)) <= set(types)


def _all_lists(values: list[Any], length: int | None = None) -> bool:
    """Whether every value is a list (of `length` items, when given)."""
    return _of_types(values, list) and (length is None or not values or set(map(len, values)) == {length})


def _string_lists(values: list[Any]) -> bool:
    return _all_lists(values) and _of_types(chain.from_iterable(values), str)


def _items(values: list[Any], *indexes: int) -> list[Any]:
    """The items at `indexes` of every value, one flat list."""
    if len(indexes) == 1:
        return list(map(itemgetter(indexes[0]), values))
    return list(chain.from_iterable(map(itemgetter(*indexes), values)))


def _line_reasons(values: list[Any]) -> bool:
    """[line, reason] pairs, as a note or a problem is written."""
    return _all_lists(values, 2) and _of_types(_items(values, 0), int) and _of_types(_items(values, 1), str)


def _non_null(values: list[Any]) -> list[Any]:
    return values if None not in values else [value for value in values if value is not None]


def _rows(values: list[Any]) -> bool:
    """`list` rows: [kind, provides, status, risks]."""
    rows = _non_null(values)
    return _all_lists(rows, 4) and _of_types(_items(rows, 0, 2), str) and _string_lists(_items(rows, 1, 3))


def _keys(values: list[Any]) -> bool:
    """Search keys: [provides, texts]."""
    keys = _non_null(values)
    return _all_lists(keys, 2) and _string_lists(list(chain.from_iterable(keys)))


def _ranks(values: list[Any]) -> bool:
    """Rank inputs: [preferred_for, avoid_for, priority, external_service, may_cost_money, risks, gates]."""
    ranks = _non_null(values)
    return (
        _all_lists(ranks, 7)
        and _string_lists(_items(ranks, 0, 1, 5, 6))
        and _of_types(_items(ranks, 2), int, type(None))
        and _of_types(_items(ranks, 3, 4), bool)
    )


def _null_where_problems(values: list[Any], problems: list[Any]) -> bool:
    """Whether `values` is null exactly where `problems` is not."""
    if None not in values:
        return problems.count(None) == len(problems)
    return [value is None for value in values] == [problem is not None for problem in problems]


def _signature_values(values: list[Any]) -> bool:
    return _of_types(values, int, type(None))


# What each column may hold: the types `persisted.entry_from_parts` writes, so that a reader never
# meets a value of another type, whoever wrote the file (a file with valid checksums and other
# values is treated as damaged).
_COLUMN_CHECKS: dict[int, Callable[[list[Any]], bool]] = {
    NAME: lambda values: _of_types(values, str),
    SIZE: _signature_values,
    MTIME: _signature_values,
    CTIME: _signature_values,
    INO: _signature_values,
    DEV: _signature_values,
    CHECKED: lambda values: _of_types(values, int),
    REVISION: lambda values: _of_types(values, str),
    ID: lambda values: _of_types(values, str, type(None)),
    DOMAIN: lambda values: _of_types(values, str),
    NOTES: lambda values: _all_lists(values) and _line_reasons(list(chain.from_iterable(values))),
    PROBLEM: lambda values: _line_reasons(_non_null(values)),
    DOMAIN_LINE: lambda values: _of_types(values, int),
    ROW: _rows,
    KEYS: _keys,
    RANK: _ranks,
}
# The columns a seed's entry holds a value in and a problem's entry holds null in.
_SEED_ONLY_POSITIONS = frozenset((ID, ROW, KEYS, RANK))


def _listing_keys_of(value: Any) -> tuple[tuple[str, str, str], tuple[str, str, str]] | None:
    """The header's first and last listed (domain, id, name).

    Raises:
        ValueError: the value is neither null nor two such triples.
    """
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2):
        raise ValueError("not a listing's keys")
    keys = []
    for key in value:
        if not (isinstance(key, list) and len(key) == 3 and all(isinstance(part, str) for part in key)):
            raise ValueError("not a listing's keys")
        keys.append((key[0], key[1], key[2]))
    return keys[0], keys[1]


def open_section(
    data: bytes | bytearray, root: str, domain_dir: str | None, length: int | None = None
) -> Section | None:
    """The section an index file holds (its bytes: `data`, or its first `length` bytes), or None
    when it is not a whole index of this section (truncated, foreign, corrupt, another version
    or another store's). The blocks but the directory record are checked when first used
    (`Section`); they are views of `data`."""
    size = len(data) if length is None else length
    end = data.find(b"\n", 0, size)
    if end < 0:
        return None
    try:
        header = loads(memoryview(data)[:end])
        if not isinstance(header, dict):
            return None
        count, lengths = header.get("count"), header.get("blocks")
        if not (
            type(count) is int
            and count >= 0
            and type(lengths) is list
            and len(lengths) == 2 * BLOCK_COUNT
            and set(map(type, lengths)) == {int}
            and min(lengths) >= 0
        ):
            return None
        if header != _header(root, domain_dir, count, lengths, header.get("listing")):
            return None
        listing_keys = _listing_keys_of(header["listing"])
        sizes = lengths[0::2]
        start = end + 1
        if start + sum(sizes) != size:
            return None
        view = memoryview(data)
        blocks: list[bytes | memoryview] = []
        for size in sizes:
            blocks.append(view[start : start + size])
            start += size
        section = Section(EMPTY_RECORD, count, blocks, lengths[1::2], listing_keys)
        record = _record_of(loads(section.block(0)))
    except (ValueError, TypeError, RecursionError):
        return None
    if record is None:
        return None
    section.record = record
    return section


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
