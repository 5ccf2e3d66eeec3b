"""Text frontend: normalisation, sentence splitting, espeak-ng phonemes, phoneme ids."""

from __future__ import annotations

import re
import threading
import unicodedata
from dataclasses import dataclass

from engines.text.voice import VoiceConfig

# Bidi embeddings/overrides/isolates and zero-width characters: invisible, and a classic way
# to smuggle text past a reviewer; espeak would read some of them aloud as symbols.
_INVISIBLE = {
    *range(0x202A, 0x202F),  # LRE RLE PDF LRO RLO
    *range(0x2066, 0x206A),  # LRI RLI FSI PDI
    0x200B,
    0x200C,
    0x200D,
    0x200E,
    0x200F,  # zero-width space/joiners, LRM/RLM
    0x2060,
    0xFEFF,
    0x061C,  # word joiner, BOM, Arabic letter mark
}
_SPACE_CONTROLS = {"\t", "\n", "\r", "\v", "\f"}
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+")
# A sentence longer than this is cut at clause (then word) boundaries: the acoustic stage
# runs once per sentence before first audio, so its length bounds time to first audio.
MAX_SENTENCE_CHARS = 300
# Sentences longer than this are also cut into phrases at clause boundaries (never inside a
# clause): each phrase is one encoder call, so a long sentence neither delays its own first
# audio nor stalls the streams already playing for the length of one long call.
PHRASE_CHARS = 120
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+")

BOS, EOS, PAD = "^", "$", "_"


def normalize_text(text: str) -> str:
    """NFC; drop control, bidi and zero-width characters; collapse whitespace."""
    text = unicodedata.normalize("NFC", text)
    kept = []
    for char in text:
        if char in _SPACE_CONTROLS:
            kept.append(" ")
        elif ord(char) in _INVISIBLE or unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co"):
            continue
        else:
            kept.append(char)
    return re.sub(r"\s+", " ", "".join(kept)).strip()


def _cut_long(sentence: str, limit: int) -> list[str]:
    if len(sentence) <= limit:
        return [sentence]
    pieces: list[str] = []
    current = ""
    for clause in re.split(r"(?<=[,;:])\s+|\s+", sentence):
        candidate = f"{current} {clause}".strip()
        if len(candidate) > limit and current:
            pieces.append(current)
            current = clause
        else:
            current = candidate
        while len(current) > limit:  # one unbroken "word" longer than the limit
            pieces.append(current[:limit])
            current = current[limit:]
    if current:
        pieces.append(current)
    return pieces


def split_phrases(sentence: str, phrase_chars: int = PHRASE_CHARS) -> list[str]:
    """Clauses of a sentence joined into phrases of at most `phrase_chars` where they fit; a
    longer clause stays whole."""
    if len(sentence) <= phrase_chars:
        return [sentence]
    phrases: list[str] = []
    for clause in _CLAUSE_END.split(sentence):
        if phrases and len(phrases[-1]) + 1 + len(clause) <= phrase_chars:
            phrases[-1] = f"{phrases[-1]} {clause}"
        else:
            phrases.append(clause)
    return phrases


def split_sentences(
    text: str, max_chars: int = MAX_SENTENCE_CHARS, phrase_chars: int | None = None
) -> list[str]:
    """Sentences, cut at `max_chars`; with `phrase_chars`, long ones also into phrases."""
    sentences = [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]
    if phrase_chars is not None:
        sentences = [phrase for s in sentences for phrase in split_phrases(s, phrase_chars)]
    return [piece for sentence in sentences for piece in _cut_long(sentence, max_chars)]


# A language switch espeak-ng marks around a word of another language: "(fr)".
_LANGUAGE_SWITCH = re.compile(r"\([^)]+\)")


class _Espeak:
    """espeak-ng through piper's bridge (process-global and not thread-safe: callers hold
    `_ESPEAK_LOCK`).

    The voice is set only when it changes. piper's own `EspeakPhonemizer.phonemize` sets it
    on every call, and each `set_voice` keeps memory that espeak-ng never frees: about 1.3 KB
    a call (20,000 calls, +26 MB), which grew a server's resident set with every request
    (docs/reliability.md, soak).
    """

    def __init__(self) -> None:
        from piper import espeakbridge
        from piper.phonemize_espeak import ESPEAK_DATA_DIR

        espeakbridge.initialize(str(ESPEAK_DATA_DIR))
        self._bridge = espeakbridge
        self._voice: str | None = None

    def phonemize(self, voice: str, text: str) -> list[list[str]]:
        """Phonemes (Unicode code points, NFD) of each sentence espeak-ng finds in `text`,
        with each clause's punctuation kept and a space after a clause that goes on."""
        if voice != self._voice:
            self._bridge.set_voice(voice)
            self._voice = voice
        groups: list[list[str]] = []
        current: list[str] = []
        for phonemes, terminator, sentence_ends in self._bridge.get_phonemes(text):
            clause = _LANGUAGE_SWITCH.sub("", phonemes) + terminator
            if terminator in (",", ":", ";"):
                clause += " "
            current.extend(unicodedata.normalize("NFD", clause))
            if sentence_ends:
                groups.append(current)
                current = []
        if current:
            groups.append(current)
        return groups


_ESPEAK_LOCK = threading.Lock()
_espeak: _Espeak | None = None


def _phonemizer() -> _Espeak:
    global _espeak
    if _espeak is None:
        _espeak = _Espeak()
    return _espeak


def phonemize(sentence: str, config: VoiceConfig) -> list[str]:
    if config.phoneme_type == "text":
        return list(unicodedata.normalize("NFD", sentence))
    if config.phoneme_type != "espeak":
        raise ValueError(f"phoneme type {config.phoneme_type!r} is not supported")
    with _ESPEAK_LOCK:
        groups = _phonemizer().phonemize(config.espeak_voice, sentence)
    phonemes: list[str] = []
    for group in groups:
        if phonemes and group:
            phonemes.append(" ")
        phonemes.extend(group)
    return phonemes


def phoneme_ids(phonemes: list[str], config: VoiceConfig) -> list[int]:
    """Piper's id layout: BOS, each known phoneme followed by PAD, EOS."""
    id_map = config.phoneme_id_map
    ids = list(id_map[BOS]) + list(id_map.get(PAD, []))
    for phoneme in phonemes:
        if phoneme not in id_map:
            continue  # espeak can emit symbols a voice was never trained on; skip them
        ids.extend(id_map[phoneme])
        ids.extend(id_map.get(PAD, []))
    ids.extend(id_map[EOS])
    return ids


@dataclass(frozen=True)
class Sentence:
    text: str
    ids: list[int]


def text_to_sentences(
    text: str, config: VoiceConfig, phrase_chars: int | None = PHRASE_CHARS
) -> list[Sentence]:
    """The whole frontend: raw user text to one id sequence per sentence, or per phrase of a
    long sentence (empty ones dropped); `phrase_chars=None` keeps sentences whole."""
    sentences = []
    for sentence in split_sentences(normalize_text(text), phrase_chars=phrase_chars):
        ids = phoneme_ids(phonemize(sentence, config), config)
        if len(ids) > 3:  # BOS PAD EOS alone carries no sound
            sentences.append(Sentence(sentence, ids))
    return sentences
