"""Errors in OpenAI's envelope, and the one place upstream failures become HTTP statuses.

`{"error": {"message", "type", "param", "code"}}` with the HTTP status that matches:

- malformed or out of range: 400, `invalid_request_error`, a code per field;
- no or a wrong API key: 401, `invalid_request_error`, `invalid_api_key`;
- unknown voice / model: 404, `invalid_request_error`, `voice_not_found` / `model_not_found`;
- every pod tried was at its stream limit (RESOURCE_EXHAUSTED): 429, `rate_limit_error`,
  `voice_at_capacity`;
- no ready pod serves the voice, or none could be reached: 503, `service_unavailable`,
  `no_ready_pod`;
- a pod failed the stream: 502, `upstream_error`, `upstream_error`.
"""

from __future__ import annotations

from typing import Any

from engines.client.balancing import NoEndpoints, StreamRefused

INVALID_REQUEST = "invalid_request_error"


class ApiError(Exception):
    """An error a client gets as OpenAI's envelope with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def envelope(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param, code)


def unknown_voice(voice: str, known: list[str]) -> ApiError:
    listed = ", ".join(known) if known else "none yet"
    return ApiError(
        404,
        f"voice {voice!r} is not served here; voices: {listed} (GET /v1/audio/voices)",
        INVALID_REQUEST,
        "voice",
        "voice_not_found",
    )


class UpstreamError(Exception):
    """A pod's error: `code` is its gRPC status name (None when unknown)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


# A pod's answer to a request we validated ourselves: still the request's fault.
_CLIENT_CODES = {"INVALID_ARGUMENT": 400, "OUT_OF_RANGE": 400}


def from_failure(error: Exception) -> ApiError:
    """The envelope of a failed stream (balancing's and the pods' errors)."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, NoEndpoints):
        return ApiError(
            503, f"{error}; try again shortly", "service_unavailable", None, "no_ready_pod"
        )
    if isinstance(error, StreamRefused):
        if error.code == "RESOURCE_EXHAUSTED":
            return ApiError(
                429,
                f"voice {error.voice!r} is at its stream limit on every pod tried "
                f"({len(error.refusals)}); retry later. Last refusal: {error.last_message}",
                "rate_limit_error",
                None,
                "voice_at_capacity",
            )
        if error.code == "NOT_FOUND":
            return ApiError(
                503, f"{error}; try again shortly", "service_unavailable", "voice", "no_ready_pod"
            )
        return ApiError(503, str(error), "service_unavailable", None, "no_ready_pod")
    if isinstance(error, UpstreamError):
        status = _CLIENT_CODES.get(error.code or "")
        if status is not None:
            return ApiError(status, str(error), INVALID_REQUEST, "input", "invalid_value")
        if error.code == "RESOURCE_EXHAUSTED":
            return ApiError(429, str(error), "rate_limit_error", None, "voice_at_capacity")
        if error.code == "UNAVAILABLE":
            return ApiError(503, str(error), "service_unavailable", None, "no_ready_pod")
        return ApiError(
            502,
            f"the voice's pod failed the stream: {error}",
            "upstream_error",
            None,
            "upstream_error",
        )
    return ApiError(
        500,
        f"internal error: {type(error).__name__}: {error}",
        "server_error",
        None,
        "internal_error",
    )
