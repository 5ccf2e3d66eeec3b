"""A refusal's gRPC status, as the stream models, the voice host and the clients carry it."""

from __future__ import annotations

# gRPC status names a refusal carries (engines.client.tts reads them back from the message).
INVALID_ARGUMENT = "INVALID_ARGUMENT"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
UNAVAILABLE = "UNAVAILABLE"
INTERNAL = "INTERNAL"


class RequestError(Exception):
    """A request we refuse; `status` is the gRPC status name the client should see."""

    def __init__(self, message: str, status: str = INVALID_ARGUMENT) -> None:
        super().__init__(message)
        self.status = status
