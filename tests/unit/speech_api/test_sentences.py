"""Sentence ends in raw LLM tokens: each sentence comes out as soon as it is certain."""

from __future__ import annotations

import pytest

from engines.gateway.sentences import SentenceFinder, pack


def feed(tokens: list[str]) -> tuple[list[list[str]], str]:
    finder = SentenceFinder()
    return [finder.push(token) for token in tokens], finder.flush()


def test_a_sentence_comes_out_with_the_token_that_starts_the_next() -> None:
    out, rest = feed(["Hello", " there", ".", " How", " are", " you", "?", " Fine"])
    assert out == [[], [], [], ["Hello there."], [], [], [], ["How are you?"]]
    assert rest == "Fine"


def test_abbreviations_initials_and_decimals_do_not_end_a_sentence() -> None:
    tokens = ["Dr", ".", " Smith", " paid", " 3", ".", "50", " e.g", ".", " today", ". "]
    tokens += ["J", ".", " R", ".", " R", ".", " Tolkien", " wrote", " it", ".", " Yes"]
    out, rest = feed(tokens)
    assert [s for step in out for s in step] == [
        "Dr. Smith paid 3.50 e.g. today.",
        "J. R. R. Tolkien wrote it.",
    ]
    assert rest == "Yes"


def test_closing_quotes_stay_with_their_sentence() -> None:
    out, _ = feed(['He said "stop', '."', " Then", " left", "!)", " Ok"])
    assert [s for step in out for s in step] == ['He said "stop."', "Then left!)"]


def test_line_breaks_and_wide_punctuation_end_sentences() -> None:
    out, rest = feed(["- first item", "\n", "- second", "\n", "你好。", "再见"])
    assert [s for step in out for s in step] == ["- first item", "- second", "你好。"]
    assert rest == "再见"


def test_punctuation_alone_is_kept_for_the_next_sentence() -> None:
    finder = SentenceFinder()
    assert finder.push("... ") == []
    assert finder.push("Well. Then") == ["... Well."]


def test_a_long_run_without_an_end_is_cut_at_a_clause() -> None:
    finder = SentenceFinder(max_chars=60)
    text = "and then we walked, slowly and without a word, along the river to the old mill "
    out = finder.push(text)
    assert out and all(len(s) <= 60 for s in out)
    assert out[0].endswith(",")


def test_flush_and_clear() -> None:
    finder = SentenceFinder()
    finder.push("An unfinished thought")
    assert finder.flush() == "An unfinished thought"
    assert finder.flush() == ""
    finder.push("To be dropped")
    finder.clear()
    assert finder.flush() == ""
    finder.push("** ")
    assert finder.flush() == ""  # nothing to say


def test_pack_keeps_pieces_under_the_byte_limit_and_loses_nothing() -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(200)) + " " + "é" * 700
    pieces = pack(text, 1000)
    assert all(len(p.encode("utf-8")) <= 1000 for p in pieces)
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
    assert pack("short", 1000) == ["short"]


def test_max_chars_has_a_floor() -> None:
    with pytest.raises(ValueError):
        SentenceFinder(max_chars=5)
