"""The corpus of sentences shipped with the project (`corpus.txt`, provenance inside it)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path

MIN_WORDS = 3
MAX_WORDS = 60


class CorpusError(ValueError):
    """A corpus file that the benchmark cannot use."""


def parse_corpus(text: str, source: str = "corpus") -> list[str]:
    """Sentences from corpus text: one a line; blank lines and `#` comments are skipped."""
    sentences: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = len(line.split())
        if not MIN_WORDS <= words <= MAX_WORDS:
            raise CorpusError(
                f"{source}:{number}: a sentence has {words} words; the benchmark takes "
                f"{MIN_WORDS} to {MAX_WORDS} so that first-audio numbers stay comparable"
            )
        sentences.append(line)
    if not sentences:
        raise CorpusError(f"{source}: no sentences (one a line, '#' starts a comment)")
    return sentences


def load_corpus(path: Path | None = None) -> list[str]:
    """The shipped corpus, or the one at `path`."""
    if path is None:
        text = resources.files("engines.text").joinpath("corpus.txt").read_text("utf-8")
        return parse_corpus(text, "engines/text/corpus.txt")
    try:
        text = path.read_text("utf-8")
    except OSError as error:
        raise CorpusError(f"cannot read corpus {path}: {error.strerror}") from error
    return parse_corpus(text, str(path))


def sentence_order(sentences: Sequence[str], seed: int = 0) -> list[str]:
    """A fixed shuffle, so that every system and run sees the same mix of lengths in turn."""
    order = list(sentences)
    random.Random(seed).shuffle(order)
    return order


def cycle_sentences(sentences: Sequence[str]) -> Iterator[str]:
    """Sentences in order, forever (the load generator shares one such iterator)."""
    while True:
        yield from sentences
