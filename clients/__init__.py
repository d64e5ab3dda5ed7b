"""Python clients for the sidecar pair, sync and asyncio.

    from agentsidecar.clients import SeedStoreClient, NegotiatorClient               # blocking
    from agentsidecar.clients import AsyncSeedStoreClient, AsyncNegotiatorClient     # asyncio
    from agentsidecar.clients import open_channel, TlsConfig                         # channels
    from agentsidecar.clients import SidecarError, UnsupportedCapabilityError, ...   # the error tree

See `agentsidecar.clients.channel` (targets, tokens, TLS, retries), `agentsidecar.clients.errors` (the
exception tree, drawn in its docstring), `agentsidecar.clients.seedstore`,
`agentsidecar.clients.negotiator` and `agentsidecar.clients.aio`.

Each name is imported from its module on first use, so that importing one
module of the package (`agentsidecar.clients.errors`, say) does not import the
others: the asyncio client stays out of a process that uses the blocking one.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentsidecar.clients.aio import AsyncNegotiatorClient, AsyncSeedStoreClient
    from agentsidecar.clients.channel import CLIENT_TIMEOUT, TlsConfig, open_channel
    from agentsidecar.clients.errors import (
        AbortedError,
        AdapterFailureError,
        AdapterInternalError,
        AdapterKindMismatchError,
        AdapterMisconfiguredError,
        AdapterNotFoundError,
        AdapterNotProbeableError,
        AdapterNotRemovableError,
        AdapterRateLimitedError,
        AdapterRefusedError,
        AdapterRegistrationFailedError,
        AdapterTimeoutError,
        AdapterUnavailableError,
        AlreadyExistsError,
        AmbiguousSeedError,
        AuditWatcherDroppedError,
        ConversationAdapterMismatchError,
        ConversationBusyError,
        DataLossError,
        DeadlineExceededError,
        DeclarationChangedError,
        DelegationDepthExceededError,
        FailedPreconditionError,
        Gap,
        GatesNotApprovedError,
        InternalError,
        InvalidArgumentError,
        NoSeedFoundError,
        NotFoundError,
        OutputSchemaViolationError,
        PermissionDeniedError,
        ResourceExhaustedError,
        RevisionConflictError,
        SchemaViolation,
        SeedChoiceRequiredError,
        SeedCommandError,
        SeedMalformedError,
        SeedNotFoundError,
        SeedNotVerifiedError,
        SidecarError,
        StoreUnavailableError,
        UnauthenticatedError,
        UnavailableError,
        UnimplementedError,
        UnsupportedCapabilityError,
        from_rpc_error,
    )
    from agentsidecar.clients.negotiator import NegotiatorClient, call_options, tool_spec
    from agentsidecar.clients.seedstore import SeedStoreClient, VerifyEvent

# The module of each exported name (`__all__`) that errors.py does not define.
_MODULE_OF: dict[str, str] = {
    "AsyncNegotiatorClient": "aio",
    "AsyncSeedStoreClient": "aio",
    "CLIENT_TIMEOUT": "channel",
    "TlsConfig": "channel",
    "open_channel": "channel",
    "NegotiatorClient": "negotiator",
    "call_options": "negotiator",
    "tool_spec": "negotiator",
    "SeedStoreClient": "seedstore",
    "VerifyEvent": "seedstore",
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _MODULE_OF.get(name, "errors")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The exported names, the submodules imported so far, and the module's own dunders."""
    submodules = {
        name
        for name, value in globals().items()
        if isinstance(value, ModuleType) and value.__name__ == f"{__name__}.{name}"
    }
    return sorted({*__all__, *submodules, *(name for name in globals() if name.startswith("__"))})


__all__ = [
    "CLIENT_TIMEOUT",
    "AbortedError",
    "AdapterFailureError",
    "AdapterInternalError",
    "AdapterKindMismatchError",
    "AdapterMisconfiguredError",
    "AdapterNotFoundError",
    "AdapterNotProbeableError",
    "AdapterNotRemovableError",
    "AdapterRateLimitedError",
    "AdapterRefusedError",
    "AdapterRegistrationFailedError",
    "AdapterTimeoutError",
    "AdapterUnavailableError",
    "AlreadyExistsError",
    "AmbiguousSeedError",
    "AsyncNegotiatorClient",
    "AsyncSeedStoreClient",
    "AuditWatcherDroppedError",
    "ConversationAdapterMismatchError",
    "ConversationBusyError",
    "DataLossError",
    "DeadlineExceededError",
    "DeclarationChangedError",
    "DelegationDepthExceededError",
    "FailedPreconditionError",
    "Gap",
    "GatesNotApprovedError",
    "InternalError",
    "InvalidArgumentError",
    "NegotiatorClient",
    "NoSeedFoundError",
    "NotFoundError",
    "OutputSchemaViolationError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RevisionConflictError",
    "SchemaViolation",
    "SeedChoiceRequiredError",
    "SeedCommandError",
    "SeedMalformedError",
    "SeedNotFoundError",
    "SeedNotVerifiedError",
    "SeedStoreClient",
    "SidecarError",
    "StoreUnavailableError",
    "TlsConfig",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnsupportedCapabilityError",
    "VerifyEvent",
    "call_options",
    "from_rpc_error",
    "open_channel",
    "tool_spec",
]
