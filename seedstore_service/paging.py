"""ListSeeds pages (AIP-158) and the bounds every reply keeps: pure, values in, values out.

A listing is one ordered sequence: the seeds sorted by (domain, id, path),
then the problems sorted by (path, line, reason). A page is a slice of it cut
by count (`page_size`) and by size (the bytes its items take as protos), so a
reply always fits the message limit whatever the seeds hold. The page token
is the position after the page's last item, written as that item's sort key:
a seed added or removed between two pages neither repeats an item nor skips one
that stayed. The token also names the request it continues (the domain); a
token that does not decode, or was issued for another request, is refused.
Tokens are not signed: any token that decodes is only a position in the
listing, so a forged one can do no more than a valid one.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from agentsidecar.seedstore_service.errors import InvalidArgument
from agentsidecar.seedstore_service.model import ListedSeed, Problem

DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000
# The most candidates a SearchSeeds reply holds (the best ones).
MAX_SEARCH_CANDIDATES = 1000
# The problems a reply about one seed (Inspect, Update, Prefer, Remove) carries:
# the first ones by path, within this many and this many bytes; ListSeeds pages all of them.
MAX_REPLY_PROBLEMS = 100
MAX_REPLY_PROBLEM_BYTES = 256 * 1024
# What a reply leaves of the message limit for everything but its repeated items.
REPLY_HEADROOM_BYTES = 64 * 1024
# A repeated field's item costs its tag and length prefix besides its own bytes.
_ITEM_OVERHEAD_BYTES = 6

_TOKEN_VERSION = 1
_BAD_TOKEN = "page_token is not a token this service issued for this request; start again without one"

SeedKey = tuple[str, str, str]  # (domain, id, path)
ProblemKey = tuple[str, int, str]  # (path, line, reason)


def seed_key(entry: ListedSeed) -> SeedKey:
    return (entry.domain, entry.id, entry.path)


def problem_key(problem: Problem) -> ProblemKey:
    return (problem.path, problem.line, problem.reason)


@dataclass(frozen=True)
class Position:
    """Where the next page starts: after `seed` (seeds left), or after `problem` (only problems left)."""

    seed: SeedKey | None = None
    problem: ProblemKey | None = None


@dataclass(frozen=True)
class Page:
    entries: tuple[ListedSeed, ...]
    problems: tuple[Problem, ...]
    next_page_token: str  # "" on the last page


def effective_page_size(page_size: int) -> int:
    """AIP-158: 0 is the default, a value over the maximum is the maximum; a negative one is refused."""
    if page_size < 0:
        raise InvalidArgument("page_size must not be negative", "page_size")
    if page_size == 0:
        return DEFAULT_PAGE_SIZE
    return min(page_size, MAX_PAGE_SIZE)


def encode_token(domain: str | None, position: Position) -> str:
    body: dict[str, Any] = {"v": _TOKEN_VERSION, "d": domain}
    if position.problem is not None:
        body["p"] = list(position.problem)
    elif position.seed is not None:
        body["s"] = list(position.seed)
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=True)
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def decode_token(token: str, domain: str | None) -> Position:
    """The position `token` names.

    Raises InvalidArgument (field page_token) unless this service issued it for `domain`.
    """
    if not token:
        return Position()
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw.decode("ascii"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise InvalidArgument(_BAD_TOKEN, "page_token") from None
    if not isinstance(body, dict) or body.get("v") != _TOKEN_VERSION or body.get("d", ...) != domain:
        raise InvalidArgument(_BAD_TOKEN, "page_token")
    seed, problem = body.get("s"), body.get("p")
    if (seed is None) == (problem is None):
        raise InvalidArgument(_BAD_TOKEN, "page_token")
    if seed is not None:
        if not (isinstance(seed, list) and len(seed) == 3 and all(isinstance(part, str) for part in seed)):
            raise InvalidArgument(_BAD_TOKEN, "page_token")
        return Position(seed=(seed[0], seed[1], seed[2]))
    if not (
        isinstance(problem, list)
        and len(problem) == 3
        and isinstance(problem[0], str)
        and type(problem[1]) is int
        and isinstance(problem[2], str)
    ):
        raise InvalidArgument(_BAD_TOKEN, "page_token")
    return Position(problem=(problem[0], problem[1], problem[2]))


def page_of(
    entries: Sequence[ListedSeed],
    problems: Sequence[Problem],
    *,
    domain: str | None,
    page_size: int,
    page_token: str,
    max_bytes: int,
    entry_bytes: Callable[[ListedSeed], int],
    problem_bytes: Callable[[Problem], int],
) -> Page:
    """The page of the listing (`entries` sorted by `seed_key`, `problems` by `problem_key`)
    that `page_token` asks for.

    At most `page_size` items (see `effective_page_size`) whose sizes sum to at
    most `max_bytes`; a page always holds at least one item when any are left.
    Only the page's items are sized, so a page costs its own items, not the listing's.
    """
    limit = effective_page_size(page_size)
    position = decode_token(page_token, domain)
    seeds, broken = entries, problems
    if position.problem is not None:
        seed_start = len(seeds)
        problem_start = bisect.bisect_right(broken, position.problem, key=problem_key)
    else:
        seed_start = 0 if position.seed is None else bisect.bisect_right(seeds, position.seed, key=seed_key)
        problem_start = 0
    budget = _Budget(limit, max_bytes)
    page_seeds = budget.take(seeds, seed_start, entry_bytes)
    page_problems: list[Problem] = []
    if seed_start + len(page_seeds) == len(seeds):
        page_problems = budget.take(broken, problem_start, problem_bytes)
    more_seeds = seed_start + len(page_seeds) < len(seeds)
    more_problems = problem_start + len(page_problems) < len(broken)
    token = ""
    if more_seeds:
        token = encode_token(domain, Position(seed=seed_key(page_seeds[-1])))
    elif more_problems:
        if page_problems:
            token = encode_token(domain, Position(problem=problem_key(page_problems[-1])))
        elif page_seeds:
            token = encode_token(domain, Position(seed=seed_key(page_seeds[-1])))
    return Page(tuple(page_seeds), tuple(page_problems), token)


_Item = TypeVar("_Item")


class _Budget:
    """Counts items and bytes across the seeds and then the problems of one page."""

    def __init__(self, count: int, max_bytes: int) -> None:
        self.count = count
        self.bytes = max_bytes
        self.taken = 0

    def take(self, items: Sequence[_Item], start: int, size: Callable[[_Item], int]) -> list[_Item]:
        taken: list[_Item] = []
        for index in range(start, len(items)):
            item = items[index]
            if self.count <= 0:
                break
            cost = size(item) + _ITEM_OVERHEAD_BYTES
            if cost > self.bytes and self.taken:
                self.count = 0  # full: nothing more fits on this page
                break
            taken.append(item)
            self.taken += 1
            self.count -= 1
            self.bytes -= cost
        return taken


def bounded_prefix(
    items: Sequence[_Item], max_count: int, max_bytes: int, size: Callable[[_Item], int]
) -> int:
    """How many leading `items` fit in `max_count` items and `max_bytes` bytes (at least one if any)."""
    budget = _Budget(max_count, max_bytes)
    return len(budget.take(items, 0, size))


def reply_problems(problems: Sequence[Problem]) -> Sequence[Problem]:
    """The problems a reply about one seed carries (MAX_REPLY_PROBLEMS, MAX_REPLY_PROBLEM_BYTES)."""

    def size(problem: Problem) -> int:
        return len(problem.path.encode()) + len(problem.reason.encode()) + 8

    count = bounded_prefix(problems, MAX_REPLY_PROBLEMS, MAX_REPLY_PROBLEM_BYTES, size)
    return problems[:count]
