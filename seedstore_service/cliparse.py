"""A command-line parser that accepts and refuses what clap 4 (SkillSpec's parser) does.

Pure: argument lists in, parsed values or a `UsageError` out. argparse differs
from clap where scripts notice: it accepts abbreviated long flags, lets a
repeated single-valued flag win silently, reads `--kind -1` as a value and `-1`
as a negative number, and its `int` accepts `5_0` and ` 5`. The rules here are
clap_builder 4.6's (`parser/parser.rs`, `error/format.rs`):

* A long flag matches only by its full name; `--name=VALUE` attaches a value,
  which may be empty or start with `-` (`--command=--` is the value `--`).
* A single-valued option or a switch given twice is an error; a repeatable one appends.
* After an option that awaits its value, a token starting with `-` (other than
  `-` alone) is a new flag, not the value; `--` ends the flags.
* Values are parsed when met (Rust's `u8` parse for priorities, `true`/`false`
  for booleans), so the first bad token decides the error; then conflicts, then
  missing required arguments.

Error texts are clap's, with `seedstore <command>` as the usage prefix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Command",
    "HelpRequested",
    "Opt",
    "Positional",
    "UsageError",
    "parse_bool",
    "parse_command",
    "parse_u8",
]

ValueParser = Callable[[str], Any]
"""Turns a raw value into the parsed one; raises ValueError(reason) to refuse it."""

_TAB = "  "
_RUST_INTEGER = re.compile(r"[+-]?[0-9]*")


class UsageError(Exception):
    """A command line clap would refuse (exit 2). `text` is everything printed, ending in a newline."""

    def __init__(self, message: str, *, tips: Sequence[str] = (), usage: str | None = None) -> None:
        parts = [f"error: {message}"]
        if tips:
            parts.append("\n" + "".join(f"\n{_TAB}tip: {tip}" for tip in tips))
        if usage is not None:
            parts.append(f"\n\n{usage}")
        parts.append("\n\nFor more information, try '--help'.\n")
        self.message = message
        self.text = "".join(parts)
        super().__init__(message)


class HelpRequested(Exception):
    """`-h` or `--help`: `text` is the help to print on stdout (exit 0)."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__("help requested")


def parse_u8(text: str) -> int:
    """clap's `value_parser!(u8)`: Rust's i64 parse (ASCII digits, one optional sign), then 0..=255."""
    if text == "":
        raise ValueError("cannot parse integer from empty string")
    if _RUST_INTEGER.fullmatch(text) is None or text in ("+", "-"):
        raise ValueError("invalid digit found in string")
    value = int(text, 10)
    if value > 2**63 - 1:
        raise ValueError("number too large to fit in target type")
    if value < -(2**63):
        raise ValueError("number too small to fit in target type")
    if not 0 <= value <= 255:
        raise ValueError(f"{value} is not in 0..=255")
    return value


BOOL_VALUES = ("true", "false")


def parse_bool(text: str) -> bool:
    """clap's `bool` value parser: exactly `true` or `false` (checked by `Opt.choices`)."""
    return text == "true"


# Plain classes with slots: the CLI builds its tables at every start, and they need
# nothing a dataclass adds.


class Opt:
    """A long option: a switch when `value_name` is None, else one value (or many with `multiple`)."""

    __slots__ = ("choices", "conflicts_with", "help", "long", "multiple", "parser", "required", "value_name")

    def __init__(
        self,
        long: str,
        help: str,
        value_name: str | None = None,
        *,
        multiple: bool = False,
        required: bool = False,
        parser: ValueParser | None = None,
        choices: tuple[str, ...] = (),
        conflicts_with: tuple[str, ...] = (),  # other options' `long` names
    ) -> None:
        self.long = long
        self.help = help
        self.value_name = value_name
        self.multiple = multiple
        self.required = required
        self.parser = parser
        self.choices = choices
        self.conflicts_with = conflicts_with

    @property
    def dest(self) -> str:
        return self.long.replace("-", "_")

    @property
    def display(self) -> str:
        """How clap names the argument in messages: `--domain <DOMAIN>`, `--json`."""
        return f"--{self.long}" if self.value_name is None else f"--{self.long} <{self.value_name}>"


