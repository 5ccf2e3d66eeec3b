from __future__ import annotations

import psutil
from piper import PiperVoice

from engines.text.corpus import load_corpus
from engines.text.frontend import normalize_text, phonemize, split_sentences, text_to_sentences
from engines.text.voice import Voice


def test_normalize_strips_invisible_and_control_characters() -> None:
    smuggled = "pay\u202e\u200bable\u0007 now\u00a0\tplease\ufeff"
    assert normalize_text(smuggled) == "payable now please"


def test_normalize_composes_to_nfc() -> None:
    assert normalize_text("cafe\u0301") == "caf\u00e9"


def test_split_sentences_and_long_sentence_cut() -> None:
    assert split_sentences("Hello there. How are you? Fine!") == [
        "Hello there.",
        "How are you?",
        "Fine!",
    ]
    long = ", ".join(["a clause of words"] * 40)
    pieces = split_sentences(long, max_chars=100)
    assert len(pieces) > 1 and all(len(p) <= 100 for p in pieces)
    assert " ".join(pieces).replace(" ", "") == long.replace(" ", "")


def test_long_sentences_become_phrases_at_clause_boundaries_only() -> None:
    sentence = (
        "We the People of the United States, in Order to form a more perfect Union, establish "
        "Justice, insure domestic Tranquility, provide for the common defence, promote the "
        "general Welfare, and secure the Blessings of Liberty to ourselves and our Posterity."
    )
    phrases = split_sentences(sentence, phrase_chars=120)
    assert len(phrases) == 3
    assert all(len(p) <= 120 and p.endswith((",", ".")) for p in phrases)
    assert " ".join(phrases) == sentence
    # A clause longer than a phrase stays whole; short sentences are left alone.
    clause = "a clause without a single pause in it that runs on and on well past the phrase limit"
    assert split_sentences(f"{clause}, then more.", phrase_chars=40) == [f"{clause},", "then more."]
    assert split_sentences("Short, and sweet.", phrase_chars=120) == ["Short, and sweet."]


def test_ids_match_piper_for_the_reference_sentence(joe: Voice) -> None:
    text = "The quick brown fox jumps over the lazy dog, while the service answers at once."
    piper = PiperVoice.load(joe.model_path)
    expected = [piper.phonemes_to_ids(p) for p in piper.phonemize(text)]
    assert [s.ids for s in text_to_sentences(text, joe.config)] == expected


def test_nothing_to_speak(joe: Voice) -> None:
    assert text_to_sentences("\u200b\u202e \t", joe.config) == []


def test_phonemes_match_piper_for_every_corpus_text(joe: Voice) -> None:
    from piper.phonemize_espeak import EspeakPhonemizer

    piper = EspeakPhonemizer()
    for text in [*load_corpus(), "Hello (world), one: two; three! No end"]:
        groups = piper.phonemize(joe.config.espeak_voice, text)
        expected = [p for i, group in enumerate(groups) for p in ([" "] if i else []) + group]
        assert phonemize(text, joe.config) == expected, text


def test_phonemising_many_requests_keeps_memory_flat(joe: Voice) -> None:
    # espeak-ng keeps about 1.3 KB per voice change that it never frees: with the voice set on
    # every request (as piper's own phonemizer does), these 5,000 requests grew the process by
    # 12.7 MB; with it set once, by 2.9 MB (the rest leaks in piper's espeak bridge, upstream).
    texts = load_corpus()
    text_to_sentences(texts[0], joe.config)
    before = psutil.Process().memory_info().rss
    for i in range(5000):
        text_to_sentences(texts[i % len(texts)], joe.config)
    grown_mb = (psutil.Process().memory_info().rss - before) / 2**20
    assert grown_mb < 6.0, f"{grown_mb:.1f} MB for 5,000 requests"
