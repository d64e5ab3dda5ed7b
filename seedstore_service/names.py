"""The text rules of seed names: which strings are identifiers, and SkillSpec's canonical form.

Pure, and imports nothing the interpreter has not loaded at start-up: the read
commands that answer from the persisted index (quickread.py) use these before
anything else is imported. seedtext.py builds its validation and re-exports on them.
"""

from __future__ import annotations

IDENTIFIER_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
# Ids and domains become file and directory names, and the store writes a seed
# through `.<id>.yaml.tmp-<12 hex digits>` (23 characters around the id): 200
# keeps that name under NAME_MAX (255 bytes; identifier characters are one byte
# each). SkillSpec has no limit; the same one applies to every identifier.
MAX_IDENTIFIER_LENGTH = 200

# A run of chars that are not ASCII letters or digits: one `_` in the canonical form.
_SEPARATORS = r"[^A-Za-z0-9]+"


def identifier_chars_ok(value: str) -> bool:
    """SkillSpec's path-traversal guard: not empty, no leading `.`, only `[a-z0-9_.-]`."""
    return bool(value) and not value.startswith(".") and IDENTIFIER_CHARS.issuperset(value)


def is_identifier(value: str) -> bool:
    """Whether `seedtext.validate_identifier` accepts `value` (the guard and the length limit)."""
    return identifier_chars_ok(value) and len(value) <= MAX_IDENTIFIER_LENGTH


def canonical(text: str) -> str:
    """SkillSpec's canonical form: `"Voice  Message!"` → `voice_message`, `"--"` → `""`.

    Every run of chars that are not ASCII alphanumeric becomes one `_`, leading and
    trailing ones are dropped, then ASCII is lowered. Lowering comes last: lowering
    first would turn some non-ASCII letters into ASCII ones (the Kelvin sign into `k`).
    An identifier (what the read commands are given) needs no regular expression: it is
    lower-case already and only `.`, `-` and `_` separate; `re` is imported for the rest.
    """
    if IDENTIFIER_CHARS.issuperset(text):
        return "_".join(part for part in text.replace(".", "_").replace("-", "_").split("_") if part)
    import re

    return re.sub(_SEPARATORS, "_", text).strip("_").lower()


def domain_mismatch_reason(path: str, stored_under: str, declared: str) -> str:
    """Why a seed file is out of its directory's scope: the reason its problem gives."""
    return f'seed {path} is stored under domain "{stored_under}" but declares domain "{declared}"'
