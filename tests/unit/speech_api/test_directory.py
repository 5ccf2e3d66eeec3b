"""The cluster's directory: the voice table from its file (read again when it changes), each
voice's pods from its address by DNS; a name that does not resolve is a voice with no pod."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from engines.gateway.directory import DnsDirectory, resolve_address
from engines.gateway.voices import VoiceTableError


def write_table(path: Path, voices: dict[str, str], aliases: dict[str, str] | None = None) -> None:
    table = {"voices": {v: {"address": a} for v, a in voices.items()}, "aliases": aliases or {}}
    path.write_text(json.dumps(table))


def test_addresses_resolve_to_every_ip_and_unknown_names_to_none() -> None:
    assert asyncio.run(resolve_address("localhost:8001")) in (
        ["127.0.0.1:8001"],
        ["127.0.0.1:8001", "[::1]:8001"],
        ["[::1]:8001"],
    )
    assert asyncio.run(resolve_address("no-such-voice-tts-pods.invalid:8001")) == []
    with pytest.raises(ValueError, match="HOST:PORT"):
        asyncio.run(resolve_address("localhost"))


def test_voices_endpoints_and_a_changed_table(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    write_table(path, {"joe": "localhost:8001", "amy": "amy-tts-pods.invalid:8001"})
    directory = DnsDirectory(path, ttl_s=0.0, aliases=(("echo", "amy"),))

    async def check() -> None:
        assert await directory.voices() == ["amy", "joe"]
        assert "127.0.0.1:8001" in await directory.endpoints("joe")
        assert await directory.endpoints("amy") == []  # no ready pod: a 503, not a 404
        assert await directory.endpoints("bob") == []
        assert directory.table.resolve("echo", ["amy", "joe"]) == "amy"
        # The ConfigMap changes: the new table is read, the command-line alias kept.
        write_table(path, {"joe": "localhost:8001"}, {"nova": "joe"})
        stamp = time.time() + 5
        os.utime(path, (stamp, stamp))
        assert await directory.voices() == ["joe"]
        assert directory.table.aliases == {"nova": "joe", "echo": "amy"}
        # A half-written update keeps the table in use.
        path.write_text("{")
        os.utime(path, (stamp + 5, stamp + 5))
        assert await directory.voices() == ["joe"]
        await directory.close()

    asyncio.run(check())


def test_a_wrong_table_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    path.write_text("[]")
    with pytest.raises(VoiceTableError):
        DnsDirectory(path)
