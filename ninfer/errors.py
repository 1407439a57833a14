"""Exception types shared across layers.

User-facing input errors derive from `InvalidInput` (a `ValueError`), which the server maps to
HTTP 400 and the CLIs print as one line. Everything else is an internal or environment failure.
"""
from __future__ import annotations


class NinferError(Exception):
    """Base class of every error ninfer raises on purpose."""


class InvalidInput(NinferError, ValueError):
    """The caller's input is wrong (bad argument, out-of-range id, unsupported option)."""

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param


class ArtifactError(NinferError):
    """A .ninfer artifact is malformed, truncated or fails its integrity check."""


class ArtifactIntegrityError(ArtifactError):
    """An object's bytes do not match the SHA-256 recorded in the header."""

    def __init__(self, object_name: str, message: str | None = None):
        super().__init__(message or f"object {object_name!r} fails its SHA-256 check")
        self.object_name = object_name


class ConversionError(NinferError):
    """A checkpoint cannot be converted (unsupported architecture, missing file, bad shape)."""


class DeviceUnavailable(NinferError):
    """The requested device (e.g. cuda) is not available on this machine."""
