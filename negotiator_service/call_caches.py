"""The negotiator's call-path caches, one CallCaches per server.

`server.py` builds one and hands it to the Broker and the servicer; nothing
else keeps values across calls. A pure function of its key is all a cache
here may hold, so a hit returns what recomputing would return. The rules:

options
    Key: the CallOptions message's deterministic encoding (settings keys
    sorted), at most MAX_OPTIONS_BYTES long. Value: the converted
    CallOptions, shared by every call with that encoding. Sound because
    conversion reads nothing but the message, and CallOptions is immutable
    all the way down except settings holding lists or objects, which an
    adapter could change: those are converted afresh and never kept. A
    message that fails to convert raises and is not kept.

judgements (Broker._judge)
    Key: the options object and the target's declaration object (by
    identity), with the call's shape (kind, target names, schema text,
    whether the prompt is empty). Value: the decision, the options after
    profile expansion, and the schema's CheckedSchema (for a schema over
    MAX_SCHEMA_BYTES, one holding no validator: each call compiles its own).
    Sound because a judgement reads only those and the broker's profiles,
    which are fixed; a registered adapter keeps its declaration object, and
    registering or replacing it brings a new one. Only judgements that
    succeed are kept; calls with tools never are. The identity key hits
    only because `options` hands the same object to like calls.

schemas (checked_schema)
    Key: an output schema's text, at most MAX_SCHEMA_BYTES long. Value: its
    CheckedSchema (negotiation.check_schema_text): its problems, its
    compiled validator, its formats and the parsed schema the calls hand
    their adapters, each a pure function of the text and immutable (the
    schema is `frozen_json`, so no adapter can change what the next call
    gets: CheckedSchema.for_dispatch).

decisions (shared_decision)
    Key: a decision by value: its compared fields (adapter, declaration
    version, model, and each verdict's requirement fields, state and
    allowance), enum members by their values, so the key hashes and
    compares as plain strings and booleans. Value: the first decision
    judged equal to it. Sound because everything derived from a decision (its line, proto,
    size, response, audit record) reads only those fields, so equal
    decisions may share one object, and with it the entries the caches
    below keep per decision object: a call judged afresh (new options, say
    another setting value) whose verdicts match an earlier call's finds
    them.

decision_lines (Broker._log_decision)
    Key: the decision object, with the operation and allow_unknown. Value:
    the decision's JSON log line, a pure function of the three.

decision_protos, negotiate_responses, decision_sizes
    Key: the decision object. Value: its proto, a dry run's whole
    response, and the proto's encoded size. Shared between calls: replies
    copy the proto in, and the response is only serialized by grpc, so
    neither is ever changed.

Identity keys hold their objects (IdentityCache), so no other object can
take their id()s while an entry lives. Every cache is bounded by
MAX_ENTRIES; when full, each new entry drops the oldest (IdentityCache says
why one at a time): a miss costs only the recomputation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentsidecar.negotiator.v1 import negotiator_pb2
from agentsidecar.negotiator_service import convert, negotiation
from agentsidecar.negotiator_service.identity_cache import IdentityCache
from agentsidecar.negotiator_service.model import AdapterReply, CallOptions, CallRequest, Decision
from agentsidecar.negotiator_service.negotiation import CheckedSchema

MAX_ENTRIES = 1024
MAX_OPTIONS_BYTES = 4096
# Schemas are kept up to this size, fewer of them: a compiled validator
# weighs several times its text.
MAX_SCHEMA_BYTES = 32 * 1024
MAX_SCHEMA_ENTRIES = 256
# reply_size_bound's figures: a field's tag and length prefix, a character's UTF-8 bytes, an int64's
# varint bytes, and the number of Usage fields.
_FIELD = 1 + 5
_TEXT = 4
_INT64 = 10
_USAGE_FIELDS = 4


class CallCaches:
    """The caches of one negotiator server (the rules: this module's docstring)."""

    __slots__ = (
        "_decisions",
        "_max_entries",
        "_options",
        "_schemas",
        "decision_lines",
        "decision_protos",
        "decision_sizes",
        "judgements",
        "negotiate_responses",
    )

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max_entries = max_entries
        self._decisions: dict[tuple[object, ...], Decision] = {}
        self._options: IdentityCache[CallOptions] = IdentityCache(max_entries)
        self._schemas: IdentityCache[CheckedSchema] = IdentityCache(min(max_entries, MAX_SCHEMA_ENTRIES))
        self.judgements: IdentityCache[tuple[Decision, CallOptions, CheckedSchema | None]] = IdentityCache(
            max_entries
        )
        self.decision_lines: IdentityCache[str] = IdentityCache(max_entries)
        self.decision_protos: IdentityCache[negotiator_pb2.Decision] = IdentityCache(max_entries)
        self.negotiate_responses: IdentityCache[negotiator_pb2.NegotiateResponse] = IdentityCache(max_entries)
        self.decision_sizes: IdentityCache[int] = IdentityCache(max_entries)

    # -- requests: convert's, with shared options ------------------------

    def call_options(self, message: negotiator_pb2.CallOptions) -> CallOptions:
        encoding = message.SerializeToString(deterministic=True)
        options = self._options.get((), encoding, None)
        if options is not None:
            return options
        options = convert.call_options(message)
        if len(encoding) <= MAX_OPTIONS_BYTES and not any(
            isinstance(value, (dict, list)) for value in options.settings.values()
        ):
            self._options.put((), encoding, options)
        return options

    def checked_schema(self, text: str) -> tuple[CheckedSchema, Mapping[str, Any] | None]:
        """negotiation.check_schema_text, its CheckedSchema shared by every call with this text.

        The parsed schema comes only with a text checked here and now (None
        for one known already: the call parses its own when it needs one).
        """
        return self._checked_schema(text, compile=False)

    def dispatch_schema(self, text: str) -> tuple[CheckedSchema, Mapping[str, Any] | None]:
        """`checked_schema` for a call to dispatch: a text checked here is compiled as it is checked."""
        return self._checked_schema(text, compile=True)

    def _checked_schema(self, text: str, *, compile: bool) -> tuple[CheckedSchema, Mapping[str, Any] | None]:
        checked = self._schemas.get((), text, None)
        if checked is not None:
            return checked, None
        checked, schema = negotiation.check_schema_text(text, compile=compile)
        if len(text) <= MAX_SCHEMA_BYTES:
            self._schemas.put((), text, checked)
        return checked, schema

    def negotiate_request(self, message: negotiator_pb2.NegotiateRequest) -> CallRequest:
        return convert.negotiate_request(message, self.call_options)

    def produce_request(self, message: negotiator_pb2.ProduceRequest) -> CallRequest:
        return convert.produce_request(message, self.call_options)

    def invoke_request(self, message: negotiator_pb2.InvokeRequest) -> CallRequest:
        return convert.invoke_request(message, self.call_options)

    # -- decisions: one object per decision value ------------------------

    def shared_decision(self, decision: Decision) -> Decision:
        """The decision kept equal to `decision`, else `decision` itself, kept from now on."""
        key = _decision_key(decision)
        decisions = self._decisions
        known = decisions.get(key)
        if known is not None:
            return known
        if len(decisions) >= self._max_entries:
            del decisions[next(iter(decisions))]
        decisions[key] = decision
        return decision

    # -- responses: convert's, with shared decision protos ---------------

    def decision_proto(self, decision: Decision) -> negotiator_pb2.Decision:
        """The decision's proto, shared between calls: copy it, never change it."""
        message = self.decision_protos.get((decision,), None, None)
        if message is None:
            message = convert.decision_to_proto(decision)
            self.decision_protos.put((decision,), None, message)
        return message

    def negotiate_response(self, decision: Decision) -> negotiator_pb2.NegotiateResponse:
        """The dry run's response, shared between calls: hand it to grpc, never change it."""
        response = self.negotiate_responses.get((decision,), None, None)
        if response is None:
            response = convert.negotiate_response(decision, self.decision_proto)
            self.negotiate_responses.put((decision,), None, response)
        return response

    def produce_response(self, reply: AdapterReply, decision: Decision) -> negotiator_pb2.ProduceResponse:
        return convert.produce_response(reply, decision, self.decision_proto)

    def invoke_response(self, reply: AdapterReply, decision: Decision) -> negotiator_pb2.InvokeResponse:
        return convert.invoke_response(reply, decision, self.decision_proto)

    def reply_size_bound(self, reply: AdapterReply, decision: Decision, conversation_id: str | None) -> int:
        """At least the encoded size of `produce_response` or `invoke_response` of `reply` with
        `conversation_id` set (a bound, not the size: the servicer measures a reply only when its
        bound is over the limit).

        Each field of those messages has a one-byte tag (numbers up to 15) and a
        length of at most five bytes; text is at most four bytes per character
        (UTF-8), an int64 at most ten.
        """
        size = self.decision_sizes.get((decision,), None, None)
        if size is None:
            size = self.decision_proto(decision).ByteSize()
            self.decision_sizes.put((decision,), None, size)
        bound = _FIELD + size + _FIELD + _TEXT * len(reply.text)
        for event in reply.events:
            bound += _FIELD + _FIELD + _TEXT * len(event.type) + _FIELD + _TEXT * len(event.text)
        if conversation_id is not None:
            bound += _FIELD + _TEXT * len(conversation_id)
        if reply.usage is not None:
            bound += _FIELD + _USAGE_FIELDS * (1 + _INT64)
        return bound


def _decision_key(decision: Decision) -> tuple[object, ...]:
    """A decision's compared fields, equal exactly when the decisions are (an enum member by its value)."""
    key: list[object] = [decision.adapter, decision.declaration_version, decision.model]
    for verdict in decision.verdicts:
        requirement = verdict.requirement
        typed_set = requirement.typed_set
        key += (
            requirement.capability._value_,
            requirement.request_field,
            None if typed_set is None else typed_set._value_,
            requirement.member,
            verdict.state._value_,
            verdict.allowed_unknown,
        )
    return tuple(key)
