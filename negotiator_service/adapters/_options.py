"""Strict reading of an adapter's `options` mapping from the config file.

Every problem is a ConfigError naming the adapter, the config file and the
option path, so a config author can find the line. Unknown keys are refused:
a misspelt option silently ignored is a setting that silently does nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NoReturn

from agentsidecar.negotiator_service.errors import ConfigError
from agentsidecar.negotiator_service.model import AdapterSpec, JsonValue


class OptionReader:
    """Reads one options mapping (or a nested one), remembering which keys it used."""

    def __init__(self, spec: AdapterSpec, options: object, path: str = "options") -> None:
        self._spec = spec
        self._path = path
        if not isinstance(options, Mapping):
            self.fail(path, f"must be a mapping, not {type_name(options)}")
        self._options: Mapping[str, JsonValue] = options
        self._used: set[str] = set()

    def fail(self, option: str, problem: str) -> NoReturn:
        self._raise(f"{self._spec.implementation} option `{option}`: {problem}")

    def _raise(self, text: str) -> NoReturn:
        where = f" ({self._spec.source_path})" if self._spec.source_path else ""
        raise ConfigError(f'adapter "{self._spec.shortname}"{where}, {text}')

    def path(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path != "options" else key

    def has(self, key: str) -> bool:
        return key in self._options

    def keys(self) -> list[str]:
        return [str(key) for key in self._options]

    def raw(self, key: str) -> JsonValue:
        self._used.add(key)
        return self._options.get(key)

    def nested(self, key: str) -> OptionReader:
        return self.child(self.raw(key), self.path(key))

    def child(self, value: object, path: str) -> OptionReader:
        """A reader for a value found inside these options (a list item, say)."""
        return OptionReader(self._spec, value, path)

    def string(self, key: str, *, required: bool = False, default: str | None = None) -> str | None:
        value = self.raw(key)
        if value is None:
            if required:
                self.fail(self.path(key), "is required")
            return default
        if not isinstance(value, str) or not value.strip():
            self.fail(self.path(key), f"must be a non-empty string, not {type_name(value)}")
        return value

    def required_string(self, key: str) -> str:
        value = self.string(key, required=True)
        assert value is not None  # string(required=True) fails instead of returning None
        return value

    def positive_number(self, key: str, default: float | None) -> float | None:
        value = self.raw(key)
        if value is None:
            return default
        if not is_number(value) or not math.isfinite(value) or value <= 0:
            self.fail(self.path(key), f"must be a positive number, not {value!r}")
        return float(value)

    def non_negative_number(self, key: str, default: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if not is_number(value) or not math.isfinite(value) or value < 0:
            self.fail(self.path(key), f"must be a number >= 0, not {value!r}")
        return float(value)

    def positive_int(self, key: str, default: int) -> int:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            self.fail(self.path(key), f"must be a positive integer, not {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(self.path(key), f"must be true or false, not {value!r}")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self.raw(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(self.path(key), f"must be a mapping of strings, not {type_name(value)}")
        for name, item in value.items():
            if not isinstance(name, str) or not name or not isinstance(item, str):
                self.fail(f"{self.path(key)}.{name}", f"must map a non-empty name to a string, not {item!r}")
        return dict(value)

    def finish(self) -> None:
        """Refuse every key nobody asked for."""
        unknown = sorted(str(key) for key in self._options if key not in self._used)
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            named = ", ".join(f"`{self.path(key)}`" for key in unknown)
            self._raise(f"unknown {self._spec.implementation} option{plural} {named}")


def is_number(value: object) -> bool:
    # bool is an int subclass; `true` is not a number of seconds.
    return isinstance(value, int | float) and not isinstance(value, bool)


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__
