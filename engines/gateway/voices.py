"""The voice table: which TTSVoice a requested voice name means.

A request names a voice by the TTSVoice's own name, or by one of OpenAI's built-in names
(alloy, ash, ...), which clients such as Pipecat send and nothing else. Those map to voices
through a configurable table: `aliases` (name → voice) first, then `default_voice` for every
built-in name the table leaves out. A voice's own name always wins over an alias.

Pure code: the table is data (a JSON file, `--voice-alias` flags, or what the operator
renders), and `resolve` is given the voices known at the time.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.gateway.errors import unknown_voice

OPENAI_VOICES = (
    "alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer",
    "verse", "marin", "cedar",
)  # fmt: skip


class VoiceTableError(ValueError):
    """The table's file or flags are wrong; the message says where."""


@dataclass(frozen=True)
class VoiceEntry:
    """A voice the table knows: its endpoint address (a host:port to resolve, in the
    cluster the voice's headless Service), the Piper length scale of the voice itself, which
    `speed` divides (1.0 for nearly every Piper voice), and the longest text its pods take
    in one request (TTSVoice `limits.maxTextBytes`; None: the gateway's default)."""

    name: str
    address: str | None = None
    length_scale: float = 1.0
    max_text_bytes: int | None = None


@dataclass(frozen=True)
class VoiceTable:
    aliases: Mapping[str, str] = field(default_factory=dict)
    default_voice: str | None = None
    voices: Mapping[str, VoiceEntry] = field(default_factory=dict)

    def resolve(self, requested: str, known: Collection[str]) -> str:
        """The voice `requested` means among `known`; raises ApiError 404 otherwise."""
        if requested in known:
            return requested
        lowered = requested.lower()
        target = self.aliases.get(lowered)
        if target is None and lowered in OPENAI_VOICES:
            target = self.default_voice or (min(known) if known else None)
        if target is not None and target in known:
            return target
        raise unknown_voice(requested, sorted(known))

    def aliases_of(self, voice: str, known: Collection[str]) -> list[str]:
        """The names that reach `voice`, the built-in ones the default covers included."""
        names = {alias for alias, target in self.aliases.items() if target == voice}
        default = self.default_voice or (min(known) if known else None)
        if default == voice:
            names |= {v for v in OPENAI_VOICES if v not in self.aliases and v not in known}
        return sorted(names - {voice})

    def length_scale(self, voice: str) -> float:
        entry = self.voices.get(voice)
        return entry.length_scale if entry is not None else 1.0

    def max_text_bytes(self, voice: str, default: int) -> int:
        entry = self.voices.get(voice)
        return entry.max_text_bytes if entry is not None and entry.max_text_bytes else default


def with_flags(
    table: VoiceTable, aliases: tuple[tuple[str, str], ...], default_voice: str | None
) -> VoiceTable:
    """`table` with command-line aliases added (they win) and its default voice replaced."""
    if not aliases and not default_voice:
        return table
    return VoiceTable(
        aliases={**table.aliases, **{name.lower(): voice for name, voice in aliases}},
        default_voice=default_voice or table.default_voice,
        voices=table.voices,
    )


def parse_alias(value: str) -> tuple[str, str]:
    """`alloy=joe` from a command line."""
    name, sep, voice = value.partition("=")
    if not sep or not name.strip() or not voice.strip():
        raise VoiceTableError(f"a voice alias is NAME=VOICE (e.g. alloy=joe), got {value!r}")
    return name.strip().lower(), voice.strip()


def table_from_dict(data: Any, source: str = "voice table") -> VoiceTable:
    """A table from its JSON form:

    {"voices": {"joe": {"address": "joe-tts-pods.ns.svc:8001", "lengthScale": 1.0}},
     "aliases": {"alloy": "joe"}, "defaultVoice": "joe"}
    """
    if not isinstance(data, Mapping):
        raise VoiceTableError(f"{source}: expected a JSON object")
    aliases = data.get("aliases") or {}
    voices = data.get("voices") or {}
    default = data.get("defaultVoice")
    if not isinstance(aliases, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()
    ):
        raise VoiceTableError(f"{source}: 'aliases' must map names to voice names")
    if not isinstance(voices, Mapping):
        raise VoiceTableError(f"{source}: 'voices' must map voice names to entries")
    if default is not None and not isinstance(default, str):
        raise VoiceTableError(f"{source}: 'defaultVoice' must be a voice name")
    entries = {}
    for name, entry in voices.items():
        entry = entry or {}
        if not isinstance(entry, Mapping):
            raise VoiceTableError(f"{source}: voice {name!r} must be an object")
        address = entry.get("address")
        scale = entry.get("lengthScale", 1.0)
        if address is not None and not isinstance(address, str):
            raise VoiceTableError(f"{source}: voice {name!r}: 'address' must be HOST:PORT")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0:
            raise VoiceTableError(f"{source}: voice {name!r}: 'lengthScale' must be > 0")
        limit = entry.get("maxTextBytes")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise VoiceTableError(f"{source}: voice {name!r}: 'maxTextBytes' must be >= 1")
        entries[str(name)] = VoiceEntry(str(name), address, float(scale), limit)
    return VoiceTable(
        aliases={k.lower(): v for k, v in aliases.items()},
        default_voice=default,
        voices=entries,
    )


def load_table(path: Path) -> VoiceTable:
    try:
        data = json.loads(path.read_text("utf-8"))
    except OSError as error:
        raise VoiceTableError(f"cannot read the voice table {path}: {error}") from None
    except ValueError as error:
        raise VoiceTableError(f"the voice table {path} is not JSON: {error}") from None
    return table_from_dict(data, str(path))
