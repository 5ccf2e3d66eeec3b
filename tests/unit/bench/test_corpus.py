"""The shipped corpus and its parser."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from engines.text.corpus import CorpusError, load_corpus, parse_corpus, sentence_order


def test_shipped_corpus_has_100_sentences_of_3_to_60_words_with_sources() -> None:
    sentences = load_corpus()
    assert len(sentences) >= 100
    lengths = [len(s.split()) for s in sentences]
    assert min(lengths) >= 3 and max(lengths) <= 60
    # Varied: short prompts, mid-length and long sentences all present.
    assert min(lengths) <= 5 and max(lengths) >= 50
    assert len(set(sentences)) == len(sentences)
    text = resources.files("engines.text").joinpath("corpus.txt").read_text("utf-8")
    assert text.count("# source:") >= 10


def test_parser_skips_comments_and_names_the_offending_line() -> None:
    assert parse_corpus("# a comment\n\nThree words here.\n") == ["Three words here."]
    with pytest.raises(CorpusError, match=r"x\.txt:2: a sentence has 2 words"):
        parse_corpus("Fine sentence here.\nToo short.\n", "x.txt")
    with pytest.raises(CorpusError, match="no sentences"):
        parse_corpus("# only comments\n")


def test_missing_corpus_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="cannot read corpus"):
        load_corpus(tmp_path / "absent.txt")


def test_order_is_a_fixed_shuffle() -> None:
    sentences = load_corpus()
    assert sentence_order(sentences) == sentence_order(sentences)
    assert sentence_order(sentences) != sentences
    assert sorted(sentence_order(sentences)) == sorted(sentences)
