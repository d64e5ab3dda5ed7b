"""Values derived from immutable objects, kept per object identity.

On the call path the same objects recur call after call as the very same
objects (convert shares one CallOptions per distinct encoding, judge one
Decision per judgement), and what is derived from them (their problems, a
decision's proto or log line, an adapter's verdict) is a pure function of
them. Identity is then a far cheaper key than equality, which would hash
every field. An entry holds its key objects, so no other object can take
their id()s while it lives: an id match is the same object. Bounded: past
`max_entries` each new entry drops the oldest (a dict keeps insertion
order), so freeing what the cache held is spread over the calls that bring
new entries; emptying a full cache at once would free it all within one
call (compiled validators among it), that call paying for every other.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

_Value = TypeVar("_Value")
_Default = TypeVar("_Default")


class IdentityCache(Generic[_Value]):
    __slots__ = ("_entries", "_max_entries")

    def __init__(self, max_entries: int) -> None:
        self._max_entries = max_entries
        self._entries: dict[tuple[Hashable, ...], tuple[tuple[object, ...], _Value]] = {}

    def get(self, objects: tuple[object, ...], extra: Hashable, default: _Default) -> _Value | _Default:
        """The value kept for these very objects (and `extra`, compared by equality), else `default`."""
        entry = self._entries.get(_key(objects, extra))
        return default if entry is None else entry[1]

    def put(self, objects: tuple[object, ...], extra: Hashable, value: _Value) -> None:
        entries = self._entries
        if len(entries) >= self._max_entries:
            del entries[next(iter(entries))]
        entries[_key(objects, extra)] = (objects, value)

    def __len__(self) -> int:
        return len(self._entries)


def _key(objects: tuple[object, ...], extra: Hashable) -> tuple[Hashable, ...]:
    """`extra` and the objects' ids, one flat tuple; spelled out for the counts the caches use."""
    count = len(objects)
    if count == 1:
        return (extra, id(objects[0]))
    if count == 2:
        return (extra, id(objects[0]), id(objects[1]))
    if count == 0:
        return (extra,)
    return (extra, *map(id, objects))
