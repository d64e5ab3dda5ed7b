"""The root both services' error trees grow from: abstract bases that cannot be raised.

A service's errors form a small tree whose inner nodes group them (caller
errors, store errors, ...). Only a leaf says what went wrong, so only a leaf
may be raised: a class is concrete unless it is declared with
`abstract=True`, and constructing an abstract one raises TypeError.
`reason` is the google.rpc.ErrorInfo reason the service's status table
sends; `message` the text of the status.
"""

from __future__ import annotations

# The annotations' names only: a seedstore read that fails imports this tree (quickread.py),
# and typing would be most of what that costs.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar

__all__ = ["TreeError"]


class TreeError(Exception):
    """An error of a service's tree; subclass it with `abstract=True` for the service's own root."""

    reason: ClassVar[str] = ""
    abstract: ClassVar[bool] = True

    def __init_subclass__(cls, *, abstract: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.abstract = abstract

    def __init__(self, message: str) -> None:
        if type(self).abstract:
            raise TypeError(f"{type(self).__name__} is abstract; raise one of its subclasses")
        super().__init__(message)
        self.message = message
