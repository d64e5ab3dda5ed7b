"""Probes of an OpenAI-compatible upstream: what to ask, and what each reply shows. Pure.

A probe asks the upstream, for one model, something whose reply shows
whether it honours a capability:

- `models`: `GET /models` lists the model. Evidence only; when the model
  is not listed the other probes are not sent (their failure would say
  nothing about a capability).
- `structured_output`: a minimal `response_format` JSON schema; the reply
  must be JSON that validates against it.
- `tool_call`: one function offered with `tool_choice: required`; the reply
  must call it with arguments that validate against its parameters.
- `effort`: `reasoning_effort` at one level the model's declaration takes;
  the reply must show reasoning (`usage.completion_tokens_details.
  reasoning_tokens` > 0). A server that silently drops the parameter
  answers without it, so such a reply fails the probe.

Each probe gives `ProbeEvidence` (request, escaped reply excerpt, verdict,
time). A verdict settles a capability only where the model's declaration
holds it UNKNOWN (`declarations.resolve_unknown`): PASSED makes it
SUPPORTED, FAILED UNSUPPORTED; INCONCLUSIVE (unreachable, throttled, not
authorised, a server error) leaves it UNKNOWN. What the code or the config
declared is never changed by a probe.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from agentsidecar.negotiator_service.declarations import resolve_unknown
from agentsidecar.negotiator_service.model import Capability, CapabilityState, Declaration, JsonValue

EXCERPT_LIMIT = 240  # characters of a request or reply kept in evidence, after escaping
# Levels tried in this order; the first the model's declaration takes is sent.
_EFFORT_PREFERENCE = ("low", "minimal", "medium", "high", "xhigh", "none")
PROBE_SCHEMA: Mapping[str, JsonValue] = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
PROBE_TOOL = "probe_echo"
PROBE_TOOL_PARAMETERS: Mapping[str, JsonValue] = {
    "type": "object",
    "properties": {"word": {"type": "string"}},
    "required": ["word"],
    "additionalProperties": False,
}


class ProbeKind(enum.Enum):
    MODELS = "models"
    STRUCTURED_OUTPUT = "structured_output"
    TOOL_CALL = "tool_call"
    EFFORT = "effort"


PROBE_CAPABILITY: Mapping[ProbeKind, Capability] = {
    ProbeKind.STRUCTURED_OUTPUT: Capability.STRUCTURED_OUTPUT,
    ProbeKind.TOOL_CALL: Capability.TOOL_REGISTRATION,
    ProbeKind.EFFORT: Capability.EFFORT,
}


class ProbeVerdict(enum.Enum):
    PASSED = "passed"  # the reply shows the capability honoured
    FAILED = "failed"  # the upstream rejected the request, or its reply shows the capability ignored
    INCONCLUSIVE = "inconclusive"  # the reply says nothing about the capability


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    kind: ProbeKind
    model: str
    method: str  # "GET" | "POST"
    path: str  # below the adapter's base_url
    body: Mapping[str, JsonValue] | None = None


@dataclass(frozen=True, slots=True)
class ProbeEvidence:
    model: str
    kind: ProbeKind
    verdict: ProbeVerdict
    time: datetime  # when the reply came; timezone-aware UTC
    request: str  # method, path and body, escaped and cut to EXCERPT_LIMIT
    reply: str  # the reply body (or why there is none), escaped and cut to EXCERPT_LIMIT
    detail: str  # why the verdict

    @property
    def capability(self) -> Capability | None:
        return PROBE_CAPABILITY.get(self.kind)


def excerpt(text: str) -> str:
    """`text` with backslashes, control and non-ASCII characters escaped, cut to EXCERPT_LIMIT."""
    escaped = text.encode("unicode_escape").decode("ascii")
    return escaped if len(escaped) <= EXCERPT_LIMIT else escaped[: EXCERPT_LIMIT - 3] + "..."


def request_excerpt(request: ProbeRequest) -> str:
    body = "" if request.body is None else " " + json.dumps(request.body, sort_keys=True)
    return excerpt(f"{request.method} {request.path}{body}")


def effort_level(declaration: Declaration) -> str:
    """The level the effort probe sends: the first of a preferred order the declaration takes."""
    levels = declaration.effort_levels
    for level in _EFFORT_PREFERENCE:
        if not levels or level in levels:
            return level
    return sorted(levels)[0]


def plan(declaration: Declaration, model: str, *, strict: bool) -> tuple[ProbeRequest, ...]:
    """The probes of `model`: `models` first, then one per capability its declaration does not rule out.

    A capability the model's declaration holds UNSUPPORTED is not probed:
    no verdict could change it, and a probe costs tokens. `strict` is
    whether structured output goes with `strict: true` for this model.
    """
    if not model:
        raise ValueError("probes are per model: name the model")
    _, entry = declaration.for_model(model)
    requests = [ProbeRequest(ProbeKind.MODELS, model, "GET", "/models")]

    def probed(kind: ProbeKind) -> bool:
        return entry.state(PROBE_CAPABILITY[kind]) is not CapabilityState.UNSUPPORTED

    if probed(ProbeKind.STRUCTURED_OUTPUT):
        requests.append(
            _chat(
                ProbeKind.STRUCTURED_OUTPUT,
                model,
                'Reply with the JSON object {"ok": true}.',
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "probe", "schema": dict(PROBE_SCHEMA), "strict": strict},
                },
            )
        )
    if probed(ProbeKind.TOOL_CALL):
        requests.append(
            _chat(
                ProbeKind.TOOL_CALL,
                model,
                f'Call the function {PROBE_TOOL} with word "probe".',
                tools=[
                    {
                        "type": "function",
                        "function": {
                            "name": PROBE_TOOL,
                            "description": "Echo a word.",
                            "parameters": dict(PROBE_TOOL_PARAMETERS),
                        },
                    }
                ],
                tool_choice="required",
            )
        )
    if probed(ProbeKind.EFFORT):
        requests.append(
            _chat(ProbeKind.EFFORT, model, "What is 17 * 23?", reasoning_effort=effort_level(entry))
        )
    return tuple(requests)


def _chat(kind: ProbeKind, model: str, prompt: str, **extra: JsonValue) -> ProbeRequest:
    body: dict[str, JsonValue] = {"model": model, "messages": [{"role": "user", "content": prompt}], **extra}
    return ProbeRequest(kind, model, "POST", "/chat/completions", body)


def not_sent(request: ProbeRequest, why: str, when: datetime) -> ProbeEvidence:
    """Evidence for a probe that was not sent (its verdict is INCONCLUSIVE)."""
    return ProbeEvidence(
        model=request.model,
        kind=request.kind,
        verdict=ProbeVerdict.INCONCLUSIVE,
        time=when,
        request=request_excerpt(request),
        reply="",
        detail=f"not sent: {why}",
    )


def unanswered(request: ProbeRequest, problem: str, when: datetime) -> ProbeEvidence:
    """Evidence for a probe the upstream did not answer (unreachable, timed out, reply too large)."""
    return ProbeEvidence(
        model=request.model,
        kind=request.kind,
        verdict=ProbeVerdict.INCONCLUSIVE,
        time=when,
        request=request_excerpt(request),
        reply="",
        detail=f"no reply: {problem}",
    )


def judge(request: ProbeRequest, status: int, body: bytes, when: datetime) -> ProbeEvidence:
    """What the upstream's answer (`status`, `body`) to `request` shows."""
    verdict, detail = _verdict(request, status, body)
    return ProbeEvidence(
        model=request.model,
        kind=request.kind,
        verdict=verdict,
        time=when,
        request=request_excerpt(request),
        reply=excerpt(f"HTTP {status} {_telling_part(request.kind, status, body)}"),
        detail=detail,
    )


