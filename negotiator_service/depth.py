"""Delegation depth: where a call sits in a chain of delegations, and how deep it may go.

Pure; no I/O. Depth 0 is a top-level call. An adapter that, while serving a
call at depth d, calls a negotiator again sends d + 1 in `x-delegation-depth`,
so every hop arrives one deeper: a child's depth is its parent's plus one.

A call at depth d is allowed iff d <= the limit that applies to it, the
smaller of:
- the negotiator's own limit (config `limits.max_depth`, default 3), which
  holds every call, and
- the call's `options.max_depth.depth`, when it sets a number: a caller may
  narrow the negotiator's limit, never widen it, so no caller can buy a
  deeper chain than the operator allows (docs/negotiation.md, "Delegation depth").
So 0 forbids delegation: only top-level calls pass. `provider_managed` sets no
number: the adapter owns the budget of the delegation it does inside itself,
while every call that comes back through a negotiator still meets the
negotiator's limit. Either form of `max_depth` also needs `depth_limit` from
the adapter (negotiation.derive_requirements), because the adapter receives
it and must honour it in the delegation it does itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentsidecar.negotiator_service.errors import DelegationDepthExceeded
from agentsidecar.negotiator_service.model import CallOptions

DEFAULT_MAX_DEPTH = 3
NEGOTIATOR_LIMIT = "limits.max_depth"
REQUEST_LIMIT = "options.max_depth.depth"


@dataclass(frozen=True, slots=True)
class DepthLimit:
    max_depth: int
    source: str  # NEGOTIATOR_LIMIT or REQUEST_LIMIT: where a refusal points the caller


def effective_limit(options: CallOptions, negotiator_max_depth: int) -> DepthLimit:
    """The limit a call is held to. A request limit equal to the negotiator's is named as the request's."""
    requested = options.max_depth.depth if options.max_depth is not None else None
    if requested is not None and requested <= negotiator_max_depth:
        return DepthLimit(requested, REQUEST_LIMIT)
    return DepthLimit(negotiator_max_depth, NEGOTIATOR_LIMIT)


def check_depth(depth: int, options: CallOptions, negotiator_max_depth: int) -> DepthLimit:
    """The applied limit; raises DelegationDepthExceeded when `depth` is above it."""
    limit = effective_limit(options, negotiator_max_depth)
    if depth > limit.max_depth:
        raise DelegationDepthExceeded(depth, limit.max_depth, limit.source)
    return limit
