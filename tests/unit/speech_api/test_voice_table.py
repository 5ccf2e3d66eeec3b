"""The voice table: a TTSVoice's own name, an alias, or one of OpenAI's names through the
default voice; anything else is a 404 that lists the voices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.gateway.errors import ApiError
from engines.gateway.voices import (
    OPENAI_VOICES,
    VoiceTable,
    VoiceTableError,
    load_table,
    parse_alias,
    table_from_dict,
    with_flags,
)

KNOWN = ["amy", "joe"]


def test_own_names_aliases_and_the_default_voice() -> None:
    table = VoiceTable(aliases={"nova": "amy"}, default_voice="joe")
    assert table.resolve("amy", KNOWN) == "amy"
    assert table.resolve("nova", KNOWN) == "amy"
    assert table.resolve("Nova", KNOWN) == "amy"
    assert {table.resolve(name, KNOWN) for name in OPENAI_VOICES if name != "nova"} == {"joe"}
    assert table.aliases_of("amy", KNOWN) == ["nova"]
    assert "alloy" in table.aliases_of("joe", KNOWN) and "nova" not in table.aliases_of(
        "joe", KNOWN
    )


def test_without_a_default_the_first_voice_takes_openais_names() -> None:
    assert VoiceTable().resolve("alloy", KNOWN) == "amy"


def test_a_voice_named_like_an_openai_voice_is_itself() -> None:
    table = VoiceTable(default_voice="joe")
    assert table.resolve("echo", ["echo", "joe"]) == "echo"


def test_unknown_voices_are_404_and_list_what_exists() -> None:
    table = VoiceTable(aliases={"nova": "gone"})
    for name in ("bob", "nova"):
        with pytest.raises(ApiError) as error:
            table.resolve(name, KNOWN)
        assert error.value.status == 404
        assert error.value.code == "voice_not_found" and error.value.param == "voice"
        assert "amy, joe" in error.value.message


def test_the_table_file_as_the_operator_renders_it(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    path.write_text(
        json.dumps(
            {
                "voices": {"joe": {"address": "joe-tts-pods.ns.svc:8001", "lengthScale": 1.1}},
                "aliases": {"Alloy": "joe"},
                "defaultVoice": "joe",
            }
        )
    )
    table = load_table(path)
    assert table.voices["joe"].address == "joe-tts-pods.ns.svc:8001"
    assert table.length_scale("joe") == pytest.approx(1.1)
    assert table.length_scale("other") == 1.0
    assert table.aliases == {"alloy": "joe"}
    flagged = with_flags(table, (("echo", "amy"),), None)
    assert flagged.aliases == {"alloy": "joe", "echo": "amy"} and flagged.default_voice == "joe"


@pytest.mark.parametrize(
    "data, problem",
    [
        ([], "JSON object"),
        ({"aliases": {"alloy": 3}}, "aliases"),
        ({"voices": {"joe": {"lengthScale": 0}}}, "lengthScale"),
        ({"voices": {"joe": {"address": 8001}}}, "address"),
        ({"defaultVoice": 1}, "defaultVoice"),
    ],
)
def test_a_wrong_table_says_what_is_wrong(data: object, problem: str) -> None:
    with pytest.raises(VoiceTableError, match=problem):
        table_from_dict(data)


def test_a_table_file_that_is_not_json(tmp_path: Path) -> None:
    path = tmp_path / "voices.json"
    path.write_text("{")
    with pytest.raises(VoiceTableError, match="not JSON"):
        load_table(path)
    with pytest.raises(VoiceTableError, match="cannot read"):
        load_table(tmp_path / "missing.json")


def test_alias_flags() -> None:
    assert parse_alias("Alloy=joe") == ("alloy", "joe")
    with pytest.raises(VoiceTableError, match="NAME=VOICE"):
        parse_alias("alloy")
