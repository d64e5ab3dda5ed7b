"""Brokered calls: judge first, run the adapter only if every requirement is met.

The broker is the one place adapter code runs from. It refuses before
dispatch (no adapter code runs on a refusal), bounds the run by the caller's
time budget, maps every adapter failure into the taxonomy, and checks
structured output against the caller's schema rather than trusting the
adapter's declaration.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped, unused-ignore]
from referencing.exceptions import Unresolvable

from negotiator_service import negotiation
from negotiator_service.errors import (
    AdapterInternal,
    AdapterTimeout,
    InvalidRequest,
    NegotiatorError,
    OutputSchemaViolation,
    UnsupportedCapability,
)
from negotiator_service.model import (
    Adapter,
    AdapterCall,
    AdapterReply,
    CallKind,
    CallRequest,
    Decision,
    JsonValue,
)
from negotiator_service.registry import AdapterRegistry
from sidecar_runtime.metrics import record_refusals

_LOGGER = logging.getLogger("negotiator_service.broker")


class Broker:
    def __init__(self, registry: AdapterRegistry, logger: logging.Logger | None = None) -> None:
        self.registry = registry
        self._logger = logger or _LOGGER

    def negotiate(self, request: CallRequest) -> Decision:
        """The dry run: the decision a call would get. Runs no adapter code."""
        decision, _ = self._decide(request, operation="negotiate")
        return decision

    async def call(
        self, request: CallRequest, *, time_budget: float | None, delegation_depth: int = 0
    ) -> tuple[AdapterReply, Decision]:
        """Judge the call, then run it; refusals raise UnsupportedCapability listing every gap.

        `time_budget` is the seconds the caller has left (None: no deadline).
        Cancelling the task cancels the adapter's work.
        """
        decision, schema = self._decide(request, operation=request.kind.value)
        if not decision.accepted:
            record_refusals(gap.requirement.capability.value for gap in decision.gaps)
            raise UnsupportedCapability(decision)

        entry = self.registry.get(decision.adapter)
        adapter_call = AdapterCall(
            prompt=request.prompt,
            options=request.options,
            output_schema=schema,
            time_budget=time_budget,
            delegation_depth=delegation_depth,
        )
        reply = await self._run(entry.adapter, decision.adapter, request.kind, adapter_call)
        if not request.options.stream_events:
            # Events were not negotiated; returning them anyway would be an
            # undeclared surface.
            reply = AdapterReply(text=reply.text)
        if schema is not None:
            check_output(decision.adapter, schema, reply.text)
        return reply, decision

    def _decide(self, request: CallRequest, *, operation: str) -> tuple[Decision, Mapping[str, Any] | None]:
        schema = negotiation.validate_request(request)
        declaration = negotiation.select(request, self.registry.declaration)
        requirements = negotiation.derive_requirements(request, schema)
        decision = negotiation.judge(declaration, requirements, request.options.allow_unknown)
        self._log_decision(operation, decision, request)
        return decision, schema

    async def _run(
        self, adapter: Adapter, shortname: str, kind: CallKind, adapter_call: AdapterCall
    ) -> AdapterReply:
        time_budget = adapter_call.time_budget
        if time_budget is not None and time_budget <= 0:
            raise AdapterTimeout(shortname, f"deadline of {time_budget:g}s exceeded before dispatch")
        method = adapter.produce if kind is CallKind.PRODUCE else adapter.invoke
        deadline = asyncio.timeout(time_budget)
        try:
            async with deadline:
                reply = await method(adapter_call)
        except TimeoutError as exc:
            # Only our own deadline is a timeout; a TimeoutError the adapter
            # raised by itself is an unmapped adapter failure.
            if deadline.expired():
                raise AdapterTimeout(shortname, f"deadline of {time_budget:g}s exceeded") from exc
            raise AdapterInternal(shortname, f"{type(exc).__name__}: {exc}") from exc
        except NegotiatorError:
            raise
        except Exception as exc:
            raise AdapterInternal(shortname, f"{type(exc).__name__}: {exc}") from exc
        if deadline.expired():
            # The adapter swallowed the cancellation and answered late anyway.
            raise AdapterTimeout(shortname, f"deadline of {time_budget:g}s exceeded")
        if not isinstance(reply, AdapterReply):
            raise AdapterInternal(shortname, f"returned {type(reply).__name__}, not an AdapterReply")
        return reply

    def _log_decision(self, operation: str, decision: Decision, request: CallRequest) -> None:
        allowed: list[str] = []
        for verdict in decision.allowed_unknowns:
            if verdict.requirement.capability.value not in allowed:
                allowed.append(verdict.requirement.capability.value)
        record: dict[str, JsonValue] = {
            "event": "negotiator.decision",
            "operation": operation,
            "adapter": decision.adapter,
            "declaration_version": decision.declaration_version,
            "outcome": "accepted" if decision.accepted else "refused",
            "requirements": [
                {"requirement": v.requirement.describe(), "request_field": v.requirement.request_field}
                for v in decision.verdicts
            ],
            "verdicts": [
                {
                    "requirement": v.requirement.describe(),
                    "state": v.state.value,
                    "allowed_unknown": v.allowed_unknown,
                }
                for v in decision.verdicts
            ],
            "gaps": [v.requirement.describe() for v in decision.gaps],
            # Capabilities the caller let through although the declaration is silent on them.
            "allowed_unknown": allowed,
            "allow_unknown_requested": sorted(c.value for c in request.options.allow_unknown),
        }
        self._logger.info(json.dumps(record))


def check_output(adapter: str, schema: Mapping[str, Any], text: str) -> Any:
    """Parse and validate Produce output; raise OutputSchemaViolation listing every error."""
    try:
        instance = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputSchemaViolation(adapter, [("", f"output is not valid JSON: {exc}")]) from exc
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    try:
        violations = sorted(
            (negotiation.json_pointer(error.absolute_path), error.message)
            for error in validator.iter_errors(instance)
        )
    except Unresolvable as exc:
        # validate_request resolves every $ref up front; this is the backstop.
        raise InvalidRequest([("output_schema", f"cannot be applied: {exc}")]) from exc
    if violations:
        raise OutputSchemaViolation(adapter, violations)
    return instance