class Positional:
    __slots__ = ("dest", "help", "multiple", "name", "required")

    def __init__(
        self, name: str, dest: str, help: str, *, required: bool = True, multiple: bool = False
    ) -> None:
        self.name = name  # value name, shown as <NAME>
        self.dest = dest
        self.help = help
        self.required = required
        self.multiple = multiple

    @property
    def display(self) -> str:
        return f"<{self.name}>..." if self.multiple else f"<{self.name}>"


class Command:
    __slots__ = ("_by_long", "about", "after_help", "name", "options", "positionals")

    def __init__(
        self,
        name: str,
        about: str,
        options: tuple[Opt, ...] = (),
        positionals: tuple[Positional, ...] = (),
        after_help: str = "",
    ) -> None:
        self.name = name
        self.about = about
        self.options = options
        self.positionals = positionals
        self.after_help = after_help
        self._by_long = {option.long: option for option in options}

    def option(self, long: str) -> Opt | None:
        return self._by_long.get(long)

    def usage(self, prog: str) -> str:
        # `-h, --help` is always an option, so clap always shows [OPTIONS].
        words = [f"Usage: {prog} {self.name}", "[OPTIONS]"]
        words.extend(option.display for option in self.options if option.required)
        for positional in self.positionals:
            words.append(positional.display if positional.required else f"[{positional.name}]...")
        return " ".join(words)

    def help_text(self, prog: str) -> str:
        lines = [self.about, "", self.usage(prog)]
        rows: list[tuple[str, str]] = [
            (positional.display, positional.help) for positional in self.positionals
        ]
        if rows:
            lines += ["", "Arguments:"]
            width = max(len(left) for left, _ in rows)
            lines += [f"  {left.ljust(width)}  {text}".rstrip() for left, text in rows]
        option_rows = [(f"    {option.display}", _option_help(option)) for option in self.options]
        option_rows.append(("-h, --help", "Print help"))
        width = max(len(left) for left, _ in option_rows)
        lines += ["", "Options:"]
        lines += [f"  {left.ljust(width)}  {text}".rstrip() for left, text in option_rows]
        if self.after_help:
            lines += ["", self.after_help]
        return "\n".join(lines) + "\n"


def _option_help(option: Opt) -> str:
    text = option.help
    if option.choices:
        text += f" [possible values: {', '.join(option.choices)}]"
    return text


