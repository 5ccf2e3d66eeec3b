"""Optional bearer keys: `Authorization: Bearer <key>` on every /v1 call, when keys are set.

Keys come from a file (one per line; `#` starts a comment), in the cluster a Secret mounted
into the gateway's pods, and from `VOXFLEET_API_KEYS` (comma-separated). The file is read
again when it changes, so a rotated Secret takes effect without a restart. No keys: open.
"""

from __future__ import annotations

import hmac
import os
import time
from pathlib import Path

from engines.gateway.errors import ApiError

KEYS_ENV = "VOXFLEET_API_KEYS"
RECHECK_S = 2.0


class ApiKeys:
    def __init__(self, path: Path | None = None, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._fixed = frozenset(k.strip() for k in env.get(KEYS_ENV, "").split(",") if k.strip())
        self._path = path
        self._from_file: frozenset[str] = frozenset()
        self._mtime: float | None = None
        self._checked = 0.0
        if path is not None:
            self._read(force=True)

    def _read(self, force: bool = False) -> None:
        assert self._path is not None
        now = time.monotonic()
        if not force and now - self._checked < RECHECK_S:
            return
        self._checked = now
        try:
            mtime = self._path.stat().st_mtime
            if mtime == self._mtime and not force:
                return
            lines = self._path.read_text("utf-8").splitlines()
        except OSError as error:
            if force:
                raise ValueError(f"cannot read the API keys file {self._path}: {error}") from None
            return
        self._mtime = mtime
        self._from_file = frozenset(
            line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()
        )

    @property
    def enabled(self) -> bool:
        if self._path is not None:
            self._read()
        return bool(self._fixed or self._from_file)

    def check(self, authorization: str | None) -> None:
        """Raise ApiError 401 unless the header carries a valid key (or no keys are set)."""
        if not self.enabled:
            return
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(
                401,
                "this server needs an API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )
        given = key.strip().encode()
        if not any(hmac.compare_digest(given, k.encode()) for k in self._fixed | self._from_file):
            raise ApiError(401, "the API key is not valid here", code="invalid_api_key")
