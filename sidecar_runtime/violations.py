"""One google.rpc.PreconditionFailure violation, as a plain value: no gRPC, no protobuf.

The status tables build them (seedstore_service/error_status.py, imported by CLI
reads that never load gRPC), richstatus sends them and statusdecode hands them
back to a client: the same class at every end.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PreconditionViolation:
    """What must be fixed first (`type`), where (`subject`), and why (`description`)."""

    type: str
    subject: str
    description: str