def jaro(left: str, right: str) -> float:
    """Jaro similarity, the measure clap's "a similar argument exists" tip uses (threshold 0.7)."""
    if not left and not right:
        return 1.0
    if not left or not right:
        return 0.0
    window = max(max(len(left), len(right)) // 2 - 1, 0)
    right_used = [False] * len(right)
    left_matches: list[str] = []
    for index, char in enumerate(left):
        for other in range(max(0, index - window), min(len(right), index + window + 1)):
            if not right_used[other] and right[other] == char:
                right_used[other] = True
                left_matches.append(char)
                break
    matches = len(left_matches)
    if matches == 0:
        return 0.0
    right_matches = [char for char, used in zip(right, right_used, strict=True) if used]
    transpositions = sum(a != b for a, b in zip(left_matches, right_matches, strict=True)) // 2
    return (matches / len(left) + matches / len(right) + (matches - transpositions) / matches) / 3


def similar(word: str, candidates: Sequence[str]) -> str | None:
    """The most similar candidate above clap's threshold (the last of equals, as clap picks)."""
    best: tuple[float, str] | None = None
    for candidate in candidates:
        score = jaro(word, candidate)
        if score > 0.7 and (best is None or score >= best[0]):
            best = (score, candidate)
    return best[1] if best is not None else None


def _is_flag_like(token: str) -> bool:
    return token.startswith("-") and token != "-"


def parse_command(command: Command, argv: Sequence[str], prog: str) -> dict[str, Any]:
    """Parse the arguments after the subcommand name, as clap would.

    Returns every option's and positional's `dest`: switches False/True, single
    options None or the parsed value, repeatable ones and multiple positionals a list.

    Raises:
        UsageError: what clap refuses, with its message.
        HelpRequested: `-h` / `--help` met before any error.
    """
    usage = command.usage(prog)
    values: dict[str, Any] = {}
    for option in command.options:
        values[option.dest] = [] if option.multiple else (False if option.value_name is None else None)
    for positional in command.positionals:
        values[positional.dest] = [] if positional.multiple else None
    seen: list[Opt] = []
    pending: Opt | None = None
    positional_index = 0
    trailing = False

    def set_value(option: Opt, raw: str) -> None:
        if option.choices and raw not in option.choices:
            if raw == "":
                message = f"a value is required for '{option.display}' but none was supplied"
            else:
                message = f"invalid value '{raw}' for '{option.display}'"
            message += f"\n{_TAB}[possible values: {', '.join(option.choices)}]"
            tip = similar(raw, option.choices)
            tips = [f"a similar value exists: '{tip}'"] if tip and raw else []
            raise UsageError(message, tips=tips)
        value: Any = raw
        if option.parser is not None:
            try:
                value = option.parser(raw)
            except ValueError as error:
                raise UsageError(f"invalid value '{raw}' for '{option.display}': {error}") from None
        if option.multiple:
            values[option.dest].append(value)
        else:
            values[option.dest] = value

    def occur(option: Opt) -> None:
        if not option.multiple and option in seen:
            raise UsageError(f"the argument '{option.display}' cannot be used multiple times", usage=usage)
        seen.append(option)

    def value_missing(option: Opt) -> UsageError:
        message = f"a value is required for '{option.display}' but none was supplied"
        if option.choices:
            message += f"\n{_TAB}[possible values: {', '.join(option.choices)}]"
        return UsageError(message)

    def positional_value(token: str) -> None:
        nonlocal positional_index
        if positional_index >= len(command.positionals):
            raise UsageError(f"unexpected argument '{token}' found", usage=usage)
        positional = command.positionals[positional_index]
        if positional.multiple:
            values[positional.dest].append(token)
        else:
            values[positional.dest] = token
            positional_index += 1

    for token in argv:
        if trailing:
            positional_value(token)
            continue
        if token == "--":
            if pending is not None:
                raise value_missing(pending)
            trailing = True
            continue
        if pending is not None and not _is_flag_like(token):
            set_value(pending, token)
            pending = None
            continue
        if token.startswith("--"):
            name, equals, attached = token[2:].partition("=")
            known = command.option(name)
            if pending is not None and (known is not None or name == "help"):
                raise value_missing(pending)
            if known is None and name == "help":
                if equals:
                    message = f"unexpected value '{attached}' for '--help' found; no more were expected"
                    raise UsageError(message, usage=usage)
                raise HelpRequested(command.help_text(prog))
            if known is None:
                tip = similar(name, [candidate.long for candidate in command.options])
                tips = [f"a similar argument exists: '--{tip}'"] if tip is not None else []
                if not tips and command.positionals:
                    tips = [f"to pass '{token}' as a value, use '-- {token}'"]
                raise UsageError(f"unexpected argument '--{name}' found", tips=tips, usage=usage)
            option = known
            occur(option)
            if option.value_name is None:
                if equals:
                    message = (
                        f"unexpected value '{attached}' for '{option.display}' found; no more were expected"
                    )
                    raise UsageError(message, usage=usage)
                values[option.dest] = True
            elif equals:
                set_value(option, attached)
            else:
                pending = option
            continue
        if _is_flag_like(token):
            flag = token[1]
            if flag == "h" and pending is not None:
                raise value_missing(pending)
            if flag == "h":
                raise HelpRequested(command.help_text(prog))
            shown = f"-{flag}"
            tips = [f"to pass '{shown}' as a value, use '-- {shown}'"] if command.positionals else []
            raise UsageError(f"unexpected argument '{shown}' found", tips=tips, usage=usage)
        positional_value(token)
    if pending is not None:
        raise value_missing(pending)

    for option in seen:
        for other_long in option.conflicts_with:
            other = command.option(other_long)
            if other is not None and other in seen:
                # clap checks the arguments in the order they were given.
                first, second = (option, other) if seen.index(option) < seen.index(other) else (other, option)
                raise UsageError(
                    f"the argument '{first.display}' cannot be used with '{second.display}'", usage=usage
                )
    missing = [option.display for option in command.options if option.required and option not in seen]
    missing += [
        positional.display
        for positional in command.positionals
        if positional.required and not values[positional.dest]
    ]
    if missing:
        listed = "".join(f"\n{_TAB}{item}" for item in missing)
        raise UsageError(f"the following required arguments were not provided:{listed}", usage=usage)
    return values
