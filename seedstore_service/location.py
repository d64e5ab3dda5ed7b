"""Where the store is: SkillSpec's root, spelled as SkillSpec prints it, or a service instead.

Pure, and imports nothing: the read commands that answer from the persisted
index (quickread.py) find the store before anything else is imported.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


SERVER_ENV = "SEEDSTORE_SERVER"
"""The seedstore service the CLI goes through (`unix:PATH` or `HOST:PORT`) instead of the local files."""

TOKEN_FILE_ENV = "SEEDSTORE_TOKEN_FILE"
"""A file holding the bearer token to send with `SERVER_ENV`/`--server` (a seedstore run with
`--token-file` asks for one)."""


def rust_join(base: str, name: str) -> str:
    """Rust's PathBuf::push of a relative name: a separator only when `base` is non-empty
    and does not already end in one; nothing is normalised."""
    return base + name if not base or base.endswith("/") else f"{base}/{name}"


def spelled_store_root(env: Mapping[str, str]) -> str | None:
    """`$SKILLSPEC_HOME/capabilities`, else `$HOME/.skillspec/capabilities`, as SkillSpec prints it
    (the text as given, `a/./b//c` kept); None when neither variable is set."""
    skillspec_home = env.get("SKILLSPEC_HOME")
    if skillspec_home is not None:
        # An empty value yields the relative path "capabilities", as in SkillSpec.
        return rust_join(skillspec_home, "capabilities")
    home = env.get("HOME")
    if home is not None:
        return rust_join(rust_join(home, ".skillspec"), "capabilities")
    return None


def is_normal(path: str) -> bool:
    """True only when `str(pathlib.PurePosixPath(path)) == path` (the store works on pathlib
    paths, SkillSpec prints the text): no empty or `.` component, no trailing `/`, no `//` at
    the start. `.`, `/` and `//x`, normal as they are, are answered False."""
    if not path or path.startswith("//"):
        return False
    body = path[1:] if path.startswith("/") else path
    return all(part not in ("", ".") for part in body.split("/"))
