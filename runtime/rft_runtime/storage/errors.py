"""The one error every remote store raises (:class:`StorageError`): which URI failed, why (a fixed
``reason``), and whether trying again could help (:attr:`StorageError.terminal`).

Its text is built by the stores from status codes and error codes, never copied from a client library's
exception or a server's message, so no credential can reach it."""

from __future__ import annotations

REASONS = frozenset({
    "Unauthorized", "Forbidden", "NotFound", "RevisionNotFound", "NoSpace", "Unreachable", "Invalid",
    "ServerError",
})
"""Every value :attr:`StorageError.reason` takes."""

TERMINAL_REASONS = frozenset({"Unauthorized", "Forbidden", "NotFound", "RevisionNotFound", "Invalid"})
"""Reasons that the same request would meet again: retrying cannot help."""


class StorageError(Exception):
    """A remote store refused or failed a request for ``uri``.

    ``reason`` is one of :data:`REASONS`: ``Unauthorized`` (401), ``Forbidden`` (403, a wrong key or
    signature included), ``NotFound`` (404, a missing bucket, object or repository, or a prefix with
    nothing under it), ``RevisionNotFound`` (a missing revision of something that exists), ``NoSpace``
    (the local disk filled up while writing), ``Unreachable`` (no connection, or one that broke),
    ``Invalid`` (a request the store rejects as malformed) and ``ServerError`` (5xx and anything else).
    ``status`` is the HTTP status when the store answered. ``str(e)`` is ``"{uri}: {message}"``."""

    def __init__(self, uri: str, reason: str, message: str, status: int | None = None) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown storage error reason {reason!r}")
        super().__init__(f"{uri}: {message}")
        self.uri = uri
        self.reason = reason
        self.message = message
        self.status = status

    @property
    def terminal(self) -> bool:
        """Whether retrying the same request cannot help (see :data:`TERMINAL_REASONS`)."""
        return self.reason in TERMINAL_REASONS

    def __repr__(self) -> str:
        return (f"StorageError(uri={self.uri!r}, reason={self.reason!r}, message={self.message!r}, "
                f"status={self.status!r})")

    def __reduce__(self) -> tuple[type[StorageError], tuple[str, str, str, int | None]]:
        return (StorageError, (self.uri, self.reason, self.message, self.status))
