"""The chat-completions settings the openai adapter passes on, and the value each may take.

Pure: no I/O. A call's `options.settings` arrive as a protobuf Struct, so
every number is a double; an integer setting takes a double with no
fraction (42.0) and is sent as the integer. The negotiator applies
`setting_problems` before dispatch (broker: INVALID_REQUEST naming
`options.settings.<key>`), and the adapter applies it again at its edge
once its MCP tools are listed (ADAPTER_REFUSED, before any HTTP request).

Bounds are those chat completions documents (temperature 0..2, top_p 0..1,
penalties -2..2, logit_bias -100..100, stop at most 4 sequences, metadata
at most 16 pairs with keys of at most 64 and values of at most 512
characters, top_logprobs 0..20). The identifiers (`user`,
`safety_identifier`, `prompt_cache_key`) are capped at MAX_IDENTIFIER_CHARS
by this adapter, so a call cannot ship an unbounded string under them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from agentsidecar.negotiator_service.model import JsonValue

MAX_IDENTIFIER_CHARS = 512
MAX_STOP_SEQUENCES = 4
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_TOP_LOGPROBS = 20
# int64, the range providers parse integers into.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
TOOL_CHOICES = ("none", "auto", "required")
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")

# Keys that look like settings but are refused, each with the reason: the
# reply carries one text, and the other fields have a checked option of their own.
REFUSED_KEYS: Mapping[str, str] = {
    "n": "a call returns one text, so this adapter cannot return n choices; it does not accept n",
    "reasoning_effort": (
        "is not a setting: send the level as options.effort, which is checked against the "
        "model's declared effort_levels"
    ),
    "model": "is not a setting: send the model as options.model",
    "response_format": "is not a setting: use Produce with an output_schema",
}


def _integer(value: JsonValue) -> int | None:
    """`value` as an int when it is a JSON integer (a double without fraction counts), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _number(value: JsonValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _range(low: float, high: float) -> Callable[[JsonValue], str]:
    def check(value: JsonValue) -> str:
        number = _number(value)
        if number is None or not low <= number <= high:
            return f"must be a number from {low:g} to {high:g}"
        return ""

    return check


def _positive_integer(value: JsonValue) -> str:
    integer = _integer(value)
    if integer is None or not 1 <= integer <= _INT_MAX:
        return "must be a positive integer"
    return ""


def _seed(value: JsonValue) -> str:
    integer = _integer(value)
    if integer is None or not _INT_MIN <= integer <= _INT_MAX:
        return "must be an integer (64-bit)"
    return ""


def _boolean(value: JsonValue) -> str:
    return "" if isinstance(value, bool) else "must be true or false"


def _identifier(value: JsonValue) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_IDENTIFIER_CHARS:
        return f"must be a non-empty string of at most {MAX_IDENTIFIER_CHARS} characters"
    return ""


def _stop(value: JsonValue) -> str:
    if isinstance(value, str):
        return "" if value else "must not be empty"
    if (
        isinstance(value, list | tuple)
        and 1 <= len(value) <= MAX_STOP_SEQUENCES
        and all(isinstance(s, str) and s for s in value)
    ):
        return ""
    return f"must be a string or a list of 1 to {MAX_STOP_SEQUENCES} non-empty strings"


def _metadata(value: JsonValue) -> str:
    if not isinstance(value, Mapping) or len(value) > MAX_METADATA_PAIRS:
        return f"must be an object of at most {MAX_METADATA_PAIRS} string pairs"
    for key, item in value.items():
        if not isinstance(key, str) or not key or len(key) > MAX_METADATA_KEY_CHARS:
            return f"keys must be strings of 1 to {MAX_METADATA_KEY_CHARS} characters"
        if not isinstance(item, str) or len(item) > MAX_METADATA_VALUE_CHARS:
            return f'value of "{key[:64]}" must be a string of at most {MAX_METADATA_VALUE_CHARS} characters'
    return ""


def _logit_bias(value: JsonValue) -> str:
    if not isinstance(value, Mapping):
        return "must be an object from token ids to numbers from -100 to 100"
    for key, item in value.items():
        number = _number(item)
        if not isinstance(key, str) or not key.isdecimal() or number is None or not -100 <= number <= 100:
            return "must be an object from token ids to numbers from -100 to 100"
    return ""


def _service_tier(value: JsonValue) -> str:
    return "" if value in SERVICE_TIERS else f"must be one of {', '.join(SERVICE_TIERS)}"


def _top_logprobs(value: JsonValue) -> str:
    integer = _integer(value)
    if integer is None or not 0 <= integer <= MAX_TOP_LOGPROBS:
        return f"must be an integer from 0 to {MAX_TOP_LOGPROBS}"
    return ""


# Checks that need only the value; tool_choice and the pairs are checked in `setting_problems`.
VALUE_CHECKS: Mapping[str, Callable[[JsonValue], str]] = {
    "temperature": _range(0, 2),
    "top_p": _range(0, 1),
    "presence_penalty": _range(-2, 2),
    "frequency_penalty": _range(-2, 2),
    "max_tokens": _positive_integer,
    "max_completion_tokens": _positive_integer,
    "seed": _seed,
    "stop": _stop,
    "logit_bias": _logit_bias,
    "user": _identifier,
    "safety_identifier": _identifier,
    "prompt_cache_key": _identifier,
    "service_tier": _service_tier,
    "metadata": _metadata,
    "logprobs": _boolean,
    "top_logprobs": _top_logprobs,
    "parallel_tool_calls": _boolean,
    "tool_choice": lambda value: "",  # needs the call's tools: see _tool_choice
}
ACCEPTED_SETTINGS = frozenset(VALUE_CHECKS)
# Settings the chat-completions API takes only beside `tools`.
NEEDS_TOOLS = ("tool_choice", "parallel_tool_calls")


def _tool_choice(value: JsonValue, tool_names: Collection[str] | None) -> str:
    """Why `value` is no tool_choice for a call with these tools ("" if it is one).

    `tool_names` None: the call's tools are not all known yet (MCP servers are
    listed only once they run), so a function name is not checked against them.
    """
    if isinstance(value, str):
        return "" if value in TOOL_CHOICES else _TOOL_CHOICE_FORM
    if (
        not isinstance(value, Mapping)
        or value.get("type") != "function"
        or set(value) != {"type", "function"}
    ):
        return _TOOL_CHOICE_FORM
    function = value["function"]
    if (
        not isinstance(function, Mapping)
        or set(function) != {"name"}
        or not isinstance(function["name"], str)
    ):
        return _TOOL_CHOICE_FORM
    name = function["name"]
    if tool_names is not None and name not in tool_names:
        return f'names no tool the model is offered in this call: "{name[:64]}"'
    return ""


_TOOL_CHOICE_FORM = 'must be "none", "auto", "required" or {"type": "function", "function": {"name": TOOL}}'


def setting_problems(
    settings: Mapping[str, JsonValue], tool_names: Collection[str] | None
) -> list[tuple[str, str]]:
    """(field, problem) for each setting the adapter would not send as it stands.

    `tool_names` are the tools the model is offered (after the tool filter);
    None when they are not all known before the call's MCP servers run. Keys
    with no rule here are left to the declaration (accepted_settings).
    """
    problems: list[tuple[str, str]] = []
    for key in sorted(settings):
        value = settings[key]
        field = f"options.settings.{key}"
        if key in REFUSED_KEYS:
            problems.append((field, REFUSED_KEYS[key]))
            continue
        check = VALUE_CHECKS.get(key)
        if check is None:
            continue
        problem = _tool_choice(value, tool_names) if key == "tool_choice" else check(value)
        if not problem and key in NEEDS_TOOLS and tool_names is not None and not tool_names:
            problem = "needs tools: the model is offered none in this call"
        if problem:
            problems.append((field, problem))
    if "max_tokens" in settings and "max_completion_tokens" in settings:
        problems.append(
            (
                "options.settings.max_completion_tokens",
                "set either it or max_tokens, not both (the same limit)",
            )
        )
    if "top_logprobs" in settings and settings.get("logprobs") is not True:
        problems.append(("options.settings.top_logprobs", "needs logprobs: true"))
    return problems
