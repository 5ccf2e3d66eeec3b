"""Sentence ends in raw LLM tokens, so that a client streams tokens and needs no tokenizer.

`SentenceFinder.push(token)` returns the sentences that token completed. A sentence ends at
`.`, `!`, `?` or `…` (with any closing quotes or brackets after it) once the next character
is whitespace, which usually comes as the first character of the next token: a period alone
cannot tell "Dr." or "3." from a sentence's end. It also ends at a line break (lists,
paragraphs), and at 。！？ at once. Not at a period after a known abbreviation (Mr., Dr.,
e.g., ...) or a single letter (initials). A run longer than `max_chars` without an end is cut
at its last clause mark (, ; :) or space, so text without punctuation still gets spoken.
`flush()` returns what is left (end of a turn); `clear()` drops it (barge-in).

Pure code: no I/O, no clock.
"""

from __future__ import annotations

import re

DEFAULT_MAX_CHARS = 300
# Words after which a period rarely ends a sentence (compared lower-cased, without the dot).
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs mt ft no fig al approx dept est inc ltd co corp jan feb "
    "mar apr jun jul aug sep sept oct nov dec e.g i.e cf ca".split()
)
_ENDERS = ".!?…"
_CLOSERS = "\"'”’)]}»"
_WIDE_ENDERS = "。！？"
_CLAUSE = re.compile(r"[,;:—–]\s")


def _is_boundary_period(text: str, at: int) -> bool:
    """Whether the period at `at` may end a sentence (not an abbreviation or initial)."""
    start = at
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in "(\"'“‘[":
        start -= 1
    word = text[start:at]
    if not word:
        return True
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "J. R. R. Tolkien"
    return word.lower().rstrip(".") not in ABBREVIATIONS


def _has_words(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


class SentenceFinder:
    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        if max_chars < 20:
            raise ValueError(f"max_chars must be at least 20, got {max_chars}")
        self.max_chars = max_chars
        self._buffer = ""
        self._scanned = 0  # characters of the buffer already looked at
        self._carry = ""  # punctuation alone, said with the next sentence

    @property
    def pending(self) -> str:
        return (self._carry + " " + self._buffer).strip() if self._carry else self._buffer

    def push(self, text: str) -> list[str]:
        """Add `text` (a token, or any piece); return the sentences it completed."""
        self._buffer += text
        sentences: list[str] = []
        while True:
            end = self._next_end()
            if end is None:
                break
            piece, self._buffer = self._buffer[:end], self._buffer[end:]
            self._scanned = 0
            self._emit(piece, sentences)
        if len(self._buffer) > self.max_chars:
            cut = self._cut_point()
            piece, self._buffer = self._buffer[:cut], self._buffer[cut:]
            self._scanned = 0
            self._emit(piece, sentences)
        return sentences

    def flush(self) -> str:
        """Whatever is left, as the turn's last sentence ('' when nothing worth saying)."""
        rest = self.pending.strip()
        self.clear()
        return rest if _has_words(rest) else ""

    def clear(self) -> None:
        self._buffer, self._scanned, self._carry = "", 0, ""

    def _emit(self, piece: str, into: list[str]) -> None:
        piece = piece.strip()
        if not piece:
            return
        if self._carry:
            piece, self._carry = f"{self._carry} {piece}", ""
        if _has_words(piece):
            into.append(piece)
        else:
            # Punctuation or markup alone ("...", "**") is no sentence: keep it for the next.
            self._carry = piece

    def _next_end(self) -> int | None:
        """The index just past the first sentence end in the buffer, if one is certain."""
        text = self._buffer
        i = max(0, self._scanned - 1)
        n = len(text)
        while i < n:
            ch = text[i]
            if ch == "\n" and _has_words(text[:i]):
                return i + 1
            if ch in _WIDE_ENDERS:
                j = i + 1
                while j < n and (text[j] in _WIDE_ENDERS or text[j] in _CLOSERS + "」』"):
                    j += 1
                if j < n:
                    return j
                break  # at the very end, closers may still come: wait for the next token
            if ch in _ENDERS:
                j = i + 1
                while j < n and (text[j] in _ENDERS or text[j] in _CLOSERS):
                    j += 1
                if j >= n:
                    break  # what follows decides: wait for the next token
                if text[j].isspace() and (ch != "." or _is_boundary_period(text, i)):
                    return j
                i = j
                continue
            i += 1
        self._scanned = i
        return None

    def _cut_point(self) -> int:
        head = self._buffer[: self.max_chars]
        clauses = list(_CLAUSE.finditer(head))
        if clauses:
            return clauses[-1].end()
        space = head.rfind(" ")
        return space + 1 if space > 0 else self.max_chars


def pack(text: str, max_bytes: int) -> list[str]:
    """`text` in pieces of at most `max_bytes` UTF-8 bytes, cut between sentences where it
    can be (a server takes at most so much text per stream)."""
    if len(text.encode("utf-8")) <= max_bytes:
        return [text]
    finder = SentenceFinder(max_chars=max(20, max_bytes // 4))
    sentences = [*finder.push(text), finder.flush()]
    pieces: list[str] = []
    current = ""
    for sentence in filter(None, sentences):
        for part in _split_bytes(sentence, max_bytes):
            joined = f"{current} {part}" if current else part
            if len(joined.encode("utf-8")) <= max_bytes:
                current = joined
            else:
                pieces.append(current)
                current = part
    if current:
        pieces.append(current)
    return pieces


def _split_bytes(sentence: str, max_bytes: int) -> list[str]:
    """A sentence over `max_bytes`, cut at spaces (or anywhere, for one huge word)."""
    parts: list[str] = []
    current = ""
    for word in sentence.split(" "):
        joined = f"{current} {word}" if current else word
        if len(joined.encode("utf-8")) <= max_bytes:
            current = joined
            continue
        if current:
            parts.append(current)
        while len(word.encode("utf-8")) > max_bytes:
            cut = max_bytes
            while len(word[:cut].encode("utf-8")) > max_bytes:
                cut -= 1
            parts.append(word[:cut])
            word = word[cut:]
        current = word
    if current:
        parts.append(current)
    return parts