def _telling_part(kind: ProbeKind, status: int, body: bytes) -> str:
    """The part of a reply its verdict rests on (the whole body when it has no such part)."""
    text = body.decode("utf-8", errors="replace")
    try:
        reply = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return text
    if not 200 <= status < 300 or not isinstance(reply, dict):
        return text
    part: Any = None
    if kind is ProbeKind.MODELS and isinstance(reply.get("data"), list):
        part = {"data": [item.get("id") for item in reply["data"] if isinstance(item, dict)]}
    elif kind is ProbeKind.EFFORT and "usage" in reply:
        part = {"usage": reply["usage"]}
    elif kind in (ProbeKind.STRUCTURED_OUTPUT, ProbeKind.TOOL_CALL):
        message = _message(reply)
        if message is not None:
            key = "content" if kind is ProbeKind.STRUCTURED_OUTPUT else "tool_calls"
            part = {key: message.get(key)}
    return text if part is None else json.dumps(part, sort_keys=True)


def _verdict(request: ProbeRequest, status: int, body: bytes) -> tuple[ProbeVerdict, str]:
    if status in (400, 422) and request.kind is not ProbeKind.MODELS:
        return ProbeVerdict.FAILED, f"the upstream rejected the request (HTTP {status})"
    if not 200 <= status < 300:
        return ProbeVerdict.INCONCLUSIVE, f"HTTP {status} says nothing about the capability"
    try:
        reply = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return ProbeVerdict.INCONCLUSIVE, "the reply is not JSON"
    if not isinstance(reply, dict):
        return ProbeVerdict.INCONCLUSIVE, "the reply is not a JSON object"
    if request.kind is ProbeKind.MODELS:
        return _models_verdict(request.model, reply)
    message = _message(reply)
    if message is None:
        return ProbeVerdict.INCONCLUSIVE, "the reply has no choices[0].message"
    if request.kind is ProbeKind.STRUCTURED_OUTPUT:
        return _structured_verdict(message)
    if request.kind is ProbeKind.TOOL_CALL:
        return _tool_verdict(message)
    return _effort_verdict(reply)


