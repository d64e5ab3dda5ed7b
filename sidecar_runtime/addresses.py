"""Listen and dial addresses: `unix:PATH`, `unix:///PATH` or `HOST:PORT`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed address. `unix_path` is set for Unix sockets."""

    target: str  # what grpc wants
    unix_path: Path | None = None

    @property
    def is_unix(self) -> bool:
        return self.unix_path is not None


def parse_address(text: str) -> Address:
    """Parse `unix:relative`, `unix:/abs`, `unix:///abs` or `HOST:PORT`.

    Raises:
        ValueError: the address is neither form.
    """
    if text.startswith("unix://"):
        path = text[len("unix://") :]
        if not path.startswith("/"):
            raise ValueError(f"unix:// addresses need an absolute path: {text!r}")
        return Address(target=f"unix:{path}", unix_path=Path(path))
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise ValueError(f"empty unix socket path: {text!r}")
        return Address(target=f"unix:{path}", unix_path=Path(path))
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address must be unix:PATH or HOST:PORT, got {text!r}")
    return Address(target=text)
