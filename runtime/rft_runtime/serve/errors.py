"""Errors with vLLM's status codes and body shape: ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any

from ..model.weights_files import WeightFileError as WeightLoadError  # noqa: F401  (the served model's)

_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    """An error answered to the client with an HTTP status and vLLM's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, err_type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.err_type = err_type or _TYPES.get(status, "BadRequestError")

    def body(self) -> dict[str, Any]:
        """The JSON body vLLM answers for this error."""
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 error; ``param`` names the offending request field."""
    return APIError(400, message, param)


def invalid_param(param: str, value: Any, reason: str) -> APIError:
    """A 400 error for one request field, worded like vLLM's validation errors."""
    return APIError(400, f"{param} {reason} (parameter={param}, value={value!r})", param)


def model_not_found(name: str, served: str) -> APIError:
    """vLLM's 404 for an unknown ``model``."""
    return APIError(404, f"The model `{name}` does not exist. Valid aliases: {served}.", "model")


class EngineError(RuntimeError):
    """The engine failed while running a request (answered with 500)."""