def _models_verdict(model: str, reply: dict[str, Any]) -> tuple[ProbeVerdict, str]:
    data = reply.get("data")
    if not isinstance(data, list):
        return ProbeVerdict.INCONCLUSIVE, "the reply has no `data` list"
    listed = {item.get("id") for item in data if isinstance(item, dict)}
    if model in listed:
        return ProbeVerdict.PASSED, f"/models lists {model}"
    return ProbeVerdict.FAILED, f"/models does not list {model} ({len(listed)} models listed)"


def _message(reply: dict[str, Any]) -> dict[str, Any] | None:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def _structured_verdict(message: dict[str, Any]) -> tuple[ProbeVerdict, str]:
    content = message.get("content")
    if not isinstance(content, str):
        return ProbeVerdict.FAILED, "the reply has no text content"
    try:
        value = json.loads(content)
    except json.JSONDecodeError:
        return ProbeVerdict.FAILED, "the content is not JSON"
    problem = _schema_problem(value, PROBE_SCHEMA)
    if problem:
        return ProbeVerdict.FAILED, f"the content does not match the schema: {problem}"
    return ProbeVerdict.PASSED, "the content matches the schema"


def _tool_verdict(message: dict[str, Any]) -> tuple[ProbeVerdict, str]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return ProbeVerdict.FAILED, "the reply calls no tool"
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or function.get("name") != PROBE_TOOL:
            continue
        arguments = function.get("arguments")
        try:
            value = json.loads(arguments) if isinstance(arguments, str) else None
        except json.JSONDecodeError:
            value = None
        if value is None:
            return ProbeVerdict.FAILED, f"{PROBE_TOOL} was called with arguments that are not JSON"
        problem = _schema_problem(value, PROBE_TOOL_PARAMETERS)
        if problem:
            return ProbeVerdict.FAILED, f"{PROBE_TOOL} was called with arguments off its schema: {problem}"
        return ProbeVerdict.PASSED, f"{PROBE_TOOL} was called with arguments that match its parameters"
    return ProbeVerdict.FAILED, f"the reply calls tools, but not {PROBE_TOOL}"


def _effort_verdict(reply: dict[str, Any]) -> tuple[ProbeVerdict, str]:
    usage = reply.get("usage")
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    tokens = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return ProbeVerdict.PASSED, f"the reply shows {tokens} reasoning tokens"
    return (
        ProbeVerdict.FAILED,
        f"the reply shows no reasoning (usage.completion_tokens_details.reasoning_tokens: {tokens!r})",
    )


def _schema_problem(value: JsonValue, schema: Mapping[str, JsonValue]) -> str:
    # Imported when a probe's reply is checked, not at start-up.
    import jsonschema

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    return "" if error is None else error.message[:120]


def outcomes(evidence: Sequence[ProbeEvidence]) -> dict[Capability, CapabilityState]:
    """The state each conclusive verdict gives its capability (PASSED: SUPPORTED, FAILED: UNSUPPORTED)."""
    states: dict[Capability, CapabilityState] = {}
    for item in evidence:
        capability = item.capability
        if capability is None or item.verdict is ProbeVerdict.INCONCLUSIVE:
            continue
        states[capability] = (
            CapabilityState.SUPPORTED if item.verdict is ProbeVerdict.PASSED else CapabilityState.UNSUPPORTED
        )
    return states


def settle(base: Declaration, evidence: Mapping[str, Sequence[ProbeEvidence]]) -> Declaration:
    """`base` (the declaration from code and config) with each model's probe evidence applied.

    Always computed from `base`, so the latest evidence of a model decides
    and an earlier probe's verdict never sticks. A model whose evidence
    moves no state gets no entry of its own, so the version changes only
    when a probe changed what judges calls.
    """
    declaration = base
    for model in sorted(evidence):
        _, entry = base.for_model(model)
        moving = {
            capability: state
            for capability, state in outcomes(evidence[model]).items()
            if entry.state(capability) is CapabilityState.UNKNOWN
        }
        if moving:
            declaration = resolve_unknown(declaration, model, moving)
    return declaration


@runtime_checkable
class Probeable(Protocol):
    """An adapter with an upstream to probe (the openai adapter)."""

    @property
    def declaration(self) -> Declaration: ...

    @property
    def probe_evidence(self) -> Mapping[str, tuple[ProbeEvidence, ...]]: ...

    def probe_strict(self, model: str) -> bool: ...

    def record_probes(self, model: str, evidence: tuple[ProbeEvidence, ...]) -> None: ...

    async def probe_exchange(self, request: ProbeRequest) -> tuple[int, bytes]: ...
